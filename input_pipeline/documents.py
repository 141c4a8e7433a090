"""Plain-text corpora -> documents (a document is a list of sentences).

Formats:
- "bert": one sentence per line, a blank line between documents (Google's BERT format).
- "wikitext": WikiText-2/103 tokenised text; ` = Title = ` starts an article, ` = = Sub = = `
  headings are dropped, each paragraph line is split into sentences.
- "blank_lines": blank-line separated blocks are documents, each line a sentence
  (tinyshakespeare: a speech is a document). Same parsing as "bert".
- "auto": "wikitext" when the file's first non-blank line is a ` = Title = ` heading,
  otherwise "bert".
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from input_pipeline import storage
from input_pipeline.input_errors import InputError

FORMATS = ("auto", "bert", "wikitext", "blank_lines")

_WIKI_TITLE = re.compile(r"^ = [^=].* = $")
_WIKI_HEADING = re.compile(r"^ (= )+.*( =)+ $")
# WikiText is pre-tokenised: sentence ends are spaced " . ", " ! ", " ? ".
_WIKI_SENTENCE_END = re.compile(r"(?<= [.!?]) (?=\S)")


def check_utf8(path: str, config_key: str, chunk_bytes: int = 1 << 20) -> None:
    """Raises ValueError naming the file, line and byte offset of the first bytes that are
    not UTF-8 (the tokenizer would fail on them without naming the file)."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, line = 0, 1
    with storage.open_file(path, "rb") as f:
        while True:
            chunk = f.read(chunk_bytes)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                # e.start counts from the decoder's buffered tail plus this chunk; the
                # tail is at most 3 bytes, so find the bad byte within the chunk itself.
                bad = max(e.start - len(e.object) + len(chunk), 0)
                line += chunk[:bad].count(b"\n")
                raise InputError(
                    f"corpus file {path!r} (config key {config_key}) is not UTF-8: byte "
                    f"{offset + bad} (line {line}) is {chunk[bad : bad + 1]!r}; convert it, "
                    "e.g. iconv -f latin1 -t utf-8."
                ) from None
            if not chunk:
                return
            offset += len(chunk)
            line += chunk.count(b"\n")


def _read_lines(path: str, config_key: str) -> list[str]:
    if not storage.isfile(path):
        raise FileNotFoundError(
            f"corpus file not found: {path!r} (set config key {config_key} to existing files, "
            "or data.data_dir to the folder that holds them)"
        )
    with storage.open_file(path, "r", encoding="utf-8") as f:
        return f.read().splitlines()


def detect_format(lines: Sequence[str]) -> str:
    """'wikitext' when the first non-blank line is a WikiText title, else 'bert'."""
    for line in lines:
        if line.strip():
            return "wikitext" if _WIKI_TITLE.match(line) else "bert"
    return "bert"


def parse_blank_line_documents(lines: Sequence[str]) -> list[list[str]]:
    """BERT format: sentences one per line, documents separated by blank lines."""
    documents: list[list[str]] = []
    current: list[str] = []
    for line in lines:
        line = line.strip()
        if line:
            current.append(line)
        elif current:
            documents.append(current)
            current = []
    if current:
        documents.append(current)
    return documents


def parse_wikitext(lines: Sequence[str]) -> list[list[str]]:
    """WikiText: one document per article, sub-headings dropped, paragraphs split to sentences."""
    documents: list[list[str]] = []
    current: list[str] = []
    for line in lines:
        if _WIKI_TITLE.match(line):
            if current:
                documents.append(current)
            current = []
            continue
        if not line.strip() or _WIKI_HEADING.match(line):
            continue
        for sentence in _WIKI_SENTENCE_END.split(line.strip()):
            if sentence.strip():
                current.append(sentence.strip())
    if current:
        documents.append(current)
    return documents


def read_documents(
    paths: Sequence[str], fmt: str = "auto", config_key: str = "data.train_files"
) -> list[list[str]]:
    """Reads and concatenates the documents of all files, in order.

    Raises FileNotFoundError naming a missing file and config_key, and ValueError naming
    the files when they hold no document with at least one sentence.
    """
    if fmt not in FORMATS:
        raise InputError(f"unknown corpus format {fmt!r}; expected one of {FORMATS}")
    if not paths:
        raise InputError(f"no corpus files given (config key {config_key} is empty)")
    documents: list[list[str]] = []
    for path in paths:
        lines = _read_lines(path, config_key)
        file_fmt = detect_format(lines) if fmt == "auto" else fmt
        if file_fmt == "wikitext":
            documents.extend(parse_wikitext(lines))
        else:
            documents.extend(parse_blank_line_documents(lines))
    documents = [doc for doc in documents if doc]
    if not documents:
        raise InputError(
            f"empty corpus: no document with at least one sentence in {list(paths)} "
            f"(config key {config_key})"
        )
    return documents
