"""The train loop's host-side cost per step, for `python -m launch.bench.input`.

What `mlperf/loop.py` does on the host each step besides making the input: assemble the
host batch into global arrays (`Partitioner.host_to_global`: the host-to-device copy),
dispatch the compiled step, and every `train.log_every_steps` steps fetch the metrics and
format the progress line. The step is stubbed by an already-compiled trivial program with
the real config's signature: its train-state tree (every leaf, a scalar on every device of
the real mesh layout, so the dispatch handles as many buffers), the host batch at the
`mlperf_v07` shapes and dtypes, and a dict of scalar metrics. Its own device time is
negligible, so what is timed is the host's work.

At `steps_per_dispatch` k > 1 (`train.steps_per_dispatch`, mlperf/dispatch.py) the loop's
own multi-step path is timed: `PhaseRun.fetch` and `PhaseRun.global_batch` take k host
batches, stack them and assemble them in one transfer, and the stub runs k times in one
program (`mlperf.steps.scan_steps`, as the trainer wraps the real step); the figures are
per step, so they show what k saves.

A task that splits an input field beyond its rows (`Task.input_axes`: SSD's and Mask
R-CNN's image height under spatial partitioning) has its dispatches alternate with the
baseline's, the same transfer with every field's rows sent whole to each of their
devices, so the two transfers are compared in one run.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import math
import time

import numpy as np

from launch.bench.input_data import mlperf_config

BUDGET = 0.05  # the goal: host overhead under 5% of the estimated step
_METRICS = ("loss", "mlm_loss", "accuracy", "grad_norm", "learning_rate")


@dataclasses.dataclass(frozen=True)
class Overhead:
    """Mean host seconds per step of each part of the loop's own work."""

    model: str
    host_batch: int
    batch_bytes: int
    state_leaves: int
    dispatch_s: float
    transfer_s: float
    logging_s: float  # a metrics fetch and line every log_every_steps, per step
    budgets_s: dict[str, float]  # BUDGET x the estimated step, per generation
    steps_per_dispatch: int = 1  # train steps each timed dispatch ran
    stub_device_s: float = 0.0  # the stub program's own run, per step (not host work)
    # The baseline in the same run: the same transfers with every field's rows sent
    # whole to each device that holds them (no Task.input_axes split), per step; None
    # when the model splits no field.
    transfer_whole_s: float | None = None
    # Bytes this host sends to its devices per step (every device's shards summed), as
    # the loop sends them and with every field's rows whole (None: nothing split).
    device_bytes: int = 0
    device_bytes_whole: int | None = None

    @property
    def total_s(self) -> float:
        """Host seconds per train step."""
        return self.dispatch_s + self.transfer_s + self.logging_s

    @property
    def steps_per_call(self) -> int:
        """Train steps one dispatch would have to run for this host work to fit the
        tightest budget (1: it fits as it is), taking the host work of one dispatch as
        measured at this row's steps per dispatch."""
        per_dispatch = self.total_s * self.steps_per_dispatch
        return max(1, math.ceil(per_dispatch / min(self.budgets_s.values())))


def _stub_state(abstract, sharding):
    """A scalar per leaf of the train state, placed on every device."""
    import jax

    def leaf(a):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            return jax.device_put(jax.random.key(0), sharding)
        return jax.device_put(np.zeros((), a.dtype), sharding)

    return jax.tree.map(leaf, abstract)


