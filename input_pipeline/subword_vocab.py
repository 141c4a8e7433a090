"""The MLPerf Transformer's subword vocabulary file, decoded without TensorFlow.

The reference's preprocessed WMT En-De data is encoded with a tensor2tensor-style
subword vocabulary (`vocab.translate_ende_wmt32k.32768.subwords` from t2t, or
`vocab.ende.32768` from the MLPerf reference's own tokenizer: the same format). The file
holds one subword a line, wrapped in single (or double) quotes; line k is id k, and the
first two are the reserved padding (0) and EOS (1): `<pad>_`, `<EOS>_` in t2t's file,
`<pad>`, `<EOS>` in the reference's.

How a text becomes subwords, and back:
  * the text is split into tokens at every change between alphanumeric characters
    (Unicode categories L* and N*) and the rest; decoding puts one space between two
    neighbouring alphanumeric tokens and nothing elsewhere;
  * each token is escaped (`\\` -> `\\\\`, `_` -> `\\u`, a character outside the
    vocabulary's alphabet -> `\\<code point>;`) and ends with `_`, the token terminator;
  * the escaped tokens are cut into subwords of the vocabulary.
Decoding joins the subwords of the ids, splits the result at `_` and unescapes each
token (an escape that names no character decodes to U+3013). Encoding (for eval source
text, as the reference translates newstest2014) cuts each escaped token greedily into the
longest subwords of the vocabulary, left to right.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Sequence

from input_pipeline import storage

PAD_ID = 0
EOS_ID = 1
_UNESCAPE = re.compile(r"\\u|\\\\|\\([0-9]+);")
_UNDEFINED = "\u3013"
_ESCAPE_CHARS = frozenset("\\_u;0123456789")


class VocabFileError(ValueError):
    """A malformed subword vocabulary file (the message names the file and line)."""


def _is_alnum(ch: str) -> bool:
    # The reference's set spans code points below sys.maxunicode (U+10FFFF is unassigned).
    return ord(ch) < sys.maxunicode and unicodedata.category(ch)[0] in "LN"


def _unescape_match(m: re.Match) -> str:
    if m.group(1) is None:
        return "_" if m.group(0) == "\\u" else "\\"
    try:
        return chr(int(m.group(1)))
    except (ValueError, OverflowError):
        return _UNDEFINED


def unescape_token(escaped: str) -> str:
    """An escaped token (with or without its trailing `_`) -> the token's text."""
    if escaped.endswith("_"):
        escaped = escaped[:-1]
    return _UNESCAPE.sub(_unescape_match, escaped)


def join_tokens(tokens: Sequence[str]) -> str:
    """Tokens -> text: a space between two neighbouring alphanumeric tokens only."""
    out = []
    previous_alnum = False
    for i, token in enumerate(tokens):
        alnum = _is_alnum(token[0])
        if i > 0 and previous_alnum and alnum:
            out.append(" ")
        out.append(token)
        previous_alnum = alnum
    return "".join(out)


def split_tokens(text: str) -> list[str]:
    """Text -> tokens, cut at every alphanumeric / non-alphanumeric change; a single space
    between two tokens is dropped (join_tokens puts it back)."""
    if not text:
        return []
    tokens = []
    start = 0
    alnum = [_is_alnum(c) for c in text]
    for pos in range(1, len(text)):
        if alnum[pos] != alnum[pos - 1]:
            token = text[start:pos]
            if token != " " or start == 0:
                tokens.append(token)
            start = pos
    tokens.append(text[start:])
    return tokens


def escape_token(token: str, alphabet: frozenset[str]) -> str:
    """`\\` -> `\\\\`, `_` -> `\\u`, characters outside the alphabet (and newline) ->
    `\\<code point>;`, then the terminator `_`."""
    token = token.replace("\\", "\\\\").replace("_", "\\u")
    return "".join(c if c in alphabet and c != "\n" else f"\\{ord(c)};" for c in token) + "_"


class SubwordVocab:
    """A subword vocabulary file: ids <-> text (the reference's decoding and encoding)."""

    def __init__(self, path: str):
        self.path = path
        self.subwords = read_vocab_file(path)
        self._ids = {s: i for i, s in enumerate(self.subwords) if s}
        self._longest = max(len(s) for s in self.subwords)
        self._alphabet = frozenset(c for s in self.subwords for c in s) | _ESCAPE_CHARS

    def __len__(self) -> int:
        return len(self.subwords)

    def get_piece_size(self) -> int:
        """The number of ids (the sentencepiece name, so both vocabularies size a model)."""
        return len(self.subwords)

    def __repr__(self) -> str:
        return f"SubwordVocab({self.path!r}, size={len(self)})"

    def encode(self, text: str) -> list[int]:
        """Subword ids of a text (no EOS), as the reference encodes it."""
        ids = []
        for token in split_tokens(text):
            escaped = escape_token(token, self._alphabet)
            start = 0
            while start < len(escaped):
                for end in range(min(len(escaped), start + self._longest), start, -1):
                    i = self._ids.get(escaped[start:end])
                    if i is not None:
                        ids.append(i)
                        start = end
                        break
                else:  # every alphabet character is a subword in a well-formed vocabulary
                    raise VocabFileError(
                        f"{self.path}: no subword for {escaped[start]!r} (in {token!r}); the "
                        "vocabulary lacks a single-character subword"
                    )
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of every id, as the reference decodes it: ids outside the vocabulary add
        nothing; reserved ids decode to their subword (`<pad>`, `<EOS>`)."""
        n = len(self.subwords)
        joined = "".join(self.subwords[i] for i in map(int, ids) if 0 <= i < n)
        tokens = []
        for piece in joined.split("_"):
            if piece:
                token = unescape_token(piece)
                if token:
                    tokens.append(token)
        return join_tokens(tokens)

    def decode_ids(self, ids: Sequence[int]) -> str:
        """Text of a model output or an encoded sentence: the ids before the first EOS,
        padding dropped."""
        kept = []
        for t in map(int, ids):
            if t == EOS_ID:
                break
            if t != PAD_ID:
                kept.append(t)
        return self.decode(kept)


def read_vocab_file(path: str) -> list[str]:
    """The subwords of a vocabulary file, id order. A line that is not one quoted subword,
    or a file that is not UTF-8, raises VocabFileError naming the file and line."""
    if not storage.isfile(path):
        raise FileNotFoundError(f"subword vocabulary file not found: {path!r} (data.vocab_file)")
    raw_lines = storage.read_bytes(path).split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()  # the file ends in a newline
    subwords = []
    for number, raw in enumerate(raw_lines, start=1):
        where = f"{path}, line {number}"
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as e:
            raise VocabFileError(f"{where}: not UTF-8 ({e.reason} at byte {e.start})") from None
        if len(line) < 2 or line[0] not in "'\"" or line[-1] != line[0]:
            shown = line if len(line) <= 40 else line[:40] + "..."
            raise VocabFileError(
                f"{where}: expected one subword in quotes ('...'), got {shown!r}; "
                "data.vocab_file must be the reference's subword vocabulary "
                "(vocab.translate_ende_wmt32k.32768.subwords or vocab.ende.32768)"
            )
        subwords.append(line[1:-1])
    if len(subwords) < 2:
        raise VocabFileError(
            f"{path}: {len(subwords)} subwords; a subword vocabulary starts with the "
            "padding and EOS subwords (ids 0 and 1)"
        )
    return subwords
