"""An embedded default corpus that needs no download: the Python standard library's docstrings.

Written in BERT's pretraining text format: one sentence per line, a blank line between
documents. A document is one module's docstrings (module, classes, functions) in source
order, so next-sentence prediction has multi-sentence documents to draw from.
"""

from __future__ import annotations

import ast
import os
import re
import sysconfig
import warnings

DEFAULT_MAX_BYTES = 3_000_000

# Directories whose docstrings are test scaffolding, vendored code or GUI demos.
_SKIP_DIRS = frozenset(
    {
        "test",
        "tests",
        "idlelib",
        "site-packages",
        "dist-packages",
        "lib2to3",
        "turtledemo",
        "ensurepip",
        "pydoc_data",
        "__pycache__",
        "config-3",
    }
)

# A sentence ends at . ! or ? followed by whitespace and an upper-case letter or quote.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")


def _docstrings(source: str) -> list[str]:
    """Module, class and function docstrings of one source file, in source order."""
    with warnings.catch_warnings():
        # Some stdlib files contain invalid escape sequences in strings.
        warnings.simplefilter("ignore")
        tree = ast.parse(source)
    nodes = [tree] + [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))
    docs = []
    for node in nodes:
        doc = ast.get_docstring(node, clean=True)
        if doc:
            docs.append(doc)
    return docs


def _prose_sentences(doc: str) -> list[str]:
    """Sentences of a docstring's prose paragraphs; code, doctests and tables are dropped."""
    sentences = []
    for paragraph in re.split(r"\n\s*\n", doc):
        lines = paragraph.splitlines()
        # Prose paragraphs start unindented with a letter; indented blocks are examples,
        # argument tables or code.
        if not lines or not lines[0][:1].isalpha():
            continue
        if any(line.lstrip().startswith((">>>", "...")) for line in lines):
            continue
        text = " ".join(line.strip() for line in lines)
        for sentence in _SENTENCE_END.split(text):
            sentence = sentence.strip()
            if len(sentence.split()) >= 3:
                sentences.append(sentence)
    return sentences


def _stdlib_sources(stdlib_dir: str) -> list[str]:
    """Sorted paths of the stdlib's .py files, skipping tests, vendored and demo code."""
    paths = []
    for root, dirs, files in os.walk(stdlib_dir):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("config-"))
        paths.extend(os.path.join(root, f) for f in files if f.endswith(".py"))
    return sorted(paths)


def stdlib_documents(max_bytes: int = DEFAULT_MAX_BYTES) -> list[list[str]]:
    """Documents (lists of sentences) from the stdlib docstrings, about max_bytes of text."""
    stdlib_dir = sysconfig.get_paths()["stdlib"]
    documents: list[list[str]] = []
    total = 0
    for path in _stdlib_sources(stdlib_dir):
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
            docs = _docstrings(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        sentences = [s for doc in docs for s in _prose_sentences(doc)]
        if len(sentences) < 2:
            continue
        documents.append(sentences)
        total += sum(len(s) + 1 for s in sentences) + 1
        if total >= max_bytes:
            break
    return documents


def write_stdlib_corpus(path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """Writes the stdlib docstring corpus to path (BERT text format) unless it exists.

    The content is deterministic for a given Python installation. Returns path.
    """
    if os.path.isfile(path):
        return path
    documents = stdlib_documents(max_bytes)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    # Atomic rename: a concurrent reader sees no file or the whole file, never a prefix.
    tmp_path = f"{path}.tmp.{os.getpid()}"
    with open(tmp_path, "w", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(doc) for doc in documents) + "\n")
    os.replace(tmp_path, path)
    return path
