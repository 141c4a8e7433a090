"""Translate text with a trained Transformer: the evaluator's beam search, batch by batch.

Lines are encoded as the eval set is (the run's vocabulary, EOS appended, cut to
`data.eval_max_length` with EOS kept last), padded to the longest line rounded up to 8
(the eval's rule: one compiled program for the whole input), sorted by length so that
each batch's beam search ends with its longest sentence, and decoded by the task's
`eval_outputs` (beam size, length penalty and `max_extra_length` from `config.eval`, the
first two overridable). Outputs are detokenised as the BLEU evaluation sees them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from ml_collections import ConfigDict

from input_pipeline import translation_vocab
from input_pipeline.subword_vocab import SubwordVocab
from mlperf.batch_inference import BatchRunner, round_up
from mlperf.transformer.task import TransformerTask

LENGTH_MULTIPLE = 8  # eval inputs are padded to a multiple of 8 tokens


@dataclasses.dataclass(frozen=True)
class Translation:
    """One decoded line: its text and the token ids the beam search chose (EOS last)."""

    source: str
    text: str
    tokens: tuple[int, ...]


def run_vocabulary(config: ConfigDict):
    """The vocabulary the run trained with: the reference's subword file
    (data.format=mlperf_tfrecord), data.vocab_file, or the sentencepiece model trained on
    the run's training text (found in data.cache_dir by the files' key, as training did)."""
    from input_pipeline import translation_tfrecord
    from input_pipeline.translation_data import build_translation_data

    if config.data.get("format", "text") == translation_tfrecord.FORMAT:
        return translation_tfrecord.vocab_of(config.data)
    return build_translation_data(config.data, with_train=False).vocab


def encode(vocab, line: str, max_length: int) -> np.ndarray:
    """Token ids of a source line as the eval encodes it: EOS appended, cut to
    `max_length` with EOS kept last."""
    if isinstance(vocab, SubwordVocab):
        ids = vocab.encode(line) + [translation_vocab.EOS_ID]
    else:
        ids = translation_vocab.encode_lines(vocab, [line])[0]
    if len(ids) > max_length:
        ids = ids[: max_length - 1] + [translation_vocab.EOS_ID]
    return np.asarray(ids, np.int32)


def detokenize(vocab, ids: Sequence[int]) -> str:
    """Text of a decoded sequence as the BLEU evaluation reads it (TranslationData.decode)."""
    if isinstance(vocab, SubwordVocab):
        return vocab.decode_ids(ids)
    return translation_vocab.decode_ids(vocab, ids)


def until_eos(tokens: np.ndarray) -> tuple[int, ...]:
    """The ids up to and including the first EOS (all of them if there is none)."""
    ids = [int(t) for t in tokens]
    if translation_vocab.EOS_ID in ids:
        ids = ids[: ids.index(translation_vocab.EOS_ID) + 1]
    return tuple(ids)


def decoding_config(
    config: ConfigDict,
    beam_size: int = 0,
    length_penalty: float | None = None,
) -> ConfigDict:
    """`config` with the eval's decoding settings overridden where given."""
    config = ConfigDict(config.to_dict())
    if beam_size:
        config.eval.beam_size = beam_size
    if length_penalty is not None:
        config.eval.length_penalty = length_penalty
    return config


class Translator:
    """A TrainedModel's Transformer decoding lines with the evaluator's beam search."""

    def __init__(
        self,
        trained,
        vocab,
        beam_size: int = 0,
        length_penalty: float | None = None,
    ):
        self.vocab = vocab
        config = decoding_config(trained.config, beam_size, length_penalty)
        self.max_length = int(config.data.eval_max_length)
        # The task only decodes: eval_outputs reads config.eval and einsum_gather.
        self.task = TransformerTask(config)
        self.runner = BatchRunner(trained, self.task.eval_outputs)

    def translate(
        self,
        lines: Sequence[str],
        batch_size: int,
        progress: Callable[[int], None] | None = None,
    ) -> list[Translation]:
        """Every line translated (in input order), `batch_size` lines per device batch
        (rounded up to the mesh's batch split); `progress(1)` after each line."""
        encoded = [encode(self.vocab, line, self.max_length) for line in lines]
        length = round_up(max(len(ids) for ids in encoded), LENGTH_MULTIPLE)
        order = sorted(range(len(lines)), key=lambda i: (len(encoded[i]), i))
        rows = self.runner.batch_size(batch_size)
        tokens: dict[int, tuple[int, ...]] = {}
        outputs = self.runner.run(self._examples(encoded, order, length), rows)
        for i, out in zip(order, outputs, strict=True):
            tokens[i] = until_eos(out["tokens"])
            if progress is not None:
                progress(1)
        return [
            Translation(line, detokenize(self.vocab, tokens[i]), tokens[i])
            for i, line in enumerate(lines)
        ]

    @staticmethod
    def _examples(encoded, order, length) -> Iterator[dict[str, np.ndarray]]:
        for i in order:
            row = np.zeros((length,), np.int32)
            row[: len(encoded[i])] = encoded[i]
            yield {"inputs": row}
