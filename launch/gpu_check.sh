#!/usr/bin/env bash
# The framework's programs on one NVIDIA GPU (docs/gpu.md): bf16 step time and MFU of
# BERT-large and Transformer-big on synthetic batches, then the tiny BERT and Transformer
# runs to their targets. Each part has its own time limit; a failed part does not stop the
# others. Results go to $OUT (default /tmp/multipod-gpu-check) as seven files at most, none
# in a subfolder, so that a short run on a GPU machine returns all of them:
# bench.jsonl (one JSON row per step measurement), results.jsonl (each tiny run's
# result.json), log (everything printed), mllogs.tgz (each tiny run's MLPerf log),
# xla_transformer.tgz (the 2-layer Transformer-big programs, as JAX hands them over and as
# XLA optimised them) and trace_transformer.xplane.pb and .trace.json.gz (a jax.profiler
# trace of that step; the second opens in Perfetto).
#
#     OUT=/tmp/gpu bash launch/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/multipod-gpu-check}
PYTHON=${PYTHON:-python3}
WORK=${WORK:-/tmp/multipod-gpu-work}
BENCH_LIMIT_S=${BENCH_LIMIT_S:-100}  # seconds per step measurement (compile included)
TRAIN_LIMIT_S=${TRAIN_LIMIT_S:-120}  # seconds per tiny run (data preparation included)
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log") 2>&1

echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
"$PYTHON" -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, \
'optax', optax.__version__, jax.devices())"

one_gpu=(--mesh data=1,model=1)
bench() {  # bench ARGS...: one row of launch.bench.step --synthetic --json
    echo "== bench $*"
    timeout "$BENCH_LIMIT_S" "$PYTHON" -m launch.bench.step --synthetic --json --steps 10 --repeats 3 \
        "${one_gpu[@]}" "$@" >"$WORK/bench.json" || { echo "bench failed (rc $?)"; return; }
    "$PYTHON" -c "import json,sys; r=json.load(open(sys.argv[1])); r['args']=sys.argv[2:]; \
print(json.dumps(r))" "$WORK/bench.json" "$@" | tee -a "$OUT/bench.jsonl"
}

train() {  # train NAME ARGS...: one tiny run to its target on one GPU
    local name=$1
    shift
    echo "== train $name: $*"
    rm -rf "${WORK:?}/$name"
    local start=$SECONDS
    timeout "$TRAIN_LIMIT_S" "$PYTHON" -m launch.train --workdir "$WORK/$name" "$@" \
        --config.mesh.ici_shape='(1,1)'
    echo "train $name: rc $? in $((SECONDS - start)) s wall"
    mkdir -p "$WORK/mllogs"
    cp "$WORK/$name/mllog.txt" "$WORK/mllogs/$name.mllog.txt" 2>/dev/null
    tar czf "$OUT/mllogs.tgz" -C "$WORK" mllogs
    [ -f "$WORK/$name/result.json" ] && "$PYTHON" -c "import json,sys; r=json.load(open(sys.argv[1])); \
r['name']=sys.argv[2]; print(json.dumps(r))" "$WORK/$name/result.json" "$name" >>"$OUT/results.jsonl"
}

# The most telling parts first, so a run cut short still returns them: BERT-large as
# Google's MLPerf v0.7 config (bf16), the tiny BERT run to its target (fp32, as CI runs
# it), a small Transformer-big (bf16), then variants. Batch sizes are per GPU.
bench --config configs/bert.py:mlperf_v07 --config.train.global_batch_size=32
train bert_tiny --config configs/bert.py:tiny
# Transformer-big's full step did not finish on an H200 (docs/gpu.md): a 2-layer, batch-8
# step first, the full one last. The 2-layer run's programs and, if its steps finish, a
# trace of three of them come back for reading offline.
rm -rf "${WORK:?}/xla_transformer" "${WORK:?}/trace_transformer"
XLA_FLAGS="${XLA_FLAGS:-} --xla_dump_to=$WORK/xla_transformer --xla_dump_hlo_as_text" \
    bench --config configs/transformer.py:mlperf_v07 --config.train.global_batch_size=8 \
    --config.model.num_layers=2 --profile_dir="$WORK/trace_transformer"
tar czf "$OUT/xla_transformer.tgz" -C "$WORK" xla_transformer 2>/dev/null
for kind in xplane.pb trace.json.gz; do
    trace=$(find "$WORK/trace_transformer" -name "*.$kind" 2>/dev/null | head -1)
    [ -n "$trace" ] && cp "$trace" "$OUT/trace_transformer.$kind"
done
train bert_tiny_bf16 --config configs/bert.py:tiny --config.precision.compute_dtype=bfloat16
bench --config configs/bert.py:mlperf_v07 --config.train.global_batch_size=32 \
    --config.einsum_gather=False
bench --config configs/bert.py:large --config.train.global_batch_size=32
train transformer_tiny --config configs/transformer.py:tiny
bench --config configs/transformer.py:mlperf_v07 --config.train.global_batch_size=64
echo "== done $(date -u +%FT%TZ)"
