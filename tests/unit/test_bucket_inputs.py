"""Text corpora, vocabularies, Multi30k text and COCO (annotations and images) read from a
bucket (a real GCS-protocol server: the `gcs` fixture) give what the same files give from
a local folder; a missing object is the one-line error a missing local file is."""

from __future__ import annotations

import glob
import os
import shutil

import numpy as np
import pytest
from bucket_helpers import BUCKET, head_lines, upload_tree
from conftest import DATA_DIR, REPO

from input_pipeline import storage, translation_vocab
from input_pipeline.bert_data import build_bert_data
from input_pipeline.coco_builder import prepare_coco
from input_pipeline.coco_source import coco_folder
from input_pipeline.translation_data import build_translation_data
from mlperf.validate import ConfigError, check_cache_dir

COCO = os.path.join(REPO, "tests", "fixtures", "coco2017")
VAL_JSON = os.path.join(COCO, "annotations", "instances_val2017.json")


def _needs(*parts: str):
    path = os.path.join(DATA_DIR, *parts)
    return pytest.mark.skipif(not os.path.exists(path), reason=f"{path} absent")


def _slices(folder, files: dict[str, tuple[tuple[str, ...], int]]) -> str:
    """Writes the first N lines of real files (under DATA_DIR) into folder; N = 0 copies
    the whole file."""
    for name, (source, lines) in files.items():
        out = folder / name
        out.parent.mkdir(parents=True, exist_ok=True)
        src = os.path.join(DATA_DIR, *source)
        if lines:
            out.write_text(head_lines(src, lines), encoding="utf-8")
        else:
            shutil.copyfile(src, out)
    return str(folder)


def _assert_same_examples(got, want) -> None:
    assert len(got) == len(want) > 0
    for i in range(len(want)):
        g, w = got[i], want[i]
        assert sorted(g) == sorted(w)
        for name in w:
            np.testing.assert_array_equal(g[name], w[name], err_msg=f"{name} of example {i}")


def _bert_text_config(data_dir: str, cache_dir: str, **overrides):
    from configs.bert import get_config

    c = get_config("wikitext").data
    c.update(data_dir=data_dir, cache_dir=cache_dir, dupe_factor=1, max_eval_examples=0)
    c.update(overrides)
    return c


@_needs("wikitext2_valid_test")
@_needs("bert_base_uncased_vocab")
def test_wikitext_and_wordpiece_vocab_in_a_bucket_give_the_local_examples(
    gcs, tmp_path, monkeypatch
):
    folder = _slices(
        tmp_path / "data",
        {
            "wikitext2_valid_test/valid.txt": (("wikitext2_valid_test", "valid.txt"), 300),
            "tinyshakespeare/input.txt": (("tinyshakespeare", "input.txt"), 300),
            "wikitext2_valid_test/test.txt": (("wikitext2_valid_test", "test.txt"), 150),
            "bert_base_uncased_vocab/vocab.txt": (("bert_base_uncased_vocab", "vocab.txt"), 0),
        },
    )
    url = upload_tree(folder, f"{BUCKET}/data")
    copies = tmp_path / "copies"
    monkeypatch.setenv("MULTIPOD_STORAGE_CACHE", str(copies))
    cache = str(tmp_path / "cache")
    local = build_bert_data(_bert_text_config(folder, cache), 64, 10, 0, 1)
    remote = build_bert_data(_bert_text_config(url, cache), 64, 10, 0, 1)
    assert remote.vocab_size == local.vocab_size == 30522
    _assert_same_examples(remote.train_source, local.train_source)
    _assert_same_examples(remote.eval_source, local.eval_source)
    # Two builds in the one cache: the bucket's files are not the local ones.
    builds = glob.glob(os.path.join(cache, "tfds", "bert_pretraining", "h*"))
    assert len(builds) == 2
    # The tokenizer library opens the vocabulary by name: it got one keyed local copy.
    assert [os.path.basename(p) for p in glob.glob(f"{copies}/*/*")] == ["vocab.txt"]


def _multi30k_config(data_dir: str, cache_dir: str, **overrides):
    from configs.transformer import get_config

    c = get_config("multi30k").data
    c.update(data_dir=data_dir, cache_dir=cache_dir, vocab_size=400, **overrides)
    return c


def _pieces(model: str) -> list[tuple[str, float]]:
    sp = translation_vocab.load_vocab(model)
    return [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]


def _assert_same_translation_data(got, want) -> None:
    _assert_same_examples(got.train_rows, want.train_rows)
    _assert_same_examples(got.eval_records, want.eval_records)
    assert got.references == want.references


