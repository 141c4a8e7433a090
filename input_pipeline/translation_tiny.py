"""An embedded English -> German translation task that needs no download (the `tiny` data).

Sentences come from a small seeded grammar over real English and German words, and the
German side follows real German rules a model has to learn: noun gender picks the
article (der/die/das), the case changes it (accusative `den`, dative `dem`/`der` after
prepositions), adjectives take an ending that depends on case and gender, and a leading
adverb triggers verb-second inversion ("today the dog sees ..." -> "heute sieht der
hund ..."). A tiny Transformer learns it in a few hundred steps on a CPU, which makes it
a real (if small) translation benchmark: BLEU measures it the same way as on WMT.
"""

from __future__ import annotations

import os

import numpy as np

# english, german, gender (m/f/n)
NOUNS = (
    ("dog", "hund", "m"),
    ("cat", "katze", "f"),
    ("house", "haus", "n"),
    ("man", "mann", "m"),
    ("woman", "frau", "f"),
    ("child", "kind", "n"),
    ("bird", "vogel", "m"),
    ("ball", "ball", "m"),
    ("car", "auto", "n"),
    ("tree", "baum", "m"),
    ("flower", "blume", "f"),
    ("book", "buch", "n"),
    ("girl", "mädchen", "n"),
    ("boy", "junge", "m"),
    ("horse", "pferd", "n"),
    ("street", "straße", "f"),
    ("garden", "garten", "m"),
    ("table", "tisch", "m"),
    ("apple", "apfel", "m"),
    ("window", "fenster", "n"),
)
ADJECTIVES = (
    ("big", "groß"),
    ("small", "klein"),
    ("red", "rot"),
    ("old", "alt"),
    ("green", "grün"),
    ("happy", "glücklich"),
    ("black", "schwarz"),
    ("white", "weiß"),
)
VERBS = (
    ("sees", "sieht"),
    ("finds", "findet"),
    ("likes", "mag"),
    ("holds", "hält"),
    ("buys", "kauft"),
    ("draws", "zeichnet"),
    ("carries", "trägt"),
    ("watches", "beobachtet"),
)
PREPOSITIONS = (("in", "in"), ("near", "neben"), ("under", "unter"), ("behind", "hinter"))
ADVERBS = (("today", "heute"), ("now", "jetzt"), ("often", "oft"))

# Definite articles by case and gender.
_ARTICLE = {
    "nom": {"m": "der", "f": "die", "n": "das"},
    "acc": {"m": "den", "f": "die", "n": "das"},
    "dat": {"m": "dem", "f": "der", "n": "dem"},
}


def _adjective_ending(case: str, gender: str) -> str:
    """Weak adjective ending after a definite article."""
    if case == "nom" or (case == "acc" and gender != "m"):
        return "e"
    return "en"


def _noun_phrase(rng: np.random.Generator, case: str) -> tuple[list[str], list[str]]:
    en, de, gender = NOUNS[rng.integers(len(NOUNS))]
    src, tgt = ["the"], [_ARTICLE[case][gender]]
    if rng.random() < 0.5:
        adj_en, adj_de = ADJECTIVES[rng.integers(len(ADJECTIVES))]
        src.append(adj_en)
        tgt.append(adj_de + _adjective_ending(case, gender))
    return src + [en], tgt + [de]


def sentence_pair(rng: np.random.Generator) -> tuple[str, str]:
    """One random (english, german) sentence pair."""
    subj_en, subj_de = _noun_phrase(rng, "nom")
    verb_en, verb_de = VERBS[rng.integers(len(VERBS))]
    obj_en, obj_de = _noun_phrase(rng, "acc")
    src = subj_en + [verb_en] + obj_en
    tgt_tail = obj_de
    if rng.random() < 0.5:
        prep_en, prep_de = PREPOSITIONS[rng.integers(len(PREPOSITIONS))]
        pp_en, pp_de = _noun_phrase(rng, "dat")
        src += [prep_en] + pp_en
        tgt_tail = obj_de + [prep_de] + pp_de
    if rng.random() < 0.3:
        adv_en, adv_de = ADVERBS[rng.integers(len(ADVERBS))]
        src = [adv_en] + src
        tgt = [adv_de, verb_de] + subj_de + tgt_tail  # verb second
    else:
        tgt = subj_de + [verb_de] + tgt_tail
    return " ".join(src) + ".", " ".join(tgt) + "."


def write_tiny_corpus(out_dir: str, num_train: int, num_eval: int, seed: int) -> dict[str, str]:
    """Writes train.{en,de} and eval.{en,de} (line-aligned) under out_dir; returns their
    paths keyed "train_src", "train_tgt", "eval_src", "eval_tgt". Eval pairs are drawn
    from another seed stream and never equal a training pair."""
    rng = np.random.default_rng([seed, 0])
    train = [sentence_pair(rng) for _ in range(num_train)]
    seen = {p[0] for p in train}
    eval_rng = np.random.default_rng([seed, 1])
    evals: list[tuple[str, str]] = []
    while len(evals) < num_eval:
        pair = sentence_pair(eval_rng)
        if pair[0] not in seen:
            seen.add(pair[0])
            evals.append(pair)
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for split, pairs in (("train", train), ("eval", evals)):
        for side, lang, col in (("src", "en", 0), ("tgt", "de", 1)):
            path = os.path.join(out_dir, f"{split}.{lang}")
            tmp = f"{path}.tmp.{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(p[col] + "\n" for p in pairs)
            os.replace(tmp, path)
            paths[f"{split}_{side}"] = path
    return paths
