"""Tests of the BERT input pipeline: tokenizer, corpora, examples, tfds cache, grain sharding."""

from __future__ import annotations

import collections
import dataclasses
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest
from conftest import DATA_DIR

from input_pipeline import (
    bert_data,
    bert_tfds,
    documents,
    grain_pipeline,
    pretraining_examples,
    stdlib_corpus,
    tokenizer,
)

REAL_VOCAB = os.path.join(DATA_DIR, "bert_base_uncased_vocab", "vocab.txt")
SPECIAL = tokenizer.SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
# Pseudo-English vocabulary for generated corpora.
_WORD_TEXT = (
    "the a lobster sea claw red blue ocean species large small eggs larvae summer winter "
    "crab shell water night day grow young adult rock mud food king queen lord speak hear"
)
WORDS = np.array(_WORD_TEXT.split())


def _write_corpus(path, num_docs: int, seed: int) -> str:
    """A random pseudo-English corpus in BERT format."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(num_docs):
        sentences = [
            " ".join(rng.choice(WORDS, rng.integers(4, 14))).capitalize() + "."
            for _ in range(rng.integers(2, 12))
        ]
        docs.append("\n".join(sentences))
    path.write_text("\n\n".join(docs) + "\n")
    return str(path)


def _data_cfg(tmp_dir, **overrides) -> ml_collections.ConfigDict:
    cfg = dict(
        corpus="files",
        train_files=("train.txt",),
        eval_files=("eval.txt",),
        data_dir=str(tmp_dir),
        vocab_file="",
        vocab_size=200,
        lowercase=True,
        cache_dir=str(tmp_dir / "cache"),
        masked_lm_prob=0.15,
        dupe_factor=2,
        short_seq_prob=0.1,
        seed=0,
        eval_fraction=0.1,
        max_eval_examples=0,
    )
    cfg.update(overrides)
    return ml_collections.ConfigDict(cfg)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bert_corpus")
    _write_corpus(tmp / "train.txt", num_docs=60, seed=1)
    _write_corpus(tmp / "eval.txt", num_docs=8, seed=2)
    return tmp


@pytest.fixture(scope="module")
def small_data(corpus_dir):
    return bert_data.build_bert_data(_data_cfg(corpus_dir), 32, 5, 0, 1)


def _key(example) -> bytes:
    return example["input_ids"].tobytes() + example["masked_lm_positions"].tobytes()


# --- tokenizer ---------------------------------------------------------------------------


@pytest.mark.skipif(not os.path.isfile(REAL_VOCAB), reason="shared data not present")
def test_real_vocab_tokenises_like_bert_base_uncased():
    tok = tokenizer.load_wordpiece(REAL_VOCAB)
    ids = tokenizer.tokenize_lines(tok, ["Hello, world! Unaffable"])[0]
    assert ids == [7592, 1010, 2088, 999, 14477, 20961, 3468]
    assert tokenizer.special_ids(tok) == tokenizer.SpecialIds(
        pad=0, unk=100, cls=101, sep=102, mask=103
    )
    assert tok.get_vocab_size() == 30522


def test_train_wordpiece_puts_special_tokens_first(tmp_path):
    corpus = _write_corpus(tmp_path / "c.txt", num_docs=20, seed=0)
    vocab = tokenizer.train_wordpiece([corpus], 150, str(tmp_path / "v" / "vocab.txt"))
    tok = tokenizer.load_wordpiece(vocab)
    assert tokenizer.special_ids(tok) == SPECIAL
    with open(vocab) as f:
        assert f.read().splitlines()[:5] == list(tokenizer.SPECIAL_TOKENS)
    ids = tokenizer.tokenize_lines(tok, ["The lobster speaks"])[0]
    assert ids and SPECIAL.unk not in ids and SPECIAL.cls not in ids


def test_missing_vocab_names_path_and_config_key(tmp_path):
    missing = str(tmp_path / "nope" / "vocab.txt")
    with pytest.raises(FileNotFoundError, match="data.vocab_file") as err:
        tokenizer.load_wordpiece(missing)
    assert missing in str(err.value)


# --- corpora -----------------------------------------------------------------------------


def test_wikitext_articles_headings_and_sentences(tmp_path):
    text = (
        " \n = Lobster = \n \n A lobster is red . It lives in the sea . \n \n"
        " = = Life = = \n \n Eggs hatch at night ! Larvae swim . \n"
        " = Crab = \n \n Crabs walk sideways . \n"
    )
    path = tmp_path / "wiki.txt"
    path.write_text(text)
    docs = documents.read_documents([str(path)])
    assert docs == [
        ["A lobster is red .", "It lives in the sea .", "Eggs hatch at night !", "Larvae swim ."],
        ["Crabs walk sideways ."],
    ]


def test_blank_line_documents_like_tinyshakespeare(tmp_path):
    path = tmp_path / "play.txt"
    path.write_text("First Citizen:\nSpeak, speak.\n\nAll:\nResolved.\n\n\n")
    assert documents.read_documents([str(path)], "blank_lines") == [
        ["First Citizen:", "Speak, speak."],
        ["All:", "Resolved."],
    ]


def test_missing_and_empty_corpus_errors_name_the_file(tmp_path):
    missing = str(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match="data.eval_files") as err:
        documents.read_documents([missing], config_key="data.eval_files")
    assert missing in str(err.value)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n\n")
    with pytest.raises(ValueError, match="empty corpus") as err:
        documents.read_documents([str(empty)])
    assert str(empty) in str(err.value)


def test_build_bert_data_missing_files_name_path_and_key(tmp_path):
    _write_corpus(tmp_path / "train.txt", num_docs=5, seed=0)
    _write_corpus(tmp_path / "eval.txt", num_docs=5, seed=1)
    with pytest.raises(FileNotFoundError, match="data.train_files") as err:
        bert_data.build_bert_data(_data_cfg(tmp_path, train_files=("nope.txt",)), 32, 5, 0, 1)
    assert str(tmp_path / "nope.txt") in str(err.value)
    with pytest.raises(FileNotFoundError, match="data.vocab_file") as err:
        bert_data.build_bert_data(_data_cfg(tmp_path, vocab_file="v/vocab.txt"), 32, 5, 0, 1)
    assert str(tmp_path / "v" / "vocab.txt") in str(err.value)


def test_stdlib_corpus_is_deterministic_and_multi_sentence(tmp_path):
    docs = stdlib_corpus.stdlib_documents(max_bytes=60_000)
    assert docs == stdlib_corpus.stdlib_documents(max_bytes=60_000)
    assert len(docs) >= 5 and all(len(d) >= 2 for d in docs)
    assert 60_000 <= sum(len(s) + 1 for d in docs for s in d) + len(docs) < 200_000
    path = stdlib_corpus.write_stdlib_corpus(str(tmp_path / "stdlib.txt"), max_bytes=60_000)
    assert documents.read_documents([path]) == docs


# --- pretraining examples ----------------------------------------------------------------


def _consecutive_documents(num_docs: int, seed: int) -> list[list[list[int]]]:
    """Documents whose tokens count up by one, so a segment's original tokens are
    recoverable from any of its unmasked tokens."""
    rng = np.random.default_rng(seed)
    docs, next_id = [], 10
    for _ in range(num_docs):
        doc = []
        for _ in range(rng.integers(1, 15)):
            n = int(rng.integers(1, 12))
            doc.append(list(range(next_id, next_id + n)))
            next_id += n
        docs.append(doc)
        next_id += 100
    return docs


CFG = pretraining_examples.MaskingConfig(
    seq_length=64, max_predictions=10, masked_lm_prob=0.15, short_seq_prob=0.1, dupe_factor=20
)


@pytest.fixture(scope="module")
def examples():
    docs = _consecutive_documents(60, seed=0)
    return pretraining_examples.create_examples(docs, CFG, SPECIAL, 30000, seed=7)


def test_example_structure(examples):
    assert len(examples) > 2000
    for ex in examples:
        spec = pretraining_examples.feature_spec(CFG.seq_length, CFG.max_predictions)
        for name, (shape, dtype) in spec.items():
            assert ex[name].shape == shape and ex[name].dtype == dtype, name
        ids, seg, mask = ex["input_ids"], ex["segment_ids"], ex["input_mask"]
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()
        assert (ids[n:] == SPECIAL.pad).all() and (seg[n:] == 0).all()
        seps = np.flatnonzero(ids[:n] == SPECIAL.sep)
        assert ids[0] == SPECIAL.cls and len(seps) == 2 and seps[1] == n - 1
        a_end = seps[0]
        assert 1 < a_end < n - 2  # both segments non-empty
        assert (seg[: a_end + 1] == 0).all() and (seg[a_end + 1 : n] == 1).all()


def _original_tokens(ex) -> tuple[np.ndarray, np.ndarray]:
    """Rebuilds the unmasked input from the counting-up segments (mode of id - offset).

    Returns the ids and whether each was recoverable (a fully masked segment is not).
    """
    ids = ex["input_ids"].copy()
    known = np.zeros(len(ids), bool)
    n = int(ex["input_mask"].sum())
    sep = int(np.flatnonzero(ids == SPECIAL.sep)[0])
    masked = set(ex["masked_lm_positions"][ex["masked_lm_weights"] > 0].tolist())
    for lo, hi in ((1, sep), (sep + 1, n - 1)):
        starts = [ids[j] - (j - lo) for j in range(lo, hi) if j not in masked]
        if starts:
            start = collections.Counter(starts).most_common(1)[0][0]
            ids[lo:hi] = np.arange(start, start + hi - lo)
            known[lo:hi] = True
    return ids, known


def test_masked_positions_hold_the_original_tokens(examples):
    kinds = collections.Counter()
    num_masked = num_tokens = num_checked = 0
    for ex in examples:
        w = ex["masked_lm_weights"]
        p = int((w > 0).sum())
        n = int(ex["input_mask"].sum())
        assert p == min(CFG.max_predictions, max(1, round(n * CFG.masked_lm_prob)))
        assert (w[:p] == 1).all() and not w[p:].any()
        pos, orig = ex["masked_lm_positions"][:p], ex["masked_lm_ids"][:p]
        assert (np.diff(pos) > 0).all() and pos.min() >= 1 and pos.max() < n - 1
        original, known = _original_tokens(ex)
        np.testing.assert_array_equal(original[pos][known[pos]], orig[known[pos]])
        num_checked += int(known[pos].sum())
        assert not np.isin(orig, [SPECIAL.cls, SPECIAL.sep, SPECIAL.pad]).any()
        for token, o in zip(ex["input_ids"][pos], orig, strict=True):
            kinds["mask" if token == SPECIAL.mask else "keep" if token == o else "random"] += 1
        num_masked += p
        num_tokens += n
    assert num_checked > 0.95 * num_masked
    total = sum(kinds.values())
    assert abs(kinds["mask"] / total - 0.8) < 0.03
    assert abs(kinds["keep"] / total - 0.1) < 0.03
    assert abs(kinds["random"] / total - 0.1) < 0.03
    assert 0.12 < num_masked / num_tokens < 0.18


def test_next_sentence_labels_are_balanced(examples):
    labels = np.array([int(ex["next_sentence_labels"]) for ex in examples])
    assert set(labels.tolist()) == {0, 1}
    # Random next is forced for one-sentence chunks, so slightly above one half.
    assert 0.45 < labels.mean() < 0.62


def test_examples_are_deterministic_per_seed():
    docs = _consecutive_documents(10, seed=3)
    cfg = pretraining_examples.MaskingConfig(seq_length=32, max_predictions=5, dupe_factor=2)
    make = lambda seed: pretraining_examples.create_examples(docs, cfg, SPECIAL, 5000, seed)
    a, b, c = make(0), make(0), make(1)
    assert [_key(x) for x in a] == [_key(x) for x in b]
    assert [_key(x) for x in a] != [_key(x) for x in c]


# --- tfds cache --------------------------------------------------------------------------


def test_tfds_cache_reused_and_rebuilt_on_change(tmp_path, monkeypatch):
    corpus = _write_corpus(tmp_path / "c.txt", num_docs=20, seed=0)
    vocab = tokenizer.train_wordpiece([corpus], 150, str(tmp_path / "vocab.txt"))
    params = bert_tfds.BertExamplesParams(
        train_files=(corpus,), eval_files=(), vocab_file=vocab, seq_length=32, max_predictions=5
    )
    data_dir = str(tmp_path / "tfds")
    first = bert_tfds.prepare(params, data_dir)
    n_train = len(bert_tfds.data_sources(first)["train"])
    assert n_train > 0

    def fail(*args, **kwargs):
        raise AssertionError("regenerated a cached dataset")

    with monkeypatch.context() as m:
        m.setattr(pretraining_examples, "create_examples", fail)
        again = bert_tfds.prepare(params, data_dir)
        assert again.data_dir == first.data_dir
        assert len(bert_tfds.data_sources(again)["train"]) == n_train
        with pytest.raises(AssertionError, match="regenerated"):
            bert_tfds.prepare(dataclasses.replace(params, dupe_factor=2), data_dir)

    doubled = bert_tfds.prepare(dataclasses.replace(params, dupe_factor=2), data_dir)
    assert doubled.data_dir != first.data_dir
    assert len(bert_tfds.data_sources(doubled)["train"]) > n_train
    # An edited corpus file changes the fingerprint too.
    old = params.fingerprint()
    os.utime(corpus, ns=(0, os.stat(corpus).st_mtime_ns + 10**9))
    assert params.fingerprint() != old
    assert old not in bert_tfds.make_builder(params, data_dir).data_dir


_BUILD_SCRIPT = """
import sys
from input_pipeline import bert_tfds, pretraining_examples
calls = []
real = pretraining_examples.create_examples
pretraining_examples.create_examples = lambda *a, **k: calls.append(1) or real(*a, **k)
params = bert_tfds.BertExamplesParams(
    train_files=(sys.argv[1],), eval_files=(), vocab_file=sys.argv[2], seq_length=32,
    max_predictions=5, dupe_factor=3)
