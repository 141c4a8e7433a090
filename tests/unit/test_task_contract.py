"""The Task contract: every benchmark subclasses mlperf.task.Task, its hooks exist with
defaults (the loop never probes a task), tasks are immutable and compute their phases
once, and model dataclasses are filled from config blocks in one place."""

from __future__ import annotations

import ast
import dataclasses
import os

import numpy as np
import pytest
from conftest import REPO

from configs import bert, maskrcnn, ssd, transformer
from mlperf.bert.model import BertConfig
from mlperf.pretrained import PretrainedModules
from mlperf.task import Task, from_config
from mlperf.tasks import get_task

CONFIGS = {"bert": bert, "transformer": transformer, "ssd": ssd, "maskrcnn": maskrcnn}


@pytest.fixture(params=sorted(CONFIGS), scope="module")
def task(request) -> Task:
    return get_task(CONFIGS[request.param].get_config("tiny"))


def test_every_benchmark_is_a_task_with_phases_computed_once(task):
    assert isinstance(task, Task)
    assert task.phases() is task.phases() and len(task.phases()) >= 1
    assert task.target_value == task.target_value > 0
    assert task.mllog_metadata() is not None  # a hook with a default, never probed


def test_one_pretrained_hook_none_without_init(task):
    assert task.pretrained({}) is None  # the tiny configs start from the random init


def test_pretrained_modules_name_every_difference_from_the_model():
    shapes = {"backbone": {"conv": np.zeros((3, 3)), "bn": np.zeros(3)}, "head": np.zeros(2)}
    fits = PretrainedModules({"backbone": {"conv": np.ones((3, 3)), "bn": np.ones(3)}}, shapes, "x")
    assert not fits.whole_model and fits.describe() == "x" and set(fits.read()) == {"backbone"}
    wrong = {"backbone": {"conv": np.ones((3, 4)), "extra": np.ones(1)}, "neck": {}}
    with pytest.raises(ValueError, match=r"do not fit the model \(4 differences\)") as e:
        PretrainedModules(wrong, shapes, "x")
    for part in (
        "backbone/extra: not in the model",
        "backbone/bn: missing from the checkpoint",
        "backbone/conv: checkpoint (3, 4), model (3, 3)",
        "neck: not a module",
    ):
        assert part in str(e.value)


def test_tasks_are_immutable_after_construction(task):
    with pytest.raises(AttributeError, match="immutable after construction"):
        task.config = None
    with pytest.raises(AttributeError, match="immutable after construction"):
        task.anything_new = 1


def test_data_before_prepare_is_one_clear_error(task):
    assert not task.has_data
    with pytest.raises(RuntimeError, match=r"task.with_data\(task.prepare"):
        task.num_eval_examples()


def test_host_metrics_follow_the_overridden_hooks():
    flags = {name: type(get_task(c.get_config("tiny"))).host_metrics for name, c in CONFIGS.items()}
    assert flags == {"bert": False, "transformer": True, "ssd": True, "maskrcnn": True}

    with pytest.raises(TypeError, match="both eval_outputs and host_eval_stats"):

        class HalfHostMetrics(type(get_task(bert.get_config("tiny")))):  # noqa: F841
            def eval_outputs(self, model, batch):
                return {}


def test_default_target_and_schedule_hooks():
    task = get_task(bert.get_config("tiny"))
    metric = task.target_metric
    assert task.target_reached({metric: task.target_value})
    assert not task.target_reached({metric: task.target_value - 1e-3})
    phase = task.phases()[0]
    schedule = task.schedule()
    assert float(schedule(phase.warmup_steps)) == pytest.approx(phase.learning_rate, rel=1e-6)


def test_with_data_returns_a_new_task_and_leaves_this_one_alone():
    from input_pipeline.translation_data import TranslationData

    task = get_task(transformer.get_config("tiny"))
    data = TranslationData(
        vocab=None,
        vocab_size=1000,
        train_rows=None,
        eval_records=None,
        references={},
        eval_length=8,
        num_eval_examples=3,
        summaries={},
    )
    prepared = task.with_data(data)
    assert prepared is not task and prepared.data is data and not task.has_data
    assert prepared.num_eval_examples() == 3
    # The data's vocabulary (rounded up to a multiple of 128) reaches the model config;
    # the unprepared task keeps the config's.
    assert prepared.model_config().vocab_size == 1024
    assert task.model_config().vocab_size != 1024


def test_model_config_fields_come_from_the_config_block_or_the_dataclass_default():
    c = bert.get_config("tiny")
    m = get_task(c).model_config()
    for f in dataclasses.fields(BertConfig):
        if f.name in c.model and f.name != "vocab_size":
            assert getattr(m, f.name) == c.model[f.name], f.name
    # A field the block leaves out keeps the dataclass's default; explicit values win.
    built = from_config(BertConfig, {"hidden_size": 8, "unrelated": 1}, vocab_size=5)
    assert (built.hidden_size, built.vocab_size, built.num_layers) == (8, 5, 12)


def test_no_code_probes_a_task_for_its_methods():
    """getattr/hasattr on a task would hide a missing hook; the base class declares them."""
    offenders = []
    for package in ("mlperf", "launch"):
        for root, _, files in os.walk(os.path.join(REPO, package)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(root, name)
                with open(path) as f:
                    tree = ast.parse(f.read())
                for node in ast.walk(tree):
                    if (
                        isinstance(node, ast.Call)
                        and isinstance(node.func, ast.Name)
                        and node.func.id in ("getattr", "hasattr")
                        and node.args
                        and "task" in ast.unparse(node.args[0])
                    ):
                        offenders.append(f"{os.path.relpath(path, REPO)}:{node.lineno}")
    assert not offenders, offenders
