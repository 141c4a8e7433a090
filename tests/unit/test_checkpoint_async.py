"""Asynchronous saves while a donating step runs: what is written is the state at save time.

A fast, deterministic guard for the aliasing questions behind exact resume: on CPU the
host copy orbax takes of an array is a zero-copy view of its device buffer, and a restored
array's devices can share one host buffer; the train step donates its state, so XLA may
write the next state into those very buffers. Here a small sharded state is trained by a
donating step, saved asynchronously after every step (the next step is dispatched while
the files are written), then every checkpoint is restored and compared bitwise with an
unsaved run, and a restored state is trained on and compared again.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from mlperf.checkpoint import CheckpointConfig, Checkpointer

STEPS = 6
SPECS = {"replicated": P(), "data": P("data"), "model": P(None, "model")}


@pytest.fixture(scope="module")
def setup(devices):
    mesh = Mesh(np.array(devices).reshape(2, 4), ("data", "model"))
    shardings = {name: NamedSharding(mesh, spec) for name, spec in SPECS.items()}
    rng = np.random.default_rng(0)
    init = {name: rng.standard_normal((64, 32), np.float32) for name in SPECS}

    @jax.jit
    def _step(state, t):
        # Every element changes every step (and by a step-dependent amount), so a value
        # read one step late or early is caught.
        return {k: v * 0.9 + jnp.sin(v + t) * 1e-3 for k, v in state.items()}

    step = jax.jit(_step, donate_argnums=0, out_shardings=shardings)

    def fresh():
        return jax.device_put(init, shardings)

    truth, state = [], fresh()
    for t in range(1, STEPS + 1):
        state = step(state, jnp.float32(t))
        truth.append(jax.tree.map(np.array, jax.device_get(state)))
    abstract = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), init, shardings
    )
    return step, fresh, truth, abstract


def _assert_equal(got, want, what):
    for name in SPECS:
        np.testing.assert_array_equal(np.asarray(got[name]), want[name], err_msg=what)


def test_async_saves_hold_the_state_at_save_time_and_resume_exactly(setup, tmp_path):
    step, fresh, truth, abstract = setup
    cp = Checkpointer(CheckpointConfig(str(tmp_path / "ckpt"), keep=100, keep_best=0), "m")
    state = fresh()
    for t in range(1, STEPS + 1):
        state = step(state, jnp.float32(t))
        cp.save(t, state, {}, None)  # returns before the files are written
    cp.wait()
    assert cp.steps() == list(range(1, STEPS + 1))
    for t in cp.steps():
        _assert_equal(cp.restore_step(t, abstract).state, truth[t - 1], f"checkpoint {t}")
    # A restored state trained on by the donating step continues bit-exactly.
    state = cp.restore_step(2, abstract).state
    for t in range(3, STEPS + 1):
        state = step(state, jnp.float32(t))
    _assert_equal(state, truth[-1], "resumed from checkpoint 2")
    cp.close()


def test_orbax_alone_saves_the_state_at_save_time_under_donation(setup, tmp_path):
    """Without the Checkpointer's private CPU copy: orbax's zero-copy host views keep
    their buffers from being donated (JAX then copies), so the files are still right."""
    step, fresh, truth, abstract = setup
    state = fresh()
    with ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler()) as ckptr:
        for t in range(1, STEPS + 1):
            state = step(state, jnp.float32(t))  # runs while save t-1 is written
            ckptr.wait_until_finished()  # one save in flight, as the manager does
            ckptr.save(tmp_path / str(t), args=ocp.args.StandardSave(state))
        ckptr.wait_until_finished()
        for t in range(1, STEPS + 1):
            got = ckptr.restore(tmp_path / str(t), args=ocp.args.StandardRestore(abstract))
            _assert_equal(got, truth[t - 1], f"orbax checkpoint {t}")
