"""launch.bench.peers: one round of each comparison at small sizes (no timing asserted)."""

from __future__ import annotations

import math
import mmap

import pytest

from launch.bench import peer_ceiling
from launch.bench import peers as bp
from parallel.hlo_counts import hlo_flops

BERT = bp.BertSize("test", 96, 32, 1, 4, 64, 16, 4, 8, 0.0)
TRANSFORMER = bp.TransformerSize("test", 128, 32, 4, 1, 64, 16, 8, 0.0)


@pytest.fixture(scope="module")
def bert_sides():
    return {
        "ours": bp.ours_bert_step(BERT, einsum_gather=False),
        "hf_bert": bp.hf_bert_step(BERT),
        "hf_bert_gathered": bp.hf_bert_step(BERT, gathered_head=True),
    }


@pytest.mark.xdist_group("bench_peers")
def test_bert_sides_train_the_same_task(bert_sides):
    # From a small random init both predict ~uniformly: MLM + NSP loss ~ ln V + ln 2.
    chance = math.log(BERT.vocab_size) + math.log(2)
    losses = {name: step() for name, step in bert_sides.items()}
    for name, loss in losses.items():
        assert loss == pytest.approx(chance, rel=0.05), name
    # A second step on the same batch lowers the loss on every side: they all train.
    for name, step in bert_sides.items():
        assert step() < losses[name], name


@pytest.mark.xdist_group("bench_peers")
def test_our_bert_with_the_last_layer_rows_trains_alike():
    """--peer_last_layer_rows builds our side with the flag: the same first two losses."""
    full = bp.ours_bert_step(BERT, einsum_gather=False)
    rows = bp.ours_bert_step(BERT, einsum_gather=False, last_layer_rows=True)
    first, second = full(), full()
    assert rows() == pytest.approx(first, rel=1e-5)
    assert rows() == pytest.approx(second, rel=1e-5)


def test_warm_up_lasts_while_a_side_grows_the_process_memory():
    """A side whose first three rounds grow the process's resident memory (a heap still
    growing) keeps the warm-up going; a settled pair of sides gets the one warm-up round
    asked for; the warm-up never passes its bound."""
    calls = {"growing": 0}
    kept = []

    def growing():
        calls["growing"] += 1
        if calls["growing"] <= 3:  # 8 MiB more resident memory, kept
            # Fresh anonymous pages, written: an array could reuse freed heap that is
            # already resident (glibc raises its mmap threshold after large frees).
            pages = mmap.mmap(-1, 8 << 20)
            pages.write(b"\x01" * (8 << 20))
            kept.append(pages)

    def settled():
        return None

    rates, warmed = bp.alternate({"a": settled, "b": growing}, 1, rounds=2, steps=1, warmup=1)
    assert warmed == 3 and [len(r) for r in rates.values()] == [2, 2]
    rates, warmed = bp.alternate({"a": settled, "b": settled}, 1, rounds=2, steps=1, warmup=1)
    assert warmed == 1
    calls["growing"] = -10  # more memory every round from here on
    rates, warmed = bp.alternate({"b": growing}, 1, rounds=1, steps=1, warmup=0, max_warmup=2)
    assert warmed == 2 and len(rates["b"]) == 1


@pytest.mark.xdist_group("bench_peers")
def test_bert_one_round_table(bert_sides):
    peak = {"jax": 2e11, "torch": 1e11}
    rows = bp.compare("bert:test", bert_sides, BERT.batch_size, 1, 1, warmup=0, peak=peak)
    assert [r["peer"] for r in rows] == ["hf_bert", "hf_bert_gathered"]
    flops = bert_sides["ours"].flops_per_example
    for r in rows:
        assert r["ours_samples_per_s"] > 0 and r["peer_samples_per_s"] > 0
        assert r["ratio"] == pytest.approx(r["ours_samples_per_s"] / r["peer_samples_per_s"])
        assert all(len(v) == 1 for v in r["rounds"].values())
        # MFU against the faster library's peak; the ceiling is that peak over the peer.
        assert r["ours_mfu"] == pytest.approx(r["ours_samples_per_s"] * flops / 2e11)
        assert r["peer_mfu"] == pytest.approx(r["peer_samples_per_s"] * flops / 2e11)
        assert r["ceiling"] == pytest.approx(1 / r["peer_mfu"])
    text = bp.table(rows)
    assert "bert:test" in text and "hf_bert_gathered" in text
    assert f"{rows[1]['ceiling']:.2f}x" in text.splitlines()[2]
    # Without a peak (or with --peer_last_layer_rows) the rows have no MFU columns.
    bare = bp.compare("bert:test", bert_sides, BERT.batch_size, 1, 1, warmup=0)
    assert "ceiling" not in bare[0] and "%" not in bp.table(bare)


