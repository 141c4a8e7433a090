"""Distributed corpus BLEU from sacrebleu's sufficient statistics.

Corpus BLEU is not an average of sentence scores, but it is a function of sums over
sentences: hypothesis length, closest reference length, and n-gram matches and totals
for n = 1..4. Each host turns its own decoded sentences into those ten integers, the
hosts' vectors are summed, and BLEU is computed once from the sums with sacrebleu's
own formula. Integer sums are exact, so the score equals `sacrebleu.corpus_bleu` on
the gathered outputs whatever the number of hosts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sacrebleu.metrics import BLEU

MAX_ORDER = 4
NUM_STATS = 2 + 2 * MAX_ORDER  # sys_len, ref_len, correct[4], total[4]: sacrebleu's order


def bleu_stats(hypotheses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """Summed sufficient statistics [10] (int64) of hypothesis/reference pairs (13a
    tokenisation, cased: sacrebleu's defaults)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        return np.zeros(NUM_STATS, np.int64)
    # sacrebleu's per-sentence statistics; the same ones corpus_score sums.
    per_sentence = BLEU()._extract_corpus_statistics(list(hypotheses), [list(references)])
    return np.asarray(per_sentence, np.int64).sum(axis=0)


def summed_stats(stats: np.ndarray) -> np.ndarray:
    """BLEU statistics [10] from [10] or per host [hosts, 10], checked."""
    s = np.asarray(stats, np.int64)
    if s.ndim == 2:
        s = s.sum(axis=0)
    if s.shape != (NUM_STATS,):
        raise ValueError(f"BLEU statistics must have {NUM_STATS} entries, got shape {s.shape}")
    return s


def bleu_from_stats(stats: np.ndarray) -> dict[str, float]:
    """Corpus BLEU (0-100) and its parts from summed statistics [10] (or [hosts, 10])."""
    s = summed_stats(stats)
    score = BLEU.compute_bleu(
        correct=[int(x) for x in s[2 : 2 + MAX_ORDER]],
        total=[int(x) for x in s[2 + MAX_ORDER :]],
        sys_len=int(s[0]),
        ref_len=int(s[1]),
    )
    return {
        "bleu": float(score.score),
        "bleu_bp": float(score.bp),
        "bleu_sys_len": int(s[0]),
        "bleu_ref_len": int(s[1]),
    }
