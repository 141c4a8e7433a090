"""BERT pretraining examples (masked LM + next sentence), re-implementing the algorithm of
Google's create_pretraining_data: documents of tokenised sentences are packed into
`[CLS] A [SEP] B [SEP]` pairs, half of them with a random B, then 15% of the tokens masked.

Deviation: the "random token" replacement draws from the non-special vocab ids (Google's
draws from the whole vocab, including [PAD]/[CLS]/...).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from input_pipeline.input_errors import InputError
from input_pipeline.tokenizer import SpecialIds

Document = list[list[int]]  # a document is a list of sentences of token ids


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """The knobs of create_pretraining_data."""

    seq_length: int = 128
    max_predictions: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 1


def feature_spec(seq_length: int, max_predictions: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, dtype) of one example's features."""
    return {
        "input_ids": ((seq_length,), "int32"),
        "input_mask": ((seq_length,), "int32"),
        "segment_ids": ((seq_length,), "int32"),
        "masked_lm_positions": ((max_predictions,), "int32"),
        "masked_lm_ids": ((max_predictions,), "int32"),
        "masked_lm_weights": ((max_predictions,), "float32"),
        "next_sentence_labels": ((), "int32"),
    }


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: np.random.Generator) -> None:
    """Trims the longer of a, b until they fit, from the front or back at random (in place).

    Random ends (rather than always the back) avoid biasing the model towards sentence starts.
    """
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def _pairs_from_document(
    documents: Sequence[Document], doc_index: int, cfg: MaskingConfig, rng: np.random.Generator
) -> Iterator[tuple[list[int], list[int], bool]]:
    """Yields (tokens_a, tokens_b, is_random_next) segment pairs from one document."""
    document = documents[doc_index]
    max_tokens = cfg.seq_length - 3  # room for [CLS], [SEP], [SEP]
    # Mostly fill the sequence; sometimes use a shorter one so fine-tuning on short inputs
    # does not meet an unseen length distribution.
    target_length = max_tokens
    if rng.random() < cfg.short_seq_prob:
        target_length = int(rng.integers(2, max_tokens + 1))

    chunk: list[list[int]] = []
    chunk_length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target_length:
            a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
            tokens_a = [t for sentence in chunk[:a_end] for t in sentence]
            tokens_b: list[int] = []
            is_random_next = len(chunk) == 1 or rng.random() < 0.5
            if is_random_next:
                target_b_length = target_length - len(tokens_a)
                # Ten tries to find another document; a one-document corpus gives up.
                for _ in range(10):
                    random_index = int(rng.integers(0, len(documents)))
                    if random_index != doc_index:
                        break
                random_doc = documents[random_index]
                start = int(rng.integers(0, len(random_doc)))
                for sentence in random_doc[start:]:
                    tokens_b.extend(sentence)
                    if len(tokens_b) >= target_b_length:
                        break
                # The unused sentences of this chunk go back for the next pair.
                i -= len(chunk) - a_end
            else:
                tokens_b = [t for sentence in chunk[a_end:] for t in sentence]
            _truncate_pair(tokens_a, tokens_b, max_tokens, rng)
            if tokens_a and tokens_b:
                yield tokens_a, tokens_b, is_random_next
            chunk = []
            chunk_length = 0
        i += 1


def _mask_tokens(
    tokens: np.ndarray,
    cfg: MaskingConfig,
    special: SpecialIds,
    random_vocab: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chooses masked positions; returns (masked tokens, sorted positions, original ids)."""
    candidates = np.flatnonzero((tokens != special.cls) & (tokens != special.sep))
    num_to_predict = min(cfg.max_predictions, max(1, round(len(tokens) * cfg.masked_lm_prob)))
    positions = np.sort(rng.permutation(candidates)[:num_to_predict])
    original = tokens[positions]
    # 80% [MASK], 10% a random token, 10% unchanged: the model must keep a representation
    # of every input token, not only of [MASK]s.
    decide = rng.random(len(positions))
    random_tokens = random_vocab[rng.integers(0, len(random_vocab), len(positions))]
    replacement = np.where(
        decide < 0.8, special.mask, np.where(decide < 0.9, random_tokens, original)
    )
    masked = tokens.copy()
    masked[positions] = replacement
    return masked, positions, original


def _to_example(
    tokens_a: list[int],
    tokens_b: list[int],
    is_random_next: bool,
    cfg: MaskingConfig,
    special: SpecialIds,
    random_vocab: np.ndarray,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    tokens = np.array([special.cls, *tokens_a, special.sep, *tokens_b, special.sep], dtype=np.int32)
    masked, positions, original = _mask_tokens(tokens, cfg, special, random_vocab, rng)
    n, p = len(tokens), len(positions)
    example = {
        name: np.zeros(shape, dtype)
        for name, (shape, dtype) in feature_spec(cfg.seq_length, cfg.max_predictions).items()
    }
    example["input_ids"][:n] = masked
    example["input_ids"][n:] = special.pad
    example["input_mask"][:n] = 1
    example["segment_ids"][len(tokens_a) + 2 : n] = 1
    example["masked_lm_positions"][:p] = positions
    example["masked_lm_ids"][:p] = original
    example["masked_lm_weights"][:p] = 1.0
    # As in BERT: label 1 = B is a random sentence, 0 = B is the actual next segment.
    example["next_sentence_labels"][()] = int(is_random_next)
    return example


def create_examples(
    documents: Sequence[Document],
    cfg: MaskingConfig,
    special: SpecialIds,
    vocab_size: int,
    seed: int,
) -> list[dict[str, np.ndarray]]:
    """All pretraining examples of the documents, shuffled; deterministic for a seed.

    Sentences with no tokens and documents with no sentences are dropped first.
    Runs dupe_factor passes over the documents, each with fresh pairs and masks.
    """
    if cfg.seq_length < 5:
        raise InputError(f"seq_length must be at least 5, got {cfg.seq_length}")
    rng = np.random.default_rng(seed)
    docs = [[list(s) for s in doc if len(s)] for doc in documents]
    docs = [doc for doc in docs if doc]
    if not docs:
        raise InputError("no tokenised documents to build examples from")
    order = rng.permutation(len(docs))
    docs = [docs[i] for i in order]
    special_set = {special.pad, special.unk, special.cls, special.sep, special.mask}
    random_vocab = np.array([i for i in range(vocab_size) if i not in special_set], np.int32)

    examples = []
    for _ in range(cfg.dupe_factor):
        for doc_index in range(len(docs)):
            for tokens_a, tokens_b, is_random in _pairs_from_document(docs, doc_index, cfg, rng):
                examples.append(
                    _to_example(tokens_a, tokens_b, is_random, cfg, special, random_vocab, rng)
                )
    order = rng.permutation(len(examples))
    return [examples[i] for i in order]
