"""Bad inputs (which would otherwise fail deep inside a library) end in one line naming the
file or key and what is allowed, before any data is built."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
from conftest import REPO

from configs import bert
from input_pipeline import bert_data, documents, tokenizer
from mlperf.validate import ConfigError, check_cache_dir, check_data_dir, validate


def _tiny():
    return bert.get_config("tiny")


def test_non_utf8_corpus_names_file_line_and_byte(tmp_path):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes(b"first line\nsecond caf\xe9 line\n")
    with pytest.raises(ValueError) as e:
        documents.check_utf8(str(corpus), "data.train_files")
    message = str(e.value)
    assert str(corpus) in message and "data.train_files" in message
    assert "line 2" in message and "byte 21" in message and "\\xe9" in message


def test_utf8_check_accepts_multibyte_characters_across_chunks(tmp_path):
    corpus = tmp_path / "utf8.txt"
    corpus.write_text("é" * 1000 + "\n" + "€" * 1000, encoding="utf-8")
    documents.check_utf8(str(corpus), "data.train_files", chunk_bytes=7)  # no error


def test_bert_data_refuses_non_utf8_corpus_before_building_anything(tmp_path):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes(b"hello\n\xff\xfe broken\n")
    cfg = _tiny().data
    cfg.corpus, cfg.train_files, cfg.cache_dir = "files", (str(corpus),), str(tmp_path / "c")
    with pytest.raises(ValueError, match="is not UTF-8"):
        bert_data.build_bert_data(cfg, 32, 5, 0, 1)
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").rglob("*.txt"))


def test_vocab_without_special_tokens_names_the_missing_ones(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\nhello\nworld\n")
    with pytest.raises(ValueError) as e:
        tokenizer.check_vocab_file(str(vocab))
    message = str(e.value)
    assert str(vocab) in message and "data.vocab_file" in message
    assert "[CLS] [SEP] [MASK]" in message


def test_read_only_cache_dir_is_named(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    config = _tiny()
    config.data.cache_dir = str(blocker / "cache")  # cannot be created, even by root
    with pytest.raises(ConfigError, match=r"data.cache_dir .*a_file/cache.* is not writable"):
        check_cache_dir(config)
    config.data.cache_dir = str(tmp_path / "ok")
    check_cache_dir(config)


def _config(module: str, variant: str):
    return importlib.import_module(f"configs.{module}").get_config(variant)


@pytest.mark.parametrize(
    "module, variant, key",
    [
        ("bert", "wikitext", "train_files"),
        ("transformer", "multi30k", "train_files"),
        ("transformer", "base", "train_files"),
        ("ssd", "coco128", "annotations"),
        ("maskrcnn", "coco128", "annotations"),
        ("maskrcnn", "mlperf_v07", "annotations"),
    ],
)
def test_a_variant_reading_files_needs_data_dir(tmp_path, module, variant, key):
    config = _config(module, variant)
    assert config.data.data_dir == ""  # no config defaults to a folder outside the repo
    with pytest.raises(ConfigError) as e:
        check_data_dir(config)
    message = str(e.value)
    assert "\n" not in message and f"data.{key}" in message
    assert "data.data_dir is not set" in message and "--config.data.data_dir=DIR" in message
    config.data.data_dir = str(tmp_path)
    check_data_dir(config)


def test_embedded_sets_and_absolute_paths_need_no_data_dir(tmp_path):
    for module in ("bert", "transformer", "ssd", "maskrcnn"):
        check_data_dir(_config(module, "tiny"))
    config = _config("bert", "wikitext")
    data = config.data
    data.train_files, data.eval_files = (str(tmp_path / "a.txt"),), ("~/b.txt",)
    data.vocab_file = str(tmp_path / "vocab.txt")
    check_data_dir(config)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("optimizer.name", "nonesuch", "optimizer.name='nonesuch' is unknown; use one of lamb"),
        (
            "parallel.grad_allreduce",
            "nonesuch",
            "parallel.grad_allreduce='nonesuch' is unknown; use one of xla, ",
        ),
        ("train.global_batch_size", 0, "train.global_batch_size=0 must be > 0"),
    ],
)
def test_bad_names_and_sizes_fail_in_validate(key, value, message):
    config = _tiny()
    section, name = key.split(".")
    config[section][name] = value
    with pytest.raises(ConfigError) as e:
        validate(config, 8)
    assert message in str(e.value)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=REPO,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--config", "configs/bert.py:tiny", "--config.train.no_such_key=1"],
            "--config.train.no_such_key: train has no key 'no_such_key'",
        ),
        (
            ["--config", "configs/bert.py:tiny", "--config.train.stepz=1"],
            "did you mean train.steps?",
        ),
        (
            ["--config", "configs/nonesuch.py:tiny"],
            "config file 'configs/nonesuch.py' not found; use one of configs/bert.py",
        ),
        (
            ["--config", "configs/bert.py:nonesuch"],
            "unknown bert variant 'nonesuch'",
        ),
        (
            ["--config", "configs/bert.py:wikitext"],
            "data.data_dir is not set, and data.train_files",
        ),
    ],
)
def test_config_flag_errors_are_one_line(tmp_path, args, message):
    proc = _cli("launch.train", *args, "--workdir", str(tmp_path / "w"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr[-2000:]
    assert lines[0].startswith("multipod: error: ")


def test_plan_unknown_cluster_is_one_line():
    proc = _cli("launch.plan", "--config", "configs/bert.py:tiny", "--cluster", "nonesuch")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    assert "--cluster 'nonesuch' is unknown; use one of t4x8x32-10gbe" in lines[0]
