"""Batches that do not split over a topology's `data` axis: the one line inspect and plan
print, the nearest valid batches and the meshes that keep the config's batches."""

from __future__ import annotations

import pytest

from configs.bert import get_config as bert_config
from configs.maskrcnn import get_config as maskrcnn_config
from configs.transformer import get_config as transformer_config
from launch.tables.tpu import row_spec
from mlperf.batch_fit import (
    fit_text,
    mesh_proposals,
    nearest_multiples,
    problems,
    suggest,
    topology_fit_text,
    use_slices,
)
from mlperf.inspection import inspect_config
from mlperf.validate import ConfigError


def test_nearest_multiples_below_and_above():
    assert nearest_multiples(3072, 2048) == (2048, 4096)
    assert nearest_multiples(256, 512) == (None, 512)  # nothing valid below
    assert nearest_multiples(100, 32) == (96, 128)
    assert nearest_multiples(4096, 1024) == (4096, 4096)


def test_transformer_eval_batch_on_the_4096_chip_v3_pod():
    """The Transformer with an eval batch of 3072: train 2048 splits over data=2048, eval
    3072 does not (mlperf_v07's own eval batch, 4096, does)."""
    config = transformer_config("mlperf_v07")
    assert problems(config, 2048) == []
    config.train.eval_batch_size = 3072
    sizes = {"data": 2048, "model": 4}
    (p,) = problems(config, 2048)
    assert (p.name, p.batch, p.below, p.above, p.nearest) == (
        "train.eval_batch_size",
        3072,
        2048,
        4096,
        4096,  # a tie goes up: no eval example is dropped
    )
    text = fit_text(config, sizes, 8192, "v3:64x64")
    assert "\n" not in text
    assert text.startswith("mesh data=2048,model=4 on v3:64x64: train.eval_batch_size=3072")
    assert "nearest valid: 2048 or 4096 (--config.train.eval_batch_size=4096)" in text
    # data must divide gcd(2048, 3072) = 1024: model=8 is the nearest mesh keeping both.
    assert "keep the batches on mesh data=1024,model=8 or data=512,model=16" in text
    assert suggest(config, sizes, 8192) == {"config.train.eval_batch_size": "4096"}


def test_maskrcnn_train_batch_on_4096_chips_keeps_the_batch_by_changing_the_mesh():
    config = maskrcnn_config("mlperf_v07")  # GBS 256, model=8 (spatial)
    sizes = {"data": 512, "model": 8}
    assert [p.name for p in problems(config, 512)] == [
        "train.global_batch_size",
        "train.eval_batch_size",
    ]
    assert mesh_proposals(config, 4096)[0] == {"data": 256, "model": 16}
    assert suggest(config, sizes, 4096) == {"mesh": "data=256,model=16"}
    # Two slices of 2048: the mesh flag names one slice's data size (data spans slices).
    assert suggest(config, {"data": 1024, "model": 4}, 4096, slices=2) == {
        "mesh": "data=128,model=16"
    }
    text = fit_text(config, {"data": 1024, "model": 4}, 4096, "v5e:16x32 x 2 slices", 2)
    assert "keep the batches on mesh data=128,model=16 or " in text
    assert text.endswith(" per slice (x 2 slices).")


def test_microbatches_multiply_the_train_batch_multiple():
    config = bert_config("tiny")
    config.train.update(global_batch_size=100, eval_batch_size=64, microbatches=4)
    (p,) = problems(config, 8)
    assert (p.multiple, p.below, p.above) == (32, 96, 128)
    assert "x microbatches" in fit_text(config, {"data": 8, "model": 1}, 8, "here")


def test_batches_that_split_give_no_line():
    config = bert_config("mlperf_v07")
    use_slices(config, 2)
    assert fit_text(config, {"data": 128, "model": 4}, 512, "v5e:16x16 x 2 slices", 2) == ""
    assert suggest(config, {"data": 128, "model": 4}, 512, 2) == {}


def test_inspect_says_so_in_one_line_before_building_anything():
    config = bert_config("tiny")
    config.mesh.ici_shape = (8, 1)
    config.train.eval_batch_size = 12
    with pytest.raises(ConfigError) as e:
        inspect_config(config)
    message = str(e.value)
    assert "\n" not in message
    assert "train.eval_batch_size=12 is not a multiple of 8" in message
    assert "nearest valid: 8 or 16" in message
    assert "data=4,model=2" in message  # 12 splits over data=4


def test_plan_note_on_a_named_topology():
    """launch.plan prints this before its compiles (libtpu describes the devices)."""
    config = transformer_config("mlperf_v07")
    assert topology_fit_text(config, "v3:64x64") == ""  # its eval batch 4096 splits
    config.train.eval_batch_size = 3072
    text = topology_fit_text(config, "v3:64x64")
    assert "v3:64x64" in text and "nearest valid: 2048 or 4096" in text
    assert topology_fit_text(bert_config("mlperf_v07"), "v5e:16x16", slices=2) == ""


@pytest.mark.parametrize(
    ("model", "generation", "topology", "slices", "overrides"),
    [
        ("bert", "v3", "v3:64x64", 1, ()),
        ("transformer", "v3", "v3:64x64", 1, ()),  # its eval batch 4096 splits over 2048
        ("ssd", "v3", "v3:32x64", 1, ()),
        ("maskrcnn", "v3", "v3:16x32", 1, ()),
        ("maskrcnn", "v4", "v4:16x16x16", 1, (("mesh", "data=256,model=16"),)),
        ("bert", "v5e", "v5e:16x16", 2, ()),
        ("transformer", "v6e", "v6e:16x16", 2, ()),
    ],
)
def test_tpu_table_rows_use_the_published_scale_and_the_nearest_valid_batch(
    model, generation, topology, slices, overrides
):
    spec = row_spec(model, generation)
    assert (spec.topology, spec.slices, spec.overrides) == (topology, slices, overrides)
    command = spec.command("python")
    assert command[:5] == [
        "python",
        "-m",
        "launch.inspect",
        f"--config=configs/{model}.py:mlperf_v07",
        f"--topology={topology}",
    ]
    assert [f"--{k}={v}" for k, v in overrides] == command[7:-1]
    assert bool(spec.note) == bool(overrides)