@pytest.mark.xdist_group("bench_peers")
def test_model_flops_are_the_compiled_steps_matmul_flops(bert_sides):
    """The MFU numerator, the task's analytic FLOPs per example, is what the compiled
    step's dots do (within the small products the formula leaves out: pooler, biases)."""
    transformer = bp.ours_transformer_step(TRANSFORMER)
    for step, batch in ((bert_sides["ours"], BERT.batch_size), (transformer, 8)):
        dots = hlo_flops(step.compiled.as_text(), matmul_only=True)
        assert step.flops_per_example * batch == pytest.approx(dots, rel=0.05)


def test_matmul_peak_is_measured_by_both_libraries_in_the_compute_dtype():
    for dtype in ("float32", "bfloat16"):
        peak = peer_ceiling.matmul_peak(dtype)
        assert set(peak) == {"jax", "torch"} and min(peak.values()) > 1e8, dtype
    row = {"ours_samples_per_s": 30.0, "peer_samples_per_s": 20.0}
    peer_ceiling.add_utilisation(row, 1e9, {"jax": 8e10, "torch": 1e11})
    assert row["ours_mfu"] == pytest.approx(0.3) and row["peer_mfu"] == pytest.approx(0.2)
    assert row["ceiling"] == pytest.approx(5.0)


@pytest.mark.xdist_group("bench_peers")
def test_transformer_one_round():
    ours = bp.ours_transformer_step(TRANSFORMER)
    peer = bp.torch_transformer_step(TRANSFORMER)
    # Ours reports the smoothed loss minus the soft targets' entropy (0 = perfect).
    v, s = TRANSFORMER.vocab_size, 0.1
    entropy = -((1 - s) * math.log(1 - s) + s * math.log(s / (v - 1)))
    ours_loss, peer_loss = ours(), peer()
    assert ours_loss + entropy == pytest.approx(peer_loss, rel=0.05)
    assert peer_loss == pytest.approx(math.log(v), rel=0.05)
    rows = bp.compare("transformer:test", {"ours": ours, "torch": peer}, 8, 1, 1, warmup=0)
    assert rows[0]["peer"] == "torch" and rows[0]["ratio"] > 0


@pytest.mark.xdist_group("bench_peers")
def test_bf16_sides_train_the_same_task():
    """--peer_dtype bfloat16: ours in bf16 compute, torch under CPU autocast; both start
    at chance and train, and the rows say bf16."""
    chance = math.log(BERT.vocab_size) + math.log(2)
    sides = {
        "ours": bp.ours_bert_step(BERT, einsum_gather=False, dtype="bfloat16"),
        "hf_bert_gathered": bp.hf_bert_step(BERT, gathered_head=True, dtype="bfloat16"),
    }
    for name, step in sides.items():
        first = step()
        assert first == pytest.approx(chance, rel=0.05), name
        assert step() < first, name
    peer = bp.torch_transformer_step(TRANSFORMER, dtype="bfloat16")
    assert peer() == pytest.approx(math.log(TRANSFORMER.vocab_size), rel=0.05)
    assert bp._label("bert", "base", "bfloat16") == "bert:base bf16"
    assert bp._label("bert", "base", "float32") == "bert:base"


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown peer dtype 'float16'"):
        bp.run_peers(["bert"], ["tiny"], 1, 1, False, dtype="float16")


def test_unknown_sizes_and_models_are_clear_errors():
    with pytest.raises(ValueError, match="unknown peer sizes"):
        bp.run_peers(["bert"], ["huge"], 1, 1, False)
    with pytest.raises(ValueError, match="unknown peer model"):
        bp.run_peers(["resnet"], ["tiny"], 1, 1, False)
