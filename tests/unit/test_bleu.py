"""Distributed BLEU: summing per-host sufficient statistics gives sacrebleu's corpus BLEU
exactly, however the sentences are split over hosts; the task's host hook and finalize
agree with sacrebleu on decoded text."""

from __future__ import annotations

import numpy as np
import pytest
import sacrebleu

from mlperf.transformer.bleu import NUM_STATS, bleu_from_stats, bleu_stats

REFS = [
    "Ein Mann fährt mit dem Fahrrad durch die Stadt.",
    "Zwei Hunde spielen im Schnee.",
    "Eine Frau liest ein Buch im Park.",
    "Kinder spielen Fußball auf einer Wiese.",
    "Ein Mädchen in einem roten Kleid tanzt.",
    "Ein älterer Mann sitzt auf einer Bank.",
    "Leute warten an einer Bushaltestelle.",
]
HYPS = [
    "Ein Mann fährt Fahrrad durch die Stadt.",
    "Zwei Hunde spielen im Schnee.",
    "Eine Frau liest im Park ein Buch.",
    "Kinder spielen auf einer Wiese.",
    "Ein Mädchen tanzt in einem roten Kleid.",
    "Ein alter Mann sitzt auf der Bank.",
    "Menschen warten an der Haltestelle.",
]


def test_summed_statistics_equal_sacrebleu_corpus_bleu():
    want = sacrebleu.corpus_bleu(HYPS, [REFS])
    stats = bleu_stats(HYPS, REFS)
    assert stats.shape == (NUM_STATS,) and stats.dtype == np.int64
    got = bleu_from_stats(stats)
    assert got["bleu"] == want.score  # exact, not approximately
    assert (got["bleu_sys_len"], got["bleu_ref_len"]) == (want.sys_len, want.ref_len)
    assert 0.0 < got["bleu"] < 100.0


@pytest.mark.parametrize("hosts", [2, 3, 4])
def test_any_split_over_hosts_gives_the_same_bleu(hosts):
    rng = np.random.default_rng(hosts)
    owner = rng.integers(0, hosts, len(HYPS))
    per_host = np.stack(
        [
            bleu_stats(
                [h for h, o in zip(HYPS, owner, strict=True) if o == k],
                [r for r, o in zip(REFS, owner, strict=True) if o == k],
            )
            for k in range(hosts)
        ]
    )
    assert per_host.shape == (hosts, NUM_STATS)
    assert bleu_from_stats(per_host)["bleu"] == sacrebleu.corpus_bleu(HYPS, [REFS]).score
    # Averaging per-host BLEU scores would be wrong; the sums are what make it exact.
    scores = [bleu_from_stats(s)["bleu"] for s in per_host if s[0] > 0]
    assert len(scores) > 1


def test_empty_host_contributes_zeros_and_bad_shapes_are_errors():
    assert np.all(bleu_stats([], []) == 0)
    with pytest.raises(ValueError, match="hypotheses"):
        bleu_stats(["a"], [])
    with pytest.raises(ValueError, match="entries"):
        bleu_from_stats(np.zeros(7, np.int64))


class _Vocab:
    """A stand-in for the sentencepiece processor: id -> word (ids past the table dropped)."""

    words = ["<pad>", "</s>", "<unk>", *sorted({w for s in HYPS for w in s.split()})]

    def get_piece_size(self) -> int:
        return len(self.words)

    def decode(self, ids) -> str:
        return " ".join(self.words[i] for i in ids)

    def encode_sentence(self, s: str) -> list[int]:
        return [self.words.index(w) for w in s.split()] + [1]


def test_task_host_stats_and_finalize_match_sacrebleu_on_decoded_rows():
    from configs.transformer import get_config
    from input_pipeline.translation_data import TranslationData
    from mlperf.transformer.task import TransformerTask

    vocab = _Vocab()
    task = TransformerTask(
        get_config("tiny"),
        TranslationData(
            vocab=vocab,
            vocab_size=vocab.get_piece_size(),
            train_rows=None,
            eval_records=None,
            references={100 + i: r for i, r in enumerate(REFS)},
            eval_length=16,
            num_eval_examples=len(REFS),
            summaries={},
        ),
    )
    width = 16
    # Two host batches of 4 rows; the last row is padding (mask 0) with junk tokens.
    tokens = np.full((8, width), 7, np.int32)
    for i, h in enumerate(HYPS):
        ids = vocab.encode_sentence(h)
        tokens[i] = 0
        tokens[i, : len(ids)] = ids
        tokens[i, len(ids) :] = 5  # tokens after EOS are ignored
    index = np.asarray([100 + i for i in range(7)] + [0], np.int32)
    mask = np.asarray([1.0] * 7 + [0.0], np.float32)
    outputs = [{"tokens": tokens[:4]}, {"tokens": tokens[4:]}]
    batches = [{"index": index[:4], "mask": mask[:4]}, {"index": index[4:], "mask": mask[4:]}]
    stats = task.host_eval_stats(outputs, batches)
    sums = {"nll_sum": 1.0, "tokens": 2, "correct": 1, "examples": 7}
    sums["bleu_stats"] = stats["bleu_stats"][None]  # one data shard
    metrics = task.finalize_eval(sums)
    want = sacrebleu.corpus_bleu(HYPS, [REFS]).score
    assert metrics["bleu"] == want
    assert metrics["bleu_fraction"] == want / 100.0
