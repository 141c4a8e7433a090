"""Fill [MASK] tokens and score next-sentence pairs with a trained BERT.

A sentence (or a pair, `first\\tsecond`) is tokenised with the run's WordPiece
vocabulary as the pretraining examples are: [CLS] a [SEP] (b [SEP]), segment ids 0 then
1, padded to the run's sequence length (its last phase's), its [MASK] positions the
masked-LM positions (at most the run's `max_predictions`). The model's two heads give the
top-k tokens at each mask with their probabilities (softmax over the vocabulary the
tokenizer has; rows padded for sharding never win) and P(second follows first)
(next-sentence label 0 = "is next", as in the pretraining data).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Sequence

import jax
import numpy as np
from ml_collections import ConfigDict

from input_pipeline import tokenizer as wordpiece
from mlperf.batch_inference import BatchRunner

MASK = "[MASK]"


class BadSentenceError(ValueError):
    """An input line the model cannot take (too long, too many masks, nothing to do)."""


def run_vocab_file(config: ConfigDict) -> str:
    """The WordPiece vocabulary the run trained with: data.vocab_file, or the one trained
    on its corpus, found in data.cache_dir by the corpus files' key as training found it
    (never trained or written here: a new one would not match the model)."""
    from input_pipeline import bert_data

    data = config.data
    if data.vocab_file:
        return bert_data._resolve(data.vocab_file, data.data_dir)
    cache_dir = os.path.abspath(os.path.expanduser(data.cache_dir or bert_data.DEFAULT_CACHE_DIR))
    missing = FileNotFoundError(
        f"the run's trained WordPiece vocabulary is not in data.cache_dir {cache_dir}; "
        "pass --vocab_file (the vocab.txt the run trained with)"
    )
    # The embedded corpus is written by training: without it there is no vocabulary (and
    # bert_data._train_files would write it).
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = os.path.join(cache_dir, "corpus", f"stdlib_docstrings_py{version}.txt")
    if data.corpus == "stdlib" and not os.path.isfile(stdlib):
        raise missing
    # The same cache key training used (bert_data._vocab_file).
    train_files = bert_data._train_files(data, cache_dir)
    key = bert_data._files_key(train_files, vocab_size=data.vocab_size, lowercase=data.lowercase)
    path = os.path.join(cache_dir, "vocab", f"wordpiece_{key}.txt")
    if not os.path.isfile(path):
        raise missing
    return path


def vocab_size_of(vocab_file: str, lowercase: bool = True) -> int:
    """Tokens in a WordPiece vocabulary: the rows of the model's table that are real."""
    return wordpiece.load_wordpiece(vocab_file, lowercase).get_vocab_size()


@dataclasses.dataclass(frozen=True)
class Candidate:
    token: str
    id: int
    probability: float


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One input line's results: per [MASK], the top-k candidates; for a pair, the
    probability that the second sentence follows the first."""

    text: str
    masks: tuple[tuple[Candidate, ...], ...]
    filled: str  # the line with every [MASK] replaced by its top candidate
    is_next: float | None  # None for a single sentence


@dataclasses.dataclass(frozen=True)
class Featurized:
    """A line as model inputs (one example, unbatched)."""

    example: dict[str, np.ndarray]
    num_masks: int
    is_pair: bool


def heads(top_k: int) -> Callable:
    """fn(model, batch) -> top-k masked-LM ids and probabilities at the masked positions,
    and the next-sentence probabilities."""

    def fn(model, batch):
        mlm_logits, nsp_logits = model(batch)
        probs, ids = jax.lax.top_k(jax.nn.softmax(mlm_logits, axis=-1), top_k)
        return {"top_ids": ids, "top_probs": probs, "nsp_probs": jax.nn.softmax(nsp_logits)}

    return fn


class MaskFiller:
    """A TrainedModel's BERT with the run's tokenizer."""

    def __init__(self, trained, vocab_file: str, top_k: int = 5):
        config = trained.config
        self.tokenizer = wordpiece.load_wordpiece(vocab_file, bool(config.data.lowercase))
        self.special = wordpiece.special_ids(self.tokenizer)
        last = trained.task.phases()[-1].data
        self.seq_length = int(last["seq_length"])
        self.max_masks = int(last["max_predictions"])
        vocab = trained.task.model_config().predictable_vocab_size
        self.top_k = max(1, min(top_k, vocab))
        self.runner = BatchRunner(trained, heads(self.top_k))

    def featurize(self, line: str) -> Featurized:
        """The model inputs of a line (`first` or `first\\tsecond`); BadSentenceError
        when it does not fit the run's sequence length or mask count."""
        parts = line.split("\t")
        if len(parts) > 2:
            raise BadSentenceError("more than one tab: give one sentence or a tab-separated pair")
        pieces = [self.tokenizer.encode(p, add_special_tokens=False).ids for p in parts]
        s = self.special
        ids, segments = [s.cls], [0]
        for segment, piece in enumerate(pieces):
            ids += [*piece, s.sep]
            segments += [segment] * (len(piece) + 1)
        if len(ids) > self.seq_length:
            raise BadSentenceError(
                f"{len(ids)} tokens with [CLS]/[SEP], more than the model's sequence length "
                f"{self.seq_length}"
            )
        positions = [i for i, t in enumerate(ids) if t == s.mask]
        if len(positions) > self.max_masks:
            raise BadSentenceError(
                f"{len(positions)} {MASK} tokens, more than the model's {self.max_masks} "
                "masked positions"
            )
        if not positions and len(parts) == 1:
            raise BadSentenceError(
                f"nothing to predict: no {MASK} token and no tab-separated sentence pair"
            )
        L, P = self.seq_length, self.max_masks
        example = {
            "input_ids": np.zeros((L,), np.int32),
            "segment_ids": np.zeros((L,), np.int32),
            "input_mask": np.zeros((L,), np.int32),
            "masked_lm_positions": np.zeros((P,), np.int32),
        }
        example["input_ids"][: len(ids)] = ids
        example["segment_ids"][: len(ids)] = segments
        example["input_mask"][: len(ids)] = 1
        example["masked_lm_positions"][: len(positions)] = positions
        return Featurized(example, len(positions), len(parts) == 2)

    def predict(
        self,
        lines: Sequence[str],
        batch_size: int,
        progress: Callable[[int], None] | None = None,
    ) -> list[Prediction]:
        """Every line's prediction, in order (featurize every line first: a bad line is
        an error before anything runs); `progress(1)` after each line."""
        features = [self.featurize(line) for line in lines]
        rows = self.runner.batch_size(batch_size)
        outputs = self.runner.run((f.example for f in features), rows)
        results = []
        for line, f, out in zip(lines, features, outputs, strict=True):
            results.append(self._prediction(line, f, out))
            if progress is not None:
                progress(1)
        return results

    def _prediction(self, line: str, f: Featurized, out: dict[str, np.ndarray]) -> Prediction:
        masks = tuple(
            tuple(
                Candidate(self.tokenizer.id_to_token(int(i)), int(i), float(p))
                for i, p in zip(out["top_ids"][m], out["top_probs"][m], strict=True)
            )
            for m in range(f.num_masks)
        )
        ids = f.example["input_ids"].copy()
        positions = f.example["masked_lm_positions"][: f.num_masks]
        ids[positions] = out["top_ids"][: f.num_masks, 0]
        real = ids[f.example["input_mask"] > 0]
        filled = self.tokenizer.decode([int(t) for t in real], skip_special_tokens=True)
        is_next = float(out["nsp_probs"][0]) if f.is_pair else None
        return Prediction(line, masks, filled, is_next)
