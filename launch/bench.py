"""Throughput of a config on this machine: train step, input pipeline, model FLOP/s.

    python -m launch.bench --config configs/bert.py:tiny [--steps 20] [--json] [--synthetic]
                           [--profile_dir DIR] [--trace_steps 3]
    python -m launch.bench collectives [--sizes 4K,1M,64M] [--device_counts 2,4,8] [--plot p.png]
                                       [--no_tpu_estimates]
    python -m launch.bench peers [--peer_models bert] [--peer_sizes tiny,base] [--rounds 5]
    python -m launch.bench tpu [--models bert,transformer] [--generations v3,v4]
                               [--out docs/tpu-table.md] [--nocompile]
    python -m launch.bench startup [--startup_configs bert:tiny,transformer:multi30k]
                                   [--data_dir ../shared/data]
    python -m launch.bench xent [--xent_shapes 320x2048,640x30522] [--xent_smoothing 0.1]
                                [--xent_bias]
    python -m launch.bench eval --config configs/bert.py:wikitext [--eval_chunks 1,32]
    python -m launch.bench kernels [--kernel_rows 512,2048,8192] [--peer_threads 1]
        [--kernel_chains 4]
    python -m launch.bench variants --config configs/bert.py:wikitext
                                    --change model.remat=True [--change K=V,K=V]
                                    [--steps 20] [--rounds 5]

Prints steps/s, examples/s, model FLOP/s as a fraction of the devices' peak (MFU: the
published dense bf16 peak of a TPU or a known GPU, the measured matmul peak of a CPU
host), and the input pipeline's examples/s against what the step consumes (it must be
at least 3x so input never starves training). Rates are medians over repeats in one
run, measured after a warm-up step. `--synthetic` times the step alone on a batch of
the step's shapes, with no data prepared or read (a config whose data is not on this
machine, such as bert:large on a GPU).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import jax
from absl import app, flags
from ml_collections import config_flags

from launch.cli import keep_host_memory, parse_flags, relax_cpu_collective_timeouts, usage_error
from mlperf.peak_flops import peak_for_devices
from mlperf.validate import ConfigError, apply_mesh_override
from parallel.mesh import MeshShapeError

relax_cpu_collective_timeouts()  # before jax starts its backend

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. configs/bert.py:tiny.", lock_config=False
)
_MESH = flags.DEFINE_string("mesh", "", "Mesh override, e.g. data=8,model=1.")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed train steps per repeat.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Repeats; the median is reported.")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object.")
_SYNTHETIC = flags.DEFINE_bool(
    "synthetic", False, "Time the step on a synthetic batch; prepare and read no data."
)
_SIZES = flags.DEFINE_list(
    "sizes", ["4K", "64K", "1M", "16M", "64M"], "collectives: bytes per device (K/M/G)."
)
_DEVICE_COUNTS = flags.DEFINE_list("device_counts", ["2", "4", "8"], "collectives: P values.")
_PLOT = flags.DEFINE_string("plot", "", "collectives: write a bandwidth plot (PNG) here.")
_NO_TPU_ESTIMATES = flags.DEFINE_bool(
    "no_tpu_estimates", False, "collectives: skip the TPU AOT compiles (~15 min on 2 cores)."
)
_PROFILE_DIR = flags.DEFINE_string(
    "profile_dir",
    "",
    "Write a jax.profiler trace of --trace_steps more train steps, after the timed repeats, "
    "into PROFILE_DIR/profile.",
)
_TRACE_STEPS = flags.DEFINE_integer("trace_steps", 3, "Train steps in the --profile_dir trace.")
_INPUT_WORKERS = flags.DEFINE_list(
    "input_workers", ["0", "1", "2", "4"], "Grain worker counts whose host input rate to report."
)

_PEER_MODELS = flags.DEFINE_list("peer_models", ["bert", "transformer"], "peers: models.")
_PEER_SIZES = flags.DEFINE_list("peer_sizes", ["tiny", "base"], "peers: sizes (tiny, base).")
_ROUNDS = flags.DEFINE_integer(
    "rounds", 5, "peers: timed rounds (after the warm-up rounds: bench_peers.alternate)."
)
_PEER_STEPS = flags.DEFINE_integer("peer_steps", 3, "peers: train steps per side per round.")
_PEER_THREADS = flags.DEFINE_integer(
    "peer_threads", 0, "peers, kernels: CPU threads for both sides (0: each library's default)."
)
_KERNEL_ROWS = flags.DEFINE_list(
    "kernel_rows", ["512", "2048", "8192"], "kernels: rows of the [rows, 64] activations."
)
_KERNEL_CHAINS = flags.DEFINE_integer(
    "kernel_chains",
    0,
    "kernels: also time this many independent JAX chains in one program against one chain "
    "as long as all of them (0: skip; 2 or more).",
)
_PEER_LAST_ROWS = flags.DEFINE_bool(
    "peer_last_layer_rows",
    False,
    "peers: our BERT's last layer at the heads' rows only (model.last_layer_head_positions_only).",
)
_PEER_DTYPE = flags.DEFINE_enum(
    "peer_dtype",
    "float32",
    ["float32", "bfloat16"],
    "peers: compute dtype of both sides (bfloat16: ours in bf16, torch under CPU autocast).",
)
_PEER_EINSUM = flags.DEFINE_bool(
    "peer_einsum_gather", False, "peers: our one-hot einsum lookups (the TPU choice) on CPU."
)

_TPU_MODELS = flags.DEFINE_list(
    "models", ["bert", "transformer", "ssd", "maskrcnn"], "tpu: mlperf configs."
)
_TPU_GENERATIONS = flags.DEFINE_list(
    "generations", ["v3", "v4", "v5p", "v5e", "v6e"], "tpu: TPU generations."
)
_TPU_VARIANT = flags.DEFINE_string(
    "variant", "mlperf_v07", "tpu: config variant (others compile on 2x2 slices)."
)
_TPU_OUT = flags.DEFINE_string("out", "", "tpu: also write the markdown table here.")
_TPU_CACHE = flags.DEFINE_string(
    "cache_dir", "/tmp/multipod-tpu-table", "tpu: one JSON per compiled row."
)
_TPU_TIMEOUT = flags.DEFINE_float("timeout_s", 900.0, "tpu: seconds per row's compile.")
_TPU_COMPILE = flags.DEFINE_bool("compile", True, "tpu: compile rows not in the cache.")
_STARTUP_CONFIGS = flags.DEFINE_list(
    "startup_configs",
    ["bert:tiny", "transformer:tiny", "ssd:tiny", "maskrcnn:tiny"],
    "startup: benchmark:variant pairs, each started twice on one fresh compilation cache.",
)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", "", "startup: real data folder for variants that read files (../shared/data)."
)
_XENT_SHAPES = flags.DEFINE_list(
    "xent_shapes",
    ["320x2048", "640x30522", "4096x4000"],
    "xent: ROWSxVOCAB logits (bert:tiny's and bert:wikitext's masked positions, "
    "transformer:multi30k's tokens).",
)
_XENT_SMOOTHING = flags.DEFINE_float("xent_smoothing", 0.0, "xent: label smoothing.")
_XENT_BIAS = flags.DEFINE_bool(
    "xent_bias", False, "xent: add a [vocab] bias to the logits first (BERT's masked-LM head)."
)
_CHANGES = flags.DEFINE_multi_string(
    "change", [], "variants: KEY=VALUE[,KEY=VALUE] overrides of --config, one per variant."
)
_EVAL_CHUNKS = flags.DEFINE_list(
    "eval_chunks", ["1", "32"], "eval: model.eval_head_chunks values (the first is the baseline)."
)

MIN_INPUT_RATIO = 3.0


def host_input_rate(trainer, phase, layout, workers: int, batches: int) -> float:
    """One host's input examples/s with `workers` grain worker processes (0: in-process)."""
    trainer.config.data.input_workers = workers
    iterator = iter(
        trainer.task.train_data(
            phase, layout.host_batch_size, layout.shard_index, layout.shard_count
        )
    )
    for _ in range(2):  # worker start-up and first reads are not the steady state
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    rate = batches * layout.host_batch_size / (time.perf_counter() - start)
    del iterator
    return rate


