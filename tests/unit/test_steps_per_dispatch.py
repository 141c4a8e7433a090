"""`train.steps_per_dispatch`: k train steps in one host dispatch (mlperf/dispatch.py).

A whole run at k = 4 logs the losses and evals of the k = 1 run at the same steps and
ends at its parameters (to float32 rounding, dropout on), and resumes exactly from its
checkpoint; the stacked input is one transfer of each step's rows; values the loop's
hooks could not honour are one-line ConfigErrors before anything is built; packed BERT
rows run their evals at the first dispatch boundary past the due sample count.
"""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from conftest import small_bert_config, synthetic_bert_batch

from mlperf.checkpoint import committed_steps
from mlperf.dispatch import check_resume_step, stack_batches
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
            {"train.steps_per_dispatch": 4, "train.steps": 10, "train.log_every_steps": 2},
            "train.steps_per_dispatch=4: train.steps=10 is not a multiple of 4 (the loop's "
            "hooks run between dispatches); use train.steps_per_dispatch=2, the largest",
        ),
        (
            {"train.steps_per_dispatch": 4, "train.log_every_steps": 6},
            "train.steps_per_dispatch=4: train.log_every_steps=6 is not a multiple of 4",
        ),
        (
            {"train.steps_per_dispatch": 4, "checkpoint.every_steps": 2},
            "train.steps_per_dispatch=4: checkpoint.every_steps=2 is not a multiple of 4",
        ),
        (
            # 16-row steps: an eval every 32 samples falls after steps 2, 4, 6 and 8.
            {"train.steps_per_dispatch": 4, "train.eval_every_samples": 32},
            "train.steps_per_dispatch=4: the eval due at 32 samples "
            "(train.eval_every_samples=32) falls after step 2, which is not a multiple of 4",
        ),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_value_to_change(overrides, message):
    with pytest.raises(ConfigError) as e:
        _check(**overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_values_the_hooks_can_honour_pass():
    _check(**{"train.steps_per_dispatch": 4, "train.eval_every_samples": 64})
    _check(**{"train.steps_per_dispatch": 4, "checkpoint.every_steps": 8})
    # Evals due inside steps (36, 72, 108 samples: during steps 3, 5, 7) run at the first
    # boundary past them, as k = 1 runs them after the first step past them.
    _check(**{"train.steps_per_dispatch": 4, "train.eval_every_samples": 36})
    # Packed rows: the step an eval falls at is known only while training.
    _check(**{"train.steps_per_dispatch": 4, "train.eval_every_samples": 32,
              "data.packing.enabled": True})  # fmt: skip


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


def test_a_resume_off_a_dispatch_boundary_is_refused_before_compiling():
    config = small_bert_config(**{"train.steps_per_dispatch": 4})
    check_resume_step(config, None)
    check_resume_step(config, 8)
    with pytest.raises(ConfigError, match="checkpoint resumed is at step 6, not a multiple of 4; "
                       "resume with train.steps_per_dispatch=2"):  # fmt: skip
        check_resume_step(config, 6)


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


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same run at k = 1 and at k = 4: (config, work directory, result, final state);
    only the k = 4 run writes checkpoints (every 4 steps)."""
    from mlperf import train

    out = {}
    for k in (1, K):
        settings = {**RUN, "checkpoint.enabled": k > 1, "train.steps_per_dispatch": k}
        config = small_bert_config(**settings)
        workdir = tmp_path_factory.mktemp(f"k{k}")
        final = []
        trained = train.train

        def keep(init, loop, trained=trained, final=final):
            final.append(trained(init, loop))  # the trained state, for the comparison
            return final[-1]

        with pytest.MonkeyPatch.context() as m:
            m.setattr(train, "train", keep)
            result = train.run(config, str(workdir))
        out[k] = (config, workdir, result, final[0])
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
