"""`python -m launch.bench.eval --config configs/bert.py:wikitext`: one in-loop eval pass of
a BERT config at several `model.eval_head_chunks`, in one process.

Builds the config's eval set once per chunk count (the prepared data is cached), compiles
each eval step before the clock starts, and times full passes over the eval set, the
chunk counts alternating round by round. Every count must give the first one's metrics
(the same masked-LM hit count, the loss within float rounding) before any time is
reported, so that a faster head cannot be a wrong one.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Sequence

import jax
from absl import flags

from launch.bench.common import CONFIG, MESH, ROUNDS, print_rows, run
from launch.cli import usage_error
from launch.markdown import markdown_table
from mlperf.evaluate import Evaluator
from mlperf.validate import ConfigError, apply_mesh_override
from parallel.mesh import MeshShapeError

_CHUNKS = flags.DEFINE_list(
    "eval_chunks", ["1", "32"], "model.eval_head_chunks values (the first is the baseline)."
)

CHUNKS_KEY = "eval_head_chunks"


def parse_chunks(values: Sequence[str]) -> list[int]:
    """['1', '32'] -> [1, 32]; ValueError naming a value that is not a positive integer."""
    out = []
    for v in values:
        if not v.strip().isdigit() or int(v) < 1:
            raise ValueError(f"chunk count {v!r}: give positive integers, e.g. 1,32")
        out.append(int(v))
    if not out:
        raise ValueError("give at least one chunk count, e.g. 1,32")
    return out


def _with_chunks(config, chunks: int):
    config = copy.deepcopy(config)
    config.model[CHUNKS_KEY] = chunks
    return config


def _check(config, chunk_counts: Sequence[int]) -> None:
    """Every count against the config (it divides the eval batch), before data or compiles."""
    from mlperf.validate import validate
    from parallel.mesh import select_devices

    devices = select_devices(jax.devices(), config.mesh.get("num_devices", 0))
    for c in chunk_counts:
        validate(_with_chunks(config, c), len(devices))


def _evaluator(config, chunks: int):
    """(evaluator, params) of `config` with the eval head in `chunks` groups."""
    from mlperf.trainer import build_trainer

    config = _with_chunks(config, chunks)
    trainer = build_trainer(config)
    size = config.train.eval_batch_size
    layout = trainer.partitioner.data_layout(size)
    batches = trainer.task.eval_data(size, layout.shard_index, layout.shard_count)
    evaluator = Evaluator(trainer.task, trainer.layout, trainer.partitioner, batches, size)
    return evaluator, trainer.init_state()["params"]


def _same_metrics(a: dict, b: dict) -> bool:
    return int(a["mlm_correct"]) == int(b["mlm_correct"]) and abs(
        float(a["mlm_loss_sum"]) - float(b["mlm_loss_sum"])
    ) <= 1e-4 * max(abs(float(a["mlm_loss_sum"])), 1.0)


def bench(config, chunk_counts: Sequence[int], rounds: int = 3) -> list[dict]:
    """One row per chunk count: median seconds per eval pass, examples/s, and the first
    count's time over this one's (the speedup against it)."""
    if CHUNKS_KEY not in config.model:
        raise ConfigError(
            f"{config.benchmark}:{config.variant} has no model.{CHUNKS_KEY}: the chunked eval "
            "head is BERT's; give a configs/bert.py variant."
        )
    _check(config, chunk_counts)
    runs = {c: _evaluator(config, c) for c in chunk_counts}
    sums = {c: jax.device_get(ev.run_pass(params)) for c, (ev, params) in runs.items()}
    first = chunk_counts[0]
    for c in chunk_counts[1:]:
        if not _same_metrics(sums[first], sums[c]):
            raise RuntimeError(
                f"eval head in {c} chunks disagrees with {first}: "
                f"{sums[c]['mlm_correct']} against {sums[first]['mlm_correct']} hits"
            )
    times: dict[int, list[float]] = {c: [] for c in chunk_counts}
    for _ in range(rounds):
        for c, (ev, params) in runs.items():
            start = time.perf_counter()
            jax.block_until_ready(ev.run_pass(params))
            times[c].append(time.perf_counter() - start)
    examples = runs[first][0].num_examples
    base = statistics.median(times[first])
    rows = []
    for c in chunk_counts:
        seconds = statistics.median(times[c])
        rows.append(
            {
                "config": f"{config.benchmark}:{config.variant}",
                "chunks": c,
                "eval_examples": examples,
                "seconds": seconds,
                "examples_per_s": examples / seconds,
                "speedup": base / seconds,
                "mlm_correct": int(sums[c]["mlm_correct"]),
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    """Markdown table of `bench` rows."""
    headers = ["config", "eval head chunks", "seconds per pass", "examples/s", "against the first"]
    return markdown_table(
        headers,
        [
            [
                r["config"],
                str(r["chunks"]),
                f"{r['seconds']:.2f}",
                f"{r['examples_per_s']:.0f}",
                f"{r['speedup']:.2f}x",
            ]
            for r in rows
        ],
    )


def main(argv: list[str]) -> None:
    config = CONFIG.value
    if config is None:
        usage_error("eval: give --config, e.g. configs/bert.py:wikitext")
    try:
        chunks = parse_chunks(_CHUNKS.value)
    except ValueError as e:
        usage_error(f"--eval_chunks: {e}")
    try:
        apply_mesh_override(config, MESH.value)
        rows = bench(config, chunks, max(ROUNDS.value, 1))
    except (ConfigError, MeshShapeError, FileNotFoundError) as e:  # bad input: one line
        usage_error(f"eval: {e}")
    print_rows(rows, table)


if __name__ == "__main__":
    run(main)