def _progress(text: str) -> None:
    """One progress line on stderr (stdout stays the result, JSON with --json)."""
    print(f"bench: {text}", file=sys.stderr, flush=True)


def bench_config(
    config,
    steps: int,
    repeats: int,
    input_workers: list[int],
    synthetic: bool = False,
    profile_dir: str = "",
    trace_steps: int = 3,
) -> dict:
    """Measures the train step and (unless `synthetic`) the input pipeline of the first
    phase. MFU is against the mesh's devices' peak (`peak_for_devices`). With
    `profile_dir`, `trace_steps` more steps run under a jax.profiler trace written to
    profile_dir/profile (op-level device times; TensorBoard's profile plugin or Perfetto
    read it)."""
    from mlperf import profiling
    from mlperf.planning.cpu_check import synthetic_batch
    from mlperf.trainer import build_trainer

    trainer = build_trainer(config, prepare_data=not synthetic)
    phase = trainer.phases[0]
    partitioner = trainer.partitioner
    layout = partitioner.data_layout(phase.global_batch_size)
    if synthetic:
        iterator = None
        host_batch = synthetic_batch(trainer.task.example_spec(phase), layout.host_batch_size)
    else:
        iterator = iter(
            trainer.task.train_data(
                phase, layout.host_batch_size, layout.shard_index, layout.shard_count
            )
        )
        host_batch = next(iterator)
    start = time.perf_counter()
    compiled = trainer.lower_train_step(phase).compile()
    compile_s = time.perf_counter() - start
    _progress(f"compiled the train step in {compile_s:.1f} s")
    # Each stage says when it is done, so that a run cut short shows which one it was in.
    start = time.perf_counter()
    state = trainer.init_state()
    key = partitioner.replicate(lambda: jax.random.key(0))
    batch = partitioner.host_to_global(host_batch, layout)
    jax.block_until_ready((state, batch))
    _progress(f"initialised the state and placed the batch in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    state, metrics = compiled(state, batch, key)  # warm-up
    jax.block_until_ready(metrics)
    _progress(f"warm-up step {time.perf_counter() - start:.2f} s")

    step_rates, input_rates = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            state, metrics = compiled(state, batch, key)
        jax.block_until_ready(metrics)
        step_rates.append(steps * phase.global_batch_size / (time.perf_counter() - start))
        _progress(f"repeat {len(step_rates)}/{repeats}: {step_rates[-1]:.1f} examples/s")
        if iterator is None:
            continue
        start = time.perf_counter()
        for _ in range(steps):
            next(iterator)
        # Each host feeds its own slice; the global input rate scales with hosts.
        host_rate = steps * layout.host_batch_size / (time.perf_counter() - start)
        input_rates.append(host_rate * layout.shard_count)
    trace_dir = None
    if profile_dir:

        def step(state):
            return compiled(state, batch, key)

        trace_dir = profiling.trace_steps(profile_dir, trace_steps, step, state, _progress)
    examples_per_s = statistics.median(step_rates)
    peak = peak_for_devices(list(partitioner.mesh.devices.flat))
    model_flops = trainer.task.flops_per_example(phase) * examples_per_s
    row = {
        "config": f"{config.benchmark}:{config.variant}",
        "device": partitioner.mesh.devices.flat[0].device_kind,
        "compute_dtype": config.precision.compute_dtype,
        "mesh": dict(partitioner.mesh.shape),
        "global_batch_size": phase.global_batch_size,
        "compile_s": compile_s,
        "step_ms": 1000.0 * phase.global_batch_size / examples_per_s,
        "steps_per_s": examples_per_s / phase.global_batch_size,
        "examples_per_s": examples_per_s,
        "model_flops_per_s": model_flops,
        "peak_flops_per_s": peak.flops_per_s,
        "peak_source": peak.source,
        "mfu": model_flops / peak.flops_per_s,
        "synthetic": synthetic,
        "trace_dir": trace_dir,
    }
    if iterator is None:
        return row
    input_per_s = statistics.median(input_rates)
    row["host_input_examples_per_s_by_workers"] = {
        str(w): host_input_rate(trainer, phase, layout, w, batches=max(steps, 20))
        for w in input_workers
    }
    row["input_examples_per_s"] = input_per_s
    row["input_to_step_ratio"] = input_per_s / examples_per_s
    row["input_keeps_up"] = input_per_s >= MIN_INPUT_RATIO * examples_per_s
    return row


def collectives_main() -> None:
    """`python -m launch.bench collectives`: see launch/bench_collectives.py."""
    from launch import bench_collectives

    sizes = [bench_collectives.parse_size(s) for s in _SIZES.value]
    topologies = () if _NO_TPU_ESTIMATES.value else bench_collectives.AOT_TOPOLOGIES
    counts = [int(p) for p in _DEVICE_COUNTS.value]
    rows = bench_collectives.bench(sizes, counts, _REPEATS.value, aot_topologies=topologies)
    print(json.dumps(rows, indent=2) if _JSON.value else bench_collectives.table(rows))
    if _PLOT.value:
        bench_collectives.plot(rows, _PLOT.value)
        print(f"plot: {_PLOT.value}")


def peers_main() -> None:
    """`python -m launch.bench peers`: see launch/bench_peers.py."""
    from launch import bench_peers

    bench_peers.one_cpu_device()  # before jax starts its backend
    # One device, one thread a side: keeping freed host memory pays here (the peer
    # shares the process and so the setting).
    keep_host_memory(default=True)
    if _PEER_THREADS.value:
        bench_peers.limit_threads(_PEER_THREADS.value)  # before jax starts its backend
    rows = bench_peers.run_peers(
        _PEER_MODELS.value,
        _PEER_SIZES.value,
        _ROUNDS.value,
        _PEER_STEPS.value,
        _PEER_EINSUM.value,
        _PEER_LAST_ROWS.value,
        _PEER_DTYPE.value,
    )
    print(json.dumps(rows, indent=2) if _JSON.value else bench_peers.table(rows))


def kernels_main() -> None:
    """`python -m launch.bench kernels`: see launch/bench_kernels.py."""
    from launch import bench_kernels, bench_peers

    bench_peers.one_cpu_device()  # before jax starts its backend
    keep_host_memory(default=True)  # as peers: both libraries' buffers come and go each call
    if _PEER_THREADS.value:
        bench_peers.limit_threads(_PEER_THREADS.value)  # before jax starts its backend
    text = ",".join(_KERNEL_ROWS.value)
    try:
        rows = [int(r) for r in _KERNEL_ROWS.value]
    except ValueError:
        usage_error(f"kernels: --kernel_rows={text}: give whole numbers, e.g. 512,2048")
    try:
        bench_kernels.check_rows(rows)
    except ValueError as e:
        usage_error(f"kernels: --kernel_rows={text}: {e}")
    chains = _KERNEL_CHAINS.value
    if chains and chains < 2:
        usage_error(f"kernels: --kernel_chains={chains}: give 0 (skip) or 2 or more, e.g. 4")
    result = bench_kernels.measure(rows)
    together = bench_kernels.concurrency(rows, chains=chains) if chains else []
    threads = str(_PEER_THREADS.value) if _PEER_THREADS.value else "default"
    if _JSON.value:
        print(json.dumps({"kernels": result, "concurrency": together}, indent=2))
        return
    print(bench_kernels.table(result, threads))
    if together:
        print()
        print(bench_kernels.concurrency_table(together, threads))


def startup_main() -> None:
    """`python -m launch.bench startup`: see launch/bench_startup.py."""
    from launch import bench_startup

    bad = [c for c in _STARTUP_CONFIGS.value if not bench_startup.known_config(c)]
    if bad:
        usage_error(
            f"--startup_configs: unknown {', '.join(bad)}; give benchmark:variant pairs such "
            "as bert:tiny or transformer:multi30k."
        )
    rows = bench_startup.bench(_STARTUP_CONFIGS.value, _DATA_DIR.value)
    print(json.dumps(rows, indent=2) if _JSON.value else bench_startup.table(rows))


def xent_main() -> None:
    """`python -m launch.bench xent`: see launch/bench_cross_entropy.py."""
    from launch import bench_cross_entropy

    try:
        shapes = [bench_cross_entropy.parse_shape(t) for t in _XENT_SHAPES.value]
    except ValueError as e:
        usage_error(f"--xent_shapes: {e}")
    if not 0.0 <= _XENT_SMOOTHING.value < 1.0:
        usage_error(f"--xent_smoothing {_XENT_SMOOTHING.value}: give a value in [0, 1)")
    rows = bench_cross_entropy.bench(
        shapes, _XENT_SMOOTHING.value, max(_ROUNDS.value, 1), bias=_XENT_BIAS.value
    )
    print(json.dumps(rows, indent=2) if _JSON.value else bench_cross_entropy.table(rows))


def eval_main() -> None:
    """`python -m launch.bench eval`: see launch/bench_eval.py."""
    from launch import bench_eval

    config = _CONFIG.value
    if config is None:
        usage_error("eval: give --config, e.g. configs/bert.py:wikitext")
    try:
        chunks = bench_eval.parse_chunks(_EVAL_CHUNKS.value)
    except ValueError as e:
        usage_error(f"--eval_chunks: {e}")
    try:
        apply_mesh_override(config, _MESH.value)
        rows = bench_eval.bench(config, chunks, max(_ROUNDS.value, 1))
    except (ConfigError, MeshShapeError, FileNotFoundError) as e:  # bad input: one line
        usage_error(f"eval: {e}")
    print(json.dumps(rows, indent=2) if _JSON.value else bench_eval.table(rows))


def variants_main() -> None:
    """`python -m launch.bench variants`: see launch/bench_variants.py."""
    from launch import bench_variants

    config = _CONFIG.value
    if config is None:
        usage_error("variants: give --config, e.g. configs/bert.py:wikitext")
    if not _CHANGES.value:
        usage_error("variants: give at least one --change KEY=VALUE, e.g. model.remat=True")
    try:
        apply_mesh_override(config, _MESH.value)
        rows = bench_variants.bench(
            config, _CHANGES.value, max(_STEPS.value, 1), max(_ROUNDS.value, 1)
        )
    except (ValueError, ConfigError, MeshShapeError, FileNotFoundError) as e:
        usage_error(f"variants: {e}")
    print(json.dumps(rows, indent=2) if _JSON.value else bench_variants.table(rows))


def main(argv: list[str]) -> None:
    if argv[1:] not in (["peers"], ["kernels"]):
        keep_host_memory()  # when MULTIPOD_KEEP_HOST_MEMORY=1; before jax starts its backend
    if argv[1:] == ["collectives"]:
        return collectives_main()
    if argv[1:] == ["peers"]:
        return peers_main()
    if argv[1:] == ["tpu"]:
        from launch import bench_tpu

        return bench_tpu.main(
            _TPU_MODELS.value,
            _TPU_GENERATIONS.value,
            _TPU_VARIANT.value,
            _TPU_OUT.value,
            _TPU_CACHE.value,
            _TPU_TIMEOUT.value,
            _TPU_COMPILE.value,
        )
    if argv[1:] == ["startup"]:
        return startup_main()
    if argv[1:] == ["xent"]:
        return xent_main()
    if argv[1:] == ["eval"]:
        return eval_main()
    if argv[1:] == ["variants"]:
        return variants_main()
    if argv[1:] == ["kernels"]:
        return kernels_main()
    if len(argv) > 1:
        raise app.UsageError(
            f"unexpected arguments: {argv[1:]}; the subcommands are 'collectives', 'peers', "
            "'tpu', 'startup', 'xent', 'eval', 'variants' and 'kernels'"
        )
    config = _CONFIG.value
    if config is None:
        raise app.UsageError("give --config (e.g. configs/bert.py:tiny) or 'collectives'.")
    if _PROFILE_DIR.value and _TRACE_STEPS.value < 1:
        usage_error(f"--trace_steps={_TRACE_STEPS.value}: a trace needs 1 step or more")
    try:
        apply_mesh_override(config, _MESH.value)
        r = bench_config(
            config,
            _STEPS.value,
            _REPEATS.value,
            [int(w) for w in _INPUT_WORKERS.value],
            _SYNTHETIC.value,
            _PROFILE_DIR.value,
            _TRACE_STEPS.value,
        )
    except (ConfigError, FileNotFoundError) as e:  # bad input: one line, as launch.train
        usage_error(str(e))
    if _JSON.value:
        print(json.dumps(r, indent=2))
        return
    print(report(r))
    if not r.get("input_keeps_up", True):
        raise SystemExit(1)


def report(r: dict) -> str:
    """The text `launch.bench --config` prints for one `bench_config` row."""
    lines = [
        f"{r['config']} on {r['device']}, mesh {r['mesh']} (global batch "
        f"{r['global_batch_size']}, {r['compute_dtype']} compute):",
        f"  train step   {r['step_ms']:.1f} ms = {r['steps_per_s']:.2f} steps/s, "
        f"{r['examples_per_s']:.1f} examples/s (compiled in {r['compile_s']:.1f} s)",
        f"  model FLOP/s {r['model_flops_per_s']:.3e} = MFU {100 * r['mfu']:.1f}% of "
        f"{r['peak_flops_per_s']:.3e} ({r['peak_source']})",
    ]
    if r.get("trace_dir"):
        lines.append(f"  trace        {r['trace_dir']} (jax.profiler, after the timed repeats)")
    if r["synthetic"]:
        lines.append("  input        not measured (--synthetic: one batch of the step's shapes)")
        return "\n".join(lines)
    lines.append(
        f"  input        {r['input_examples_per_s']:.1f} examples/s = "
        f"{r['input_to_step_ratio']:.1f}x the step's consumption "
        f"({'OK' if r['input_keeps_up'] else 'TOO SLOW: input would starve the step'})"
    )
    for workers, rate in r["host_input_examples_per_s_by_workers"].items():
        lines.append(f"  one host's input with {workers} grain workers: {rate:.1f} examples/s")
    return "\n".join(lines)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