def measure_overhead(
    model: str, host_batch: int, steps: int, step_s: dict[str, float], steps_per_dispatch: int = 1
) -> Overhead:
    """Times `steps` stubbed loop steps (rounded up to whole dispatches of
    `steps_per_dispatch`) of the model's `mlperf_v07` config on this process's devices, at
    `host_batch` rows (rounded up to the batch's split)."""
    import itertools

    import jax
    import jax.numpy as jnp

    from mlperf.loop import PhaseRun, last_step
    from mlperf.steps import scan_steps
    from mlperf.trainer import build_trainer

    config = mlperf_config(model)
    trainer = build_trainer(config, prepare_data=False)
    p = trainer.partitioner
    shards = p.batch_shards()
    rows = -(-host_batch // shards) * shards
    spec = trainer.task.example_spec(trainer.phases[0])
    host = {k: np.ones((rows, *shape), dtype) for k, (shape, dtype) in spec.items()}
    layout = p.data_layout(rows)
    rep = p.replicated()
    state = _stub_state(trainer.layout.abstract_train_state, rep)
    state_shardings = jax.tree.map(lambda _: rep, state)

    def stub_step(state, batch, key):
        del key
        first = sum(
            jnp.sum(x.reshape(x.shape[0], -1)[:, :1].astype(jnp.float32)) for x in batch.values()
        )
        return state, {name: first for name in _METRICS}  # fmt: skip

    k = steps_per_dispatch
    step = jax.jit(
        stub_step if k == 1 else scan_steps(stub_step),
        in_shardings=(state_shardings, None, rep),
        out_shardings=(state_shardings, rep),
        donate_argnums=(0,),
    )
    # The loop's input path: k host batches taken, stacked and assembled in one transfer.
    pr = PhaseRun(trainer.phases[0], layout, itertools.repeat(host), [], step, steps_per_dispatch=k)
    key = jax.device_put(jax.random.key(0), rep)
    log_every = int(config.train.log_every_steps)
    sink = io.StringIO()
    parts = {"dispatch": 0.0, "transfer": 0.0, "logging": 0.0, "stub": 0.0, "whole": 0.0}
    sent = [0, 0]  # bytes to this host's devices per dispatch: split, whole
    dispatches = -(-steps // k)
    # A task that splits an input field beyond its rows (Task.input_axes) is timed with
    # its dispatches alternating with the baseline's (a copy of the partitioner that
    # sends every field's rows whole), so both transfers run beside the same stub runs.
    partitioners = [p]
    if p.input_axes:
        whole_rows = copy.copy(p)
        whole_rows.input_axes = {}
        partitioners.append(whole_rows)
    warm = 3 * len(partitioners)  # three warm-up dispatches each compile and settle
    for i in range(dispatches * len(partitioners) + warm):
        baseline = i % len(partitioners) == 1
        if i == warm:
            jax.block_until_ready(state)
            parts = dict.fromkeys(parts, 0.0)
        t0 = time.perf_counter()
        pr.fetch()
        batch = pr.global_batch(partitioners[int(baseline)])
        jax.block_until_ready(batch)
        t1 = time.perf_counter()
        state, metrics = step(state, batch, key)
        t2 = time.perf_counter()
        # On XLA:CPU the "device" is this host's cores: the stub's own run (a scan over
        # the stacked batch) would otherwise run under the next transfer's timing. A
        # TPU runs it on the chip, so it is timed apart and not counted as host work.
        jax.block_until_ready((state, metrics))
        t3 = time.perf_counter()
        if i < warm:  # the bytes are the same every dispatch: counted while warming up
            sent[int(baseline)] = _device_bytes(batch)
            continue
        if baseline:
            parts["whole"] += t1 - t0
            continue
        parts["stub"] += t3 - t2
        parts["transfer"] += t1 - t0
        parts["dispatch"] += t2 - t1
        j = i // len(partitioners)
        if ((j + 1) * k) // log_every > (j * k) // log_every:  # a logged step in it
            last = {name: last_step(v) for name, v in jax.device_get(metrics).items()}
            sink.write(" ".join(f"{name}={v:.4f}" for name, v in last.items()) + "\n")
            parts["logging"] += time.perf_counter() - t3  # the fetch and line, not the stub
    jax.block_until_ready(state)
    timed = dispatches * k
    whole = parts["whole"] / timed if len(partitioners) > 1 else None
    return Overhead(
        model=model,
        host_batch=rows,
        batch_bytes=sum(a.nbytes for a in host.values()),
        state_leaves=len(jax.tree.leaves(state)),
        dispatch_s=parts["dispatch"] / timed,
        transfer_s=parts["transfer"] / timed,
        logging_s=parts["logging"] / timed,
        stub_device_s=parts["stub"] / timed,
        budgets_s={g: BUDGET * s for g, s in step_s.items()},
        steps_per_dispatch=k,
        transfer_whole_s=whole,
        device_bytes=sent[0] // k,
        device_bytes_whole=sent[1] // k if len(partitioners) > 1 else None,
    )


def _device_bytes(batch: dict) -> int:
    """Bytes of every shard of `batch` on this process's devices: what the host sends."""
    return sum(s.data.nbytes for a in batch.values() for s in a.addressable_shards)