@_needs("multi30k")
def test_multi30k_text_and_its_sentencepiece_model_in_a_bucket(gcs, tmp_path):
    lines = {"train": 400, "val": 64}
    folder = _slices(
        tmp_path / "data",
        {
            f"multi30k/{split}.{lang}": (("multi30k", f"{split}.{lang}"), n)
            for split, n in lines.items()
            for lang in ("en", "de")
        },
    )
    url = upload_tree(folder, f"{BUCKET}/data")
    cache = str(tmp_path / "cache")
    local = build_translation_data(_multi30k_config(folder, cache))
    remote = build_translation_data(_multi30k_config(url, cache))
    assert len(local.references) == 64
    _assert_same_translation_data(remote, local)
    # One sentencepiece model trained on each copy of the text (one thread: the same
    # pieces and scores; the files differ in the input names they record), then given as
    # data.vocab_file from the bucket.
    models = glob.glob(os.path.join(cache, "vocab", "spm_*.model"))
    assert len(models) == 2 and _pieces(models[0]) == _pieces(models[1])
    storage.upload(models[0], f"{url}/multi30k/spm.model")
    given = build_translation_data(_multi30k_config(url, cache, vocab_file="multi30k/spm.model"))
    _assert_same_translation_data(given, local)


def _coco_data(data_dir: str):
    from configs.ssd import get_config

    data = get_config("tiny").data
    data.update(
        source="coco",
        data_dir=data_dir,
        annotations="annotations/instances_train2017.json",
        images_dir="train2017",
        eval_annotations="annotations/instances_val2017.json",
        eval_images_dir="val2017",
        categories=(),
    )
    return data


def test_coco_annotations_and_images_in_a_bucket_give_the_local_records(gcs, tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIPOD_STORAGE_CACHE", str(tmp_path / "copies"))
    url = upload_tree(COCO, f"{BUCKET}/coco")
    cache = str(tmp_path / "tfds")
    local = prepare_coco(coco_folder(_coco_data(COCO), 0), cache)
    remote = prepare_coco(coco_folder(_coco_data(url), 0), cache)
    assert remote.label_to_category == local.label_to_category == [0, 1, 3, 18]
    assert remote.category_names == local.category_names
    _assert_same_examples(remote.train, local.train)
    _assert_same_examples(remote.eval, local.eval)
    # pycocotools opens the eval JSON by name: it gets a local copy of the object.
    assert remote.eval_gt_path != VAL_JSON and not storage.is_url(remote.eval_gt_path)
    assert storage.read_bytes(remote.eval_gt_path) == storage.read_bytes(VAL_JSON)


def _bert_tfrecord_config(data_dir: str, cache_dir: str):
    from configs.bert import get_config

    c = get_config("tiny_tfrecord").data
    c.update(data_dir=data_dir, cache_dir=cache_dir)
    return c


def _wmt_config(data_dir: str, cache_dir: str):
    from configs.transformer import get_config

    c = get_config("tiny_tfrecord").data
    c.update(data_dir=data_dir, cache_dir=cache_dir)
    return c


MISSING = {
    "BERT TFRecords": lambda d, c: build_bert_data(_bert_tfrecord_config(d, c), 32, 5, 0, 1),
    "WordPiece vocab": lambda d, c: build_bert_data(_bert_text_config(d, c), 64, 10, 0, 1),
    "corpus": lambda d, c: build_bert_data(_bert_text_config(d, c, vocab_file=""), 64, 10, 0, 1),
    "WMT subword vocab": lambda d, c: build_translation_data(_wmt_config(d, c)),
    "Multi30k text": lambda d, c: build_translation_data(_multi30k_config(d, c)),
    "COCO annotations": lambda d, c: prepare_coco(coco_folder(_coco_data(d), 0), c),
}


@pytest.mark.parametrize("case", sorted(MISSING))
def test_a_missing_object_is_one_line_naming_it_as_a_missing_file_is(gcs, tmp_path, case):
    folder, url = tmp_path / "empty", f"{BUCKET}/empty"
    folder.mkdir()
    storage.write_text(f"{url}/README", "a folder without the inputs")
    errors = []
    for data_dir in (str(folder), url):
        with pytest.raises(FileNotFoundError) as raised:
            MISSING[case](data_dir, str(tmp_path / "cache"))
        errors.append(str(raised.value))
    local, remote = errors
    assert "\n" not in remote and f"{url}/" in remote
    assert remote == local.replace(str(folder), url)


def test_the_data_cache_is_a_local_folder(tmp_path):
    from configs.bert import get_config

    config = get_config("tiny_tfrecord")
    config.data.cache_dir = f"{BUCKET}/cache"
    with pytest.raises(ConfigError, match=r"^data.cache_dir gs://multipod-test/cache is in an"):
        check_cache_dir(config)
    with pytest.raises(ValueError, match="must be a local folder"):
        build_bert_data(config.data, 32, 5, 0, 1)
