"""Throughput of a config on this machine: train step, input pipeline, model FLOP/s.

    python -m launch.bench.step --config configs/bert.py:tiny [--steps 20] [--json] [--synthetic]
                                [--profile_dir DIR] [--trace_steps 3]

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
import time

import jax
from absl import flags

from launch.bench.common import CONFIG, JSON, MESH, REPEATS, STEPS, progress, run
from launch.cli import usage_error
from mlperf.peak_flops import peak_for_devices
from mlperf.validate import ConfigError, apply_mesh_override

_SYNTHETIC = flags.DEFINE_bool(
    "synthetic", False, "Time the step on a synthetic batch; prepare and read no data."
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
    progress(f"compiled the train step in {compile_s:.1f} s")
    # Each stage says when it is done, so that a run cut short shows which one it was in.
    start = time.perf_counter()
    state = trainer.init_state()
    key = partitioner.replicate(lambda: jax.random.key(0))
    batch = partitioner.host_to_global(host_batch, layout)
    jax.block_until_ready((state, batch))
    progress(f"initialised the state and placed the batch in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    state, metrics = compiled(state, batch, key)  # warm-up
    jax.block_until_ready(metrics)
    progress(f"warm-up step {time.perf_counter() - start:.2f} s")

    step_rates, input_rates = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            state, metrics = compiled(state, batch, key)
        jax.block_until_ready(metrics)
        step_rates.append(steps * phase.global_batch_size / (time.perf_counter() - start))
        progress(f"repeat {len(step_rates)}/{repeats}: {step_rates[-1]:.1f} examples/s")
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

        trace_dir = profiling.trace_steps(profile_dir, trace_steps, step, state, progress)
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


def main(argv: list[str]) -> None:
    config = CONFIG.value
    if config is None:
        usage_error("give --config, e.g. configs/bert.py:tiny")
    if _PROFILE_DIR.value and _TRACE_STEPS.value < 1:
        usage_error(f"--trace_steps={_TRACE_STEPS.value}: a trace needs 1 step or more")
    try:
        apply_mesh_override(config, MESH.value)
        r = bench_config(
            config,
            STEPS.value,
            REPEATS.value,
            [int(w) for w in _INPUT_WORKERS.value],
            _SYNTHETIC.value,
            _PROFILE_DIR.value,
            _TRACE_STEPS.value,
        )
    except (ConfigError, FileNotFoundError) as e:  # bad input: one line, as launch.train
        usage_error(str(e))
    if JSON.value:
        print(json.dumps(r, indent=2))
        return
    print(report(r))
    if not r.get("input_keeps_up", True):
        raise SystemExit(1)


def report(r: dict) -> str:
    """The text `launch.bench.step` prints for one `bench_config` row."""
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
    run(main)