builder = bert_tfds.prepare(params, sys.argv[3])
print("RESULT", len(calls), len(bert_tfds.data_sources(builder)["train"]))
"""


def test_two_processes_build_one_dataset_once(tmp_path):
    corpus = _write_corpus(tmp_path / "c.txt", num_docs=100, seed=0)
    vocab = tokenizer.train_wordpiece([corpus], 150, str(tmp_path / "vocab.txt"))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = [sys.executable, "-c", _BUILD_SCRIPT, corpus, vocab, str(tmp_path / "tfds")]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": root}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        results.append([line.split()[1:] for line in out.splitlines() if line.startswith("RESULT")])
    # Both see the same complete dataset; exactly one of them generated it (two splits).
    assert sorted(int(r[0][0]) for r in results) == [0, 2]
    assert results[0][0][1] == results[1][0][1] != "0"


def test_build_bert_data_caches_everything(corpus_dir, small_data):
    again = bert_data.build_bert_data(_data_cfg(corpus_dir), 32, 5, 1, 2)
    assert again.num_train_examples == small_data.num_train_examples
    assert again.vocab_size == small_data.vocab_size <= 200
    cache = corpus_dir / "cache"
    assert len(list((cache / "vocab").glob("wordpiece_*.txt"))) == 1
    assert len(list((cache / "tfds" / "bert_pretraining").iterdir())) == 1


# --- grain sharding, eval padding, iterator state -----------------------------------------


@pytest.mark.parametrize("shard_count", [2, 4])
def test_train_shards_are_disjoint_and_global_batches_do_not_depend_on_host_count(
    small_data, shard_count
):
    host_batch = 2
    global_batch = host_batch * shard_count
    full_batches = small_data.num_train_examples // global_batch  # within the first epoch
    single = small_data.train_iterator(host_batch_size=global_batch, seed=0)
    hosts = [
        dataclasses.replace(small_data, shard_index=s, shard_count=shard_count).train_iterator(
            host_batch_size=host_batch, seed=0
        )
        for s in range(shard_count)
    ]
    seen: list[str] = []
    for _ in range(full_batches):
        want = next(single)
        parts = [next(it) for it in hosts]
        for name in want:
            np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]), want[name])
        seen += [_key({k: v[i] for k, v in want.items()}) for i in range(global_batch)]
    assert len(set(seen)) == len(seen)  # no record twice within an epoch
    everything = {_key(small_data.train_source[i]) for i in range(small_data.num_train_examples)}
    assert set(seen) <= everything and len(seen) > 0.8 * len(everything)


@pytest.mark.parametrize("max_eval", [0, 21])
def test_eval_is_padded_and_equal_on_every_host(small_data, max_eval):
    gbs = 8
    num_eval = max_eval or small_data.num_eval_examples
    real = {_key(small_data.eval_source[i]) for i in range(num_eval)}
    assert len(real) == num_eval
    single = None
    for shard_count in (1, 2, 4):
        per_host = []
        for shard in range(shard_count):
            host = dataclasses.replace(
                small_data, num_eval_examples=num_eval, shard_index=shard, shard_count=shard_count
            )
            per_host.append(host.eval_batches(gbs))
        assert len({len(b) for b in per_host}) == 1
        assert len(per_host[0]) == -(-num_eval // gbs)
        keys = []
        for batches in per_host:
            for batch in batches:
                assert batch["mask"].shape == (gbs // shard_count,)
                for i in np.flatnonzero(batch["mask"]):
                    keys.append(_key({k: v[i] for k, v in batch.items()}))
                assert not batch["input_mask"][batch["mask"] == 0].any()
        assert len(keys) == num_eval and set(keys) == real
        # Global batch b is the same whatever the host count.
        merged = [
            np.concatenate([per_host[h][b]["input_ids"] for h in range(shard_count)])
            for b in range(len(per_host[0]))
        ]
        if single is None:
            single = merged
        for x, y in zip(single, merged, strict=True):
            np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="divisible"):
        dataclasses.replace(small_data, shard_count=3).eval_batches(8)


def test_grain_iterator_state_round_trip(small_data):
    batch_size = 16
    it = small_data.train_iterator(host_batch_size=batch_size, seed=3)
    # Run past an epoch boundary so the state covers epoch as well as position.
    steps = small_data.num_train_examples // batch_size + 1
    for _ in range(steps):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(3)]
    restored = small_data.train_iterator(host_batch_size=batch_size, seed=3)
    restored.set_state(state)
    for want in expected:
        got = next(restored)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
    fresh = next(iter(small_data.train_iterator(host_batch_size=batch_size, seed=3)))
    assert not np.array_equal(fresh["input_ids"], expected[0]["input_ids"])


def test_reader_threads_do_not_change_the_stream():
    """read_threads=0 (each record read when its batch is made) gives grain's default
    threaded reads' batches, in order, and stays checkpointable."""
    source = [{"idx": np.int32(i)} for i in range(37)]

    def stream(read_threads, count=20):
        loader = grain_pipeline.train_loader(
            source, 4, 5, 1, 2, {"idx": "int32"}, read_threads=read_threads
        )
        it = iter(loader)
        return it, [next(it)["idx"].tolist() for _ in range(count)]

    _, threaded = stream(None)
    it, inline = stream(0)
    assert inline == threaded
    state = it.get_state()
    resumed = iter(
        grain_pipeline.train_loader(source, 4, 5, 1, 2, {"idx": "int32"}, read_threads=0)
    )
    resumed.set_state(state)
    assert next(resumed)["idx"].tolist() == next(it)["idx"].tolist()


def test_grain_loader_reads_only_its_rows_and_covers_every_record():
    num_records, shard_count = 103, 4  # G = 4: epoch 0 ends inside global batch 25
    source = [{"idx": np.int32(i)} for i in range(num_records)]
    per_shard = []
    for shard in range(shard_count):
        loader = grain_pipeline.train_loader(source, 1, 0, shard, shard_count, {"idx": "int32"})
        it = iter(loader)
        per_shard.append([int(next(it)["idx"][0]) for _ in range(52)])  # two epochs' worth
    first_epoch = [per_shard[i % 4][i // 4] for i in range(num_records)]
    second_epoch = [per_shard[i % 4][i // 4] for i in range(num_records, 2 * num_records)]
    assert sorted(first_epoch) == list(range(num_records))  # every record once, none dropped
    assert sorted(second_epoch) == list(range(num_records))
    assert first_epoch != second_epoch  # each epoch is reshuffled
    rows = grain_pipeline.GlobalOrderHostRows(source, 1, 2, shard_count, seed=0)
    assert [rows.record_index(k) for k in range(3)] == [
        first_epoch[2],
        first_epoch[6],
        first_epoch[10],
    ]
