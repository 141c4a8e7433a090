"""BLEU as the MLPerf v0.7 Transformer reference defines its target (`eval.bleu=mlperf_v07`).

The reference stops when the *uncased* BLEU of its translations of newstest2014 exceeds
25.0: both sides lowercased, tokenised with the international (mteval-v14 style)
tokenizer below, corpus BLEU up to 4-grams with the brevity penalty, x 100. It differs
from SacreBLEU (13a tokenisation, cased, its own smoothing) in the tokenisation, the case
and the smoothing: an n-gram order with no match scores 1 / (2^k x candidates) for the
k-th such order instead of zeroing the score.

Corpus BLEU is a function of sums over sentences (the same ten integers as bleu.py:
hypothesis length, reference length, matches and candidates per order), so hosts sum
their statistics and the score is computed once, whatever the number of hosts.
"""

from __future__ import annotations

import collections
import functools
import math
import re
import sys
import unicodedata
from collections.abc import Sequence

import numpy as np

from mlperf.transformer.bleu import MAX_ORDER, NUM_STATS, summed_stats

# The same statistics as sacrebleu's (bleu.py): sys_len, ref_len, matches[4], candidates[4].


@functools.cache
def _patterns() -> tuple[re.Pattern, re.Pattern, re.Pattern]:
    """Punctuation (Unicode P*) and symbol (S*) classes of every code point below
    sys.maxunicode, as the reference builds them (about a second, once).

    The reference pastes the characters into a regex class unescaped, so its class
    differs from P* in one place: the backslash escapes the `]` after it and is itself
    not punctuation there. That is kept, so that scores match the reference's."""

    def chars(prefix: str) -> str:
        return "".join(
            re.escape(chr(x))
            for x in range(sys.maxunicode)
            if unicodedata.category(chr(x)).startswith(prefix) and chr(x) != "\\"
        )

    punct = chars("P")
    return (
        re.compile(r"([^\d])([" + punct + r"])"),
        re.compile(r"([" + punct + r"])([^\d])"),
        re.compile("([" + chars("S") + "])"),
    )


def tokenize(text: str) -> list[str]:
    """Splits punctuation from non-digits on both sides and symbols everywhere, then
    splits on whitespace (a '.' or ',' between two digits stays inside the number)."""
    nondigit_punct, punct_nondigit, symbol = _patterns()
    text = nondigit_punct.sub(r"\1 \2 ", text)
    text = punct_nondigit.sub(r" \1 \2", text)
    text = symbol.sub(r" \1 ", text)
    return text.split()


def _ngrams(tokens: Sequence[str]) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for n in range(1, MAX_ORDER + 1):
        for i in range(len(tokens) - n + 1):
            counts[tuple(tokens[i : i + n])] += 1
    return counts


def bleu_stats(
    hypotheses: Sequence[str], references: Sequence[str], case_sensitive: bool = False
) -> np.ndarray:
    """Summed statistics [10] (int64) of hypothesis/reference pairs (uncased by default,
    as the reference's target)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    stats = np.zeros(NUM_STATS, np.int64)
    for hyp, ref in zip(hypotheses, references, strict=True):
        if not case_sensitive:
            hyp, ref = hyp.lower(), ref.lower()
        h, r = tokenize(hyp), tokenize(ref)
        stats[0] += len(h)
        stats[1] += len(r)
        h_counts, r_counts = _ngrams(h), _ngrams(r)
        for gram, count in h_counts.items():
            order = len(gram) - 1
            stats[2 + MAX_ORDER + order] += count
            stats[2 + order] += min(count, r_counts.get(gram, 0))
    return stats


def bleu_from_stats(stats: np.ndarray) -> dict[str, float]:
    """BLEU (0-100) and its parts from summed statistics [10] (or [hosts, 10])."""
    s = summed_stats(stats)
    sys_len, ref_len = int(s[0]), int(s[1])
    matches, candidates = s[2 : 2 + MAX_ORDER], s[2 + MAX_ORDER :]
    precisions = []
    smooth = 1.0
    for m, c in zip(matches.tolist(), candidates.tolist(), strict=True):
        if c == 0:
            precisions.append(0.0)
        elif m > 0:
            precisions.append(m / c)
        else:
            smooth *= 2.0
            precisions.append(1.0 / (smooth * c))
    geo_mean = 0.0
    if max(precisions) > 0:
        geo_mean = math.exp(sum(math.log(p) for p in precisions if p) / MAX_ORDER)
    if ref_len == 0:
        bp = 1.0
    else:
        ratio = sys_len / ref_len
        bp = 0.0 if ratio <= 0.0 else (1.0 if ratio >= 1.0 else math.exp(1.0 - 1.0 / ratio))
    return {
        "bleu": 100.0 * geo_mean * bp,
        "bleu_bp": bp,
        "bleu_sys_len": sys_len,
        "bleu_ref_len": ref_len,
    }
