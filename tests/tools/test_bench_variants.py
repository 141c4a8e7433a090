"""launch.bench.variants: variant overrides parsed and applied (bad keys named), a row per
variant with the baseline's first losses for a speed-only change, and the CLI's one-line
errors."""

from __future__ import annotations

import pytest
from conftest import assert_bench_usage_error, small_bert_config

from launch.bench import variants as bench_variants


def test_parse_variant_reads_literals_and_names_a_bad_item():
    assert bench_variants.parse_variant("model.remat=True,data.x=abc,train.steps=5") == {
        "model.remat": True,
        "data.x": "abc",
        "train.steps": 5,
    }
    for bad in ("model.remat", "=3", ""):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            bench_variants.parse_variant(bad)


def test_apply_overrides_copies_and_names_a_missing_key():
    config = small_bert_config()
    changed = bench_variants.apply_overrides(config, {"model.num_layers": 2})
    assert changed.model.num_layers == 2 and config.model.num_layers == 1
    with pytest.raises(ValueError, match="model.no_such_key: the config has no key"):
        bench_variants.apply_overrides(config, {"model.no_such_key": 1})
    with pytest.raises(ValueError, match="nope.x: the config has no section 'nope'"):
        bench_variants.apply_overrides(config, {"nope.x": 1})


def test_bench_times_the_baseline_and_each_variant_in_turns():
    config = small_bert_config(**{"mesh.ici_shape": (8, 1), "model.num_layers": 2})
    rows = bench_variants.bench(
        config, ["model.last_layer_head_positions_only=True"], steps=3, rounds=2
    )
    assert [r["variant"] for r in rows] == [
        "baseline",
        "model.last_layer_head_positions_only=True",
    ]
    assert rows[0]["vs_baseline"] == pytest.approx(1.0)
    for r in rows:
        assert len(r["rounds"]) == 2 and all(x > 0 for x in r["rounds"])
        assert len(r["first_losses"]) == 3
    # A speed-only change trains the same first steps.
    assert rows[1]["first_losses"] == pytest.approx(rows[0]["first_losses"], rel=1e-4)
    assert bench_variants.table(rows).count("\n") == 3


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config", "configs/bert.py:tiny"], "give at least one --change"),
        (
            ["--config", "configs/bert.py:tiny", "--change", "model.nope=1"],
            "model.nope: the config has no key 'nope'",
        ),
        (
            ["--config", "configs/bert.py:tiny", "--change", "data.read_threads=-2"],
            "data.read_threads=-2",
        ),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args, message):
    assert_bench_usage_error(["variants", *args], message)
