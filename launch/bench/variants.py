"""`python -m launch.bench.variants --config C --change K=V[,K=V] ...`: the train step of a
config and of variants of it, timed in turns in one process.

Every variant (and the config as given, the baseline) is built and compiled, starts from
the same initial state and reads its first phase's real input stream as the train loop
does: the next host batch is read while the device runs the step, so input settings
(`data.read_threads`) count too. Rounds time `steps` steps of each in turn, so a machine
whose speed drifts affects all alike; the table gives the median steps/s and its ratio
to the baseline. The first losses are printed beside them:
a variant meant to change only the speed must show the baseline's.
"""

from __future__ import annotations

import ast
import copy
import statistics
import time
from collections.abc import Sequence
from typing import Any

import jax
from absl import flags

from launch.bench.common import CONFIG, MESH, ROUNDS, STEPS, print_rows, run
from launch.cli import usage_error
from launch.markdown import markdown_table
from mlperf.validate import ConfigError, apply_mesh_override
from parallel.mesh import MeshShapeError

_CHANGES = flags.DEFINE_multi_string(
    "change", [], "KEY=VALUE[,KEY=VALUE] overrides of --config, one per variant."
)


def parse_variant(text: str) -> dict[str, Any]:
    """'model.a=1,data.b=x' -> {'model.a': 1, 'data.b': 'x'} (Python literals, else text);
    ValueError naming an item without '='."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{item!r}: give KEY=VALUE, e.g. model.remat=True")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    if not out:
        raise ValueError(f"{text!r}: give KEY=VALUE[,KEY=VALUE]")
    return out


def apply_overrides(config, overrides: dict[str, Any]):
    """A copy of `config` with the dotted keys set; ConfigError naming a key it lacks."""
    from mlperf.validate import set_config_key

    config = copy.deepcopy(config)
    for key, value in overrides.items():
        set_config_key(config, key, value)
    return config


class _Run:
    """One variant's compiled step, state and live input, fed as the train loop feeds it."""

    def __init__(self, name: str, config, steps: int):
        from mlperf.trainer import build_trainer

        self.name = name
        self.steps = steps
        trainer = build_trainer(config)
        phase = trainer.phases[0]
        self.partitioner = trainer.partitioner
        self.layout = self.partitioner.data_layout(phase.global_batch_size)
        self.iterator = iter(
            trainer.task.train_data(
                phase, self.layout.host_batch_size, self.layout.shard_index, self.layout.shard_count
            )
        )
        self.step = trainer.lower_train_step(phase).compile()
        self.state = trainer.init_state()
        self.key = self.partitioner.replicate(lambda: jax.random.key(0))
        self.pending = next(self.iterator)
        # Warm-up: the first three steps, whose losses show whether a variant trains alike.
        self.first_losses = [float(self._step()["loss"]) for _ in range(min(3, steps))]
        self.rates: list[float] = []

    def _step(self):
        """One train step on the pending batch; the next host batch is read while the
        device works, as in mlperf.loop."""
        batch = self.partitioner.host_to_global(self.pending, self.layout)
        self.state, metrics = self.step(self.state, batch, self.key)
        self.pending = next(self.iterator)
        return metrics

    def time_round(self) -> None:
        start = time.perf_counter()
        for _ in range(self.steps):
            metrics = self._step()
        jax.block_until_ready(metrics)
        self.rates.append(self.steps / (time.perf_counter() - start))


def bench(config, variants: Sequence[str], steps: int, rounds: int) -> list[dict]:
    """Rows of (variant, steps/s median, per round, ratio to the baseline, first losses)."""
    configs = [("baseline", config)] + [
        (v, apply_overrides(config, parse_variant(v))) for v in variants
    ]
    from mlperf.validate import validate
    from parallel.mesh import select_devices

    for _, c in configs:  # every variant's errors before any compile
        validate(c, len(select_devices(jax.devices(), c.mesh.get("num_devices", 0))))
    runs = [_Run(name, c, steps) for name, c in configs]
    for _ in range(rounds):
        for timed in runs:
            timed.time_round()
    base = statistics.median(runs[0].rates)
    return [
        {
            "variant": run.name,
            "steps_per_s": statistics.median(run.rates),
            "rounds": run.rates,
            "vs_baseline": statistics.median(run.rates) / base,
            "first_losses": run.first_losses,
        }
        for run in runs
    ]


def table(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    return markdown_table(
        ["variant", "steps/s (median)", "rounds", "vs baseline", "first losses"],
        [
            [
                f"`{r['variant']}`",
                f"{r['steps_per_s']:.2f}",
                " / ".join(f"{x:.2f}" for x in r["rounds"]),
                f"{r['vs_baseline']:.2f}x",
                " / ".join(f"{x:.4f}" for x in r["first_losses"]),
            ]
            for r in rows
        ],
    )


def main(argv: list[str]) -> None:
    config = CONFIG.value
    if config is None:
        usage_error("variants: give --config, e.g. configs/bert.py:wikitext")
    if not _CHANGES.value:
        usage_error("variants: give at least one --change KEY=VALUE, e.g. model.remat=True")
    try:
        apply_mesh_override(config, MESH.value)
        rows = bench(config, _CHANGES.value, max(STEPS.value, 1), max(ROUNDS.value, 1))
    except (ValueError, ConfigError, MeshShapeError, FileNotFoundError) as e:
        usage_error(f"variants: {e}")
    print_rows(rows, table)


if __name__ == "__main__":
    run(main)
