"""The shared source/target subword vocabulary (sentencepiece), trained on the training text.

Special ids follow Google's Transformer code: 0 = padding (also the decoder's start
token), 1 = end of sentence, 2 = unknown; there is no BOS. A user-supplied model must
have these ids, or training would silently mix padding and text. The model file and the
training text may be local or in a bucket (`gs://`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

import sentencepiece as spm

from input_pipeline import storage
from input_pipeline.input_errors import InputError

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2


def check_special_ids(sp: spm.SentencePieceProcessor, path: str) -> None:
    """Raises a clear error unless pad=0, eos=1, unk=2 as the model and decoder expect."""
    got = {"pad": sp.pad_id(), "eos": sp.eos_id(), "unk": sp.unk_id()}
    want = {"pad": PAD_ID, "eos": EOS_ID, "unk": UNK_ID}
    if got != want:
        raise InputError(
            f"sentencepiece model {path!r} has special ids {got}, but the Transformer needs "
            f"{want}. Retrain it with pad_id=0 eos_id=1 unk_id=2 bos_id=-1 (or set "
            "data.vocab_file='' to train one on the training text)."
        )


def load_vocab(path: str) -> spm.SentencePieceProcessor:
    """Loads a sentencepiece model and checks its special ids."""
    if not storage.isfile(path):
        raise FileNotFoundError(
            f"sentencepiece model not found: {path!r} (config key data.vocab_file; '' trains "
            "one on the training text)"
        )
    sp = spm.SentencePieceProcessor(model_proto=storage.read_bytes(path))
    check_special_ids(sp, path)
    return sp


def train_vocab(
    text_files: Sequence[str], vocab_size: int, out_model: str, model_type: str = "unigram"
) -> str:
    """Trains a sentencepiece model (unigram, bpe, word) on text_files (both languages: one
    shared vocabulary) and writes it to out_model atomically. Returns out_model."""
    for path in text_files:
        if not storage.isfile(path):
            raise FileNotFoundError(f"text file for vocab training not found: {path!r}")
    # The trainer opens files by name: objects in a bucket come as (cached) local copies.
    local_files = [storage.local_copy(path) for path in text_files]
    out_dir = os.path.dirname(os.path.abspath(out_model))
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        prefix = os.path.join(tmp, "spm")
        spm.SentencePieceTrainer.train(
            input=",".join(local_files),
            model_prefix=prefix,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=1.0,
            pad_id=PAD_ID,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            bos_id=-1,
            # Small corpora (the tiny task) have fewer pieces than vocab_size.
            hard_vocab_limit=False,
            num_threads=1,  # one thread: the same model on every host
            minloglevel=2,
        )
        os.replace(prefix + ".model", out_model)
    return out_model


def encode_lines(sp: spm.SentencePieceProcessor, lines: Sequence[str]) -> list[list[int]]:
    """Token ids of each line, followed by EOS."""
    return [ids + [EOS_ID] for ids in sp.encode(list(lines))]


def decode_ids(sp: spm.SentencePieceProcessor, ids: Sequence[int]) -> str:
    """Text of a decoded sequence: tokens up to the first EOS, padding dropped."""
    out = []
    size = sp.get_piece_size()
    for t in ids:
        t = int(t)
        if t == EOS_ID:
            break
        if t != PAD_ID and t < size:  # ids past the vocabulary: the model's padding rows
            out.append(t)
    return sp.decode(out)
