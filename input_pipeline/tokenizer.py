"""WordPiece tokenisation for BERT: load a vocab.txt, or train one on plain text.

The vocabulary and the text may be local files or objects in a bucket (`gs://`); the
tokenizers library opens files by name, so it gets a local copy of an object
(storage.local_copy: keyed by the object's version, bounded)."""

from __future__ import annotations

import dataclasses
import os

from tokenizers import BertWordPieceTokenizer

from input_pipeline import storage
from input_pipeline.input_errors import InputError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """Ids of BERT's special tokens, read from a vocab."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int


def _check_vocab_file(vocab_file: str) -> None:
    if not storage.isfile(vocab_file):
        raise FileNotFoundError(
            f"WordPiece vocab file not found: {vocab_file!r}. Set config key data.vocab_file "
            "to an existing vocab.txt (or to '' to train a vocab on the training text)."
        )


def check_vocab_file(vocab_file: str, config_key: str = "data.vocab_file") -> None:
    """The vocab exists, is UTF-8 and holds every special token BERT needs."""
    _check_vocab_file(vocab_file)
    try:
        with storage.open_file(vocab_file, "r", encoding="utf-8") as f:
            tokens = {line.rstrip("\n") for line in f}
    except UnicodeDecodeError:
        raise InputError(
            f"vocab file {vocab_file!r} (config key {config_key}) is not UTF-8."
        ) from None
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise InputError(
            f"vocab file {vocab_file!r} (config key {config_key}) lacks the special "
            f"token(s) {' '.join(missing)}; BERT needs {' '.join(SPECIAL_TOKENS)}, one per line."
        )


def load_wordpiece(vocab_file: str, lowercase: bool = True) -> BertWordPieceTokenizer:
    """Loads a BERT WordPiece tokenizer; encode with add_special_tokens=False.

    With bert-base-uncased's vocab.txt and lowercase=True this tokenises exactly as
    bert-base-uncased does (same normaliser, pre-tokeniser and greedy WordPiece).
    """
    _check_vocab_file(vocab_file)
    return BertWordPieceTokenizer(storage.local_copy(vocab_file), lowercase=lowercase)


def special_ids(tokenizer: BertWordPieceTokenizer) -> SpecialIds:
    """Reads the special-token ids; a vocab lacking one is an error naming it."""
    ids = {}
    for name, token in zip(("pad", "unk", "cls", "sep", "mask"), SPECIAL_TOKENS, strict=True):
        token_id = tokenizer.token_to_id(token)
        if token_id is None:
            raise InputError(f"vocab has no special token {token}")
        ids[name] = token_id
    return SpecialIds(**ids)


def tokenize_lines(tokenizer: BertWordPieceTokenizer, lines: list[str]) -> list[list[int]]:
    """Token ids of each line, without [CLS]/[SEP] (the example builder adds them)."""
    encodings = tokenizer.encode_batch(lines, add_special_tokens=False)
    return [enc.ids for enc in encodings]


def train_wordpiece(
    text_files: list[str], vocab_size: int, out_vocab_file: str, lowercase: bool = True
) -> str:
    """Trains a WordPiece vocab on text_files and writes it to out_vocab_file.

    The special tokens come first, so [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4.
    Returns out_vocab_file.
    """
    for path in text_files:
        if not storage.isfile(path):
            raise FileNotFoundError(f"text file for vocab training not found: {path!r}")
    tokenizer = BertWordPieceTokenizer(lowercase=lowercase)
    tokenizer.train(
        files=[storage.local_copy(path) for path in text_files],
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    out_dir = os.path.dirname(os.path.abspath(out_vocab_file))
    os.makedirs(out_dir, exist_ok=True)
    # Write to a temporary name and rename so a reader never sees a half-written vocab.
    tmp_file = f"{out_vocab_file}.tmp.{os.getpid()}"
    vocab = tokenizer.get_vocab()
    with open(tmp_file, "w", encoding="utf-8") as f:
        for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
            f.write(token + "\n")
    os.replace(tmp_file, out_vocab_file)
    return out_vocab_file
