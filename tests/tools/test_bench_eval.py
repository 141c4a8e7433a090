"""launch.bench.eval: rows for each chunk count on a small BERT, the same hits for each,
and the CLI's one-line errors."""

from __future__ import annotations

import pytest
from conftest import assert_bench_usage_error, small_bert_config

from launch.bench import eval as bench_eval
from mlperf.validate import ConfigError


def test_parse_chunks_reads_positive_integers_and_names_a_bad_one():
    assert bench_eval.parse_chunks(["1", "32"]) == [1, 32]
    for bad in (["0"], ["x"], ["1", "-4"], []):
        with pytest.raises(ValueError, match="positive integers|at least one"):
            bench_eval.parse_chunks(bad)


def test_bench_times_each_chunk_count_on_the_same_metrics():
    config = small_bert_config(**{"mesh.ici_shape": (8, 1)})
    rows = bench_eval.bench(config, [1, 2], rounds=1)
    assert [r["chunks"] for r in rows] == [1, 2]
    assert rows[0]["speedup"] == pytest.approx(1.0)
    assert rows[0]["mlm_correct"] == rows[1]["mlm_correct"]
    for r in rows:
        assert r["seconds"] > 0 and r["eval_examples"] > 0
        assert r["examples_per_s"] == pytest.approx(r["eval_examples"] / r["seconds"])
    text = bench_eval.table(rows)
    assert "| bert:tiny | 2 |" in text and text.count("\n") == 3


def test_bench_refuses_a_config_without_the_setting():
    from configs.transformer import get_config

    with pytest.raises(ConfigError, match="no model.eval_head_chunks"):
        bench_eval.bench(get_config("tiny"), [1, 2], rounds=1)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--config", "configs/bert.py:tiny", "--eval_chunks", "1,x"],
            "--eval_chunks: chunk count 'x'",
        ),
        (["--config", "configs/transformer.py:tiny"], "no model.eval_head_chunks"),
        (["--config", "configs/bert.py:tiny", "--eval_chunks", "1,7"], "eval_head_chunks=7"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args, message):
    assert_bench_usage_error(["eval", *args], message)
