"""`train.steps_per_dispatch`: k train steps in one host dispatch (mlperf/dispatch.py).

A whole run at k = 4 logs the losses and evals of the k = 1 run at the same steps and
ends at its parameters (to float32 rounding, dropout on), and resumes exactly from its
checkpoint; the stacked input is one transfer of each step's rows; values the loop's
hooks could not honour are one-line ConfigErrors before anything is built; packed BERT
rows run their evals at the first dispatch boundary past the due sample count; phase
ends and evals off the k-step grid run at the steps k = 1 runs them, single steps around
them, and a checkpoint off the grid resumes.
"""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from conftest import small_bert_config, synthetic_bert_batch

from mlperf import dispatch
from mlperf.checkpoint import committed_steps
from mlperf.dispatch import dispatch_length, stack_batches
from mlperf.eval_schedule import DueEval, due_evals
from mlperf.task import Phase
from mlperf.validate import ConfigError, validate

K = 4


def _leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def test_stacked_host_batches_are_one_transfer_of_each_steps_rows(devices):
    from jax.sharding import Mesh

    from parallel.partition import Partitioner

    p = Partitioner(Mesh(np.array(devices).reshape(4, 2), ("data", "model")))
    layout = p.data_layout(16)
    batches = [synthetic_bert_batch(16, seed=i) for i in range(K)]
    stacked = p.host_steps_to_global(stack_batches(batches), layout)
    for name, array in stacked.items():
        assert array.shape == (K, *batches[0][name].shape)
        assert array.sharding.spec == p.steps_batch_spec(array.ndim)  # steps axis whole
        for i, batch in enumerate(batches):
            one = p.host_to_global(batch, layout)[name]
            np.testing.assert_array_equal(np.asarray(array[i]), batch[name])
            assert array[i].sharding.is_equivalent_to(one.sharding, one.ndim)
    with pytest.raises(ValueError, match=r"expected \[steps, 16, ...\]"):
        p.host_steps_to_global({"x": np.zeros((K, 8))}, layout)


# ---- the config check -----------------------------------------------------------------


def _check(**overrides):
    validate(small_bert_config(**{"train.steps": 8, "train.log_every_steps": 4, **overrides}), 8)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"train.steps_per_dispatch": 0}, "train.steps_per_dispatch=0 must be an integer >= 1"),
        ({"train.steps_per_dispatch": -2}, "train.steps_per_dispatch=-2 must be an integer >= 1"),
        (
            {"train.steps_per_dispatch": 4, "train.log_every_steps": 6},
            "train.steps_per_dispatch=4: train.log_every_steps=6 is not a multiple of 4 (the "
            "progress line and the checkpoints are written between dispatches); use "
            "train.steps_per_dispatch=6, the largest",
        ),
        (
            {"train.steps_per_dispatch": 4, "checkpoint.every_steps": 2},
            "train.steps_per_dispatch=4: checkpoint.every_steps=2 is not a multiple of 4",
        ),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_value_to_change(overrides, message):
    with pytest.raises(ConfigError) as e:
        _check(**overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_phase_ends_and_evals_off_the_grid_pass():
    _check(**{"train.steps_per_dispatch": 4, "train.eval_every_samples": 64})
    _check(**{"train.steps_per_dispatch": 4, "checkpoint.every_steps": 8})
    # The loop runs single steps up to a phase end or an eval inside a stretch of k.
    _check(**{"train.steps_per_dispatch": 4, "train.steps": 10})
    _check(**{"train.steps_per_dispatch": 4, "train.eval_every_samples": 32})
    _check(**{"train.steps_per_dispatch": 4, "train.eval_every_samples": 36})
    # Packed rows: the step an eval falls at is known only while training.
    _check(**{"train.steps_per_dispatch": 4, "train.eval_every_samples": 32,
              "data.packing.enabled": True})  # fmt: skip


def _lengths(start: int, stop: int, k: int, ends: tuple[int, ...]) -> list[int]:
    out, step = [], start
    while step < stop:
        out.append(dispatch_length(step, k, ends))
        step += out[-1]
    return out


def test_dispatches_fill_the_k_grid_and_run_single_steps_around_marks():
    # Marks at 6 (an eval) and 10 (the phase end), k = 4: steps 1-4 in one dispatch, then
    # single steps 5, 6 (the eval), 7, 8, and single steps 9, 10 to the end.
    assert _lengths(0, 10, 4, (6, 10)) == [4, 1, 1, 1, 1, 1, 1]
    assert dispatch.needs_single_steps(4, (6, 10), 0, 10)
    # Marks on the grid: k-step dispatches only; no one-step program is compiled.
    assert _lengths(0, 12, 4, (8, 12)) == [4, 4, 4]
    assert not dispatch.needs_single_steps(4, (8, 12), 0, 12)
    # A resume off the grid (step 6): single steps to 8, then whole dispatches.
    assert _lengths(6, 16, 4, (16,)) == [1, 1, 4, 4]
    assert dispatch.needs_single_steps(4, (16,), 6, 16)
    assert _lengths(0, 5, 1, (3, 5)) == [1] * 5


def test_marks_are_phase_ends_and_the_steps_evals_follow():
    from mlperf.trainer import build_trainer

    config = small_bert_config(**{"train.steps": 10, "train.eval_every_samples": 36})
    task = build_trainer(config, prepare_data=False).task
    # 16-row steps: evals due at 36, 72, 108, 144 samples follow steps 3, 5, 7, 9.
    assert dispatch.marks(config, task) == (3, 5, 7, 9, 10)
    packed = small_bert_config(**{"train.steps": 10, "train.eval_every_samples": 36,
                                  "data.packing.enabled": True})  # fmt: skip
    task = build_trainer(packed, prepare_data=False).task
    assert dispatch.marks(packed, task) == (10,)  # packed evals: after the dispatch past


def test_due_evals_name_the_step_each_eval_follows():
    def phase(batch, steps):
        return Phase("p", batch, steps, 1.0, 0, steps, {})

    assert due_evals([phase(16, 8)], 32, 32) == [
        DueEval(32 * i, 2 * i, 32 * i) for i in (1, 2, 3, 4)
    ]
    # Phase 2 trains 32 rows a step from step 9 (128 samples) on. Due at 40: inside step
    # 3 (48 samples); 80 ends step 5; 120 inside step 8; 160 ends step 9; 200 and 240
    # inside steps 11 and 12.
    assert due_evals([phase(16, 8), phase(32, 4)], 40, 40) == [
        DueEval(40, 3, 48),
        DueEval(80, 5, 80),
        DueEval(120, 8, 128),
        DueEval(160, 9, 160),
        DueEval(200, 11, 224),
        DueEval(240, 12, 256),
    ]


def test_a_changed_or_absent_value_is_trajectory_neutral_on_resume():
    from mlperf.checkpoint import check_config_change, plain_config

    older = plain_config(small_bert_config())
    del older["train"]["steps_per_dispatch"]  # a checkpoint written before the key
    for saved in (older, plain_config(small_bert_config(**{"train.steps_per_dispatch": 2}))):
        now = plain_config(small_bert_config())
        (change,) = check_config_change(saved, now, allowed=(), where="x")
        assert change.key == "train.steps_per_dispatch" and change.neutral


# ---- whole runs -----------------------------------------------------------------------

RUN = {
    # The prepared vocabulary (114 words) does not split over a model axis of 4.
    "mesh.ici_shape": (8, 1),
    "train.steps": 2 * K,
    "train.log_every_steps": K,
    "train.eval_every_samples": 16 * K,  # an eval after steps 4 and 8
    "train.target": 2.0,  # unreachable: every run trains all its steps
    "train.stop_at_target": False,
    "checkpoint.every_steps": K,
    "checkpoint.keep": 10,
    "checkpoint.async": False,
    # Dropout on: each step's RNG (folded from the step counter) must be the single step's.
    "model.dropout_rate": 0.1,
}


def _records(workdir, kind: str) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _without_timing(workdir) -> list[dict]:
    """The train records without their (timed) samples/s and MFU."""
    timed = ("samples_per_s", "mfu")
    return [{k: v for k, v in r.items() if k not in timed} for r in _records(workdir, "train")]


def _run_keeping_state(config, workdir):
    """`train.run` of `config` in `workdir`: (its result, the trained state it ends at)."""
    from mlperf import train

    final = []
    trained = train.train

    def keep(init, loop):
        final.append(trained(init, loop))  # the trained state, for the comparison
        return final[-1]

    with pytest.MonkeyPatch.context() as m:
        m.setattr(train, "train", keep)
        result = train.run(config, str(workdir))
    return result, final[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same run at k = 1 and at k = 4: (config, work directory, result, final state);
    only the k = 4 run writes checkpoints (every 4 steps)."""
    out = {}
    for k in (1, K):
        settings = {**RUN, "checkpoint.enabled": k > 1, "train.steps_per_dispatch": k}
        config = small_bert_config(**settings)
        workdir = tmp_path_factory.mktemp(f"k{k}")
        out[k] = (config, workdir, *_run_keeping_state(config, workdir))
    return out


def test_a_run_at_k4_logs_what_k1_logs_at_the_same_steps_and_ends_at_its_params(runs):
    (_, dir1, result1, state1), (_, dir4, result4, state4) = runs[1], runs[K]
    assert result1.steps == result4.steps == 2 * K
    assert result1.samples == result4.samples == 2 * K * 16
    train1, train4 = _records(dir1, "train"), _records(dir4, "train")
    assert [(r["step"], r["samples"]) for r in train4] == [(4, 64), (8, 128)]
    assert [(r["step"], r["samples"]) for r in train1] == [(4, 64), (8, 128)]
    for key in ("loss", "learning_rate", "grad_norm"):
        np.testing.assert_allclose([r[key] for r in train4], [r[key] for r in train1], rtol=2e-5)
    eval1, eval4 = _records(dir1, "eval"), _records(dir4, "eval")
    assert [r["step"] for r in eval4] == [r["step"] for r in eval1] == [4, 8]
    np.testing.assert_allclose(
        [r["mlm_accuracy"] for r in eval4], [r["mlm_accuracy"] for r in eval1], atol=1e-6
    )
    assert committed_steps(str(dir4 / "checkpoints")) == [4, 8]
    assert int(jax.device_get(state4["step"])) == 2 * K
    for got, want in zip(_leaves(state4["params"]), _leaves(state1["params"]), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_k4_run_resumes_exactly_from_its_checkpoint(runs, tmp_path):
    from mlperf.train import run

    config, reference, want, _ = runs[K]
    workdir = tmp_path / "resumed"
    shutil.copytree(reference, workdir)
    shutil.rmtree(workdir / "checkpoints" / str(2 * K))  # as if stopped after step 4's save
    got = run(config, str(workdir))
    assert got.resumed_from_step == K and got.steps == 2 * K
    assert got.params_fingerprint == want.params_fingerprint  # bit-identical parameters
    assert _without_timing(workdir) == _without_timing(reference)  # every logged step, exactly


def test_packed_rows_run_their_evals_at_the_first_dispatch_boundary_past_the_due_count(
    tmp_path,
):
    from mlperf.train import run

    k, every = 2, 40  # packed steps hold a varying number of sequences
    config = small_bert_config(
        **{**RUN, "train.steps": 4 * k, "train.log_every_steps": k,
           "train.eval_every_samples": every, "checkpoint.enabled": False,
           "data.packing.enabled": True, "train.steps_per_dispatch": k}
    )  # fmt: skip
    run(config, str(tmp_path))
    samples_at = {0: 0} | {r["step"]: r["samples"] for r in _records(tmp_path, "train")}
    evals = _records(tmp_path, "eval")
    assert len(evals) >= 2 and all(r["step"] % k == 0 for r in evals)
    due = every
    for r in evals[:-1]:  # (the last step always evaluates)
        # The eval follows the first dispatch whose samples reach its due count.
        assert samples_at[r["step"]] >= due > samples_at[r["step"] - k]
        while due <= r["samples"]:
            due += every


# ---- marks off the grid: single steps around them ------------------------------------

OFF_GRID = {
    **RUN,
    "train.steps": 3 * K,  # 12 steps of 16 rows
    "train.eval_every_samples": 96,  # one eval after step 6, inside the stretch 5-8
}


@pytest.fixture(scope="module")
def off_grid(tmp_path_factory):
    """The same 12-step run at k = 1 (a checkpoint every 2 steps) and at k = 4 (steps
    1-4 in one dispatch, 5 to 8 single, 9-12 in one): (config, workdir, result, state)."""
    out = {}
    for k in (1, K):
        settings = {**OFF_GRID, "checkpoint.enabled": k == 1, "checkpoint.every_steps": 2,
                    "train.steps_per_dispatch": k}  # fmt: skip
        config = small_bert_config(**settings)
        workdir = tmp_path_factory.mktemp(f"off_grid_k{k}")
        out[k] = (config, workdir, *_run_keeping_state(config, workdir))
    return out


def _same_run(dir1, dir4, state1, state4) -> None:
    train1, train4 = _records(dir1, "train"), _records(dir4, "train")
    assert [r["step"] for r in train4] == [r["step"] for r in train1] == [4, 8, 12]
    for key in ("loss", "learning_rate", "grad_norm"):
        np.testing.assert_allclose([r[key] for r in train4], [r[key] for r in train1], rtol=2e-5)
    eval1, eval4 = _records(dir1, "eval"), _records(dir4, "eval")
    assert [r["step"] for r in eval4] == [r["step"] for r in eval1] == [6, 12]
    np.testing.assert_allclose(
        [r["mlm_accuracy"] for r in eval4], [r["mlm_accuracy"] for r in eval1], atol=1e-6
    )
    for got, want in zip(_leaves(state4["params"]), _leaves(state1["params"]), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_eval_off_the_grid_runs_at_the_step_k1_runs_it(off_grid):
    (_, dir1, result1, state1), (_, dir4, result4, state4) = off_grid[1], off_grid[K]
    assert result1.steps == result4.steps == 3 * K
    _same_run(dir1, dir4, state1, state4)


def test_a_k1_checkpoint_off_the_grid_resumes_at_k4(off_grid, tmp_path):
    _, reference, _, state1 = off_grid[1]
    workdir = tmp_path / "resumed"
    shutil.copytree(reference, workdir)
    for step in (8, 10, 12):  # as if stopped after step 6's save
        shutil.rmtree(workdir / "checkpoints" / str(step))
    config = small_bert_config(**{**OFF_GRID, "checkpoint.enabled": True,
                                  "checkpoint.every_steps": 4,
                                  "train.steps_per_dispatch": K})  # fmt: skip
    got, state = _run_keeping_state(config, workdir)
    assert got.resumed_from_step == 6 and got.steps == 3 * K
    _same_run(reference, workdir, state1, state)


def test_the_mlperf_configs_run_several_steps_a_dispatch():
    """docs/performance.md: BERT and SSD 10, Transformer 50, Mask R-CNN 5, each dividing
    the config's logging and checkpoint cadences."""
    from configs import bert, maskrcnn, ssd, transformer

    for module, k in ((bert, 10), (transformer, 50), (ssd, 10), (maskrcnn, 5)):
        config = module.get_config("mlperf_v07")
        assert dispatch.steps_per_dispatch(config) == k, module.__name__
        assert all(n % k == 0 for _, n in dispatch.cadences(config)), module.__name__
