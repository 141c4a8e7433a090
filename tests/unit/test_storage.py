"""The path layer (input_pipeline/storage.py) on local folders and on a real GCS-protocol
server: the same calls, the same answers."""

from __future__ import annotations

import os

import pytest

from input_pipeline import storage


@pytest.fixture(params=["local", "gs"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    request.getfixturevalue("gcs")
    return "gs://multipod-test/store"


def test_paths_resolve_without_string_surgery(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert storage.resolve("run") == str(tmp_path / "run")
    assert storage.resolve("gs://b/run/") == "gs://b/run"
    assert storage.join("gs://b/run", "checkpoints", "7") == "gs://b/run/checkpoints/7"
    assert storage.parent("gs://b/run/x") == "gs://b/run"
    assert storage.bucket("gs://b/run/x") == "gs://b"
    assert storage.is_url("gs://b") and not storage.is_url(str(tmp_path))
    with pytest.raises(storage.StorageError, match="s3:// scheme is not supported"):
        storage.resolve("s3://b/run")
    with pytest.raises(storage.StorageError, match="no bucket named"):
        storage.resolve("gs://")


def test_write_read_list_and_remove_alike(root):
    storage.makedirs(root)
    a = storage.join(root, "a.txt")
    storage.write_text(a, "hello")
    storage.write_bytes(storage.join(root, "sub", "b.bin"), bytes(range(100)))
    assert storage.read_text(a) == "hello"
    assert storage.exists(a) and storage.isfile(a) and not storage.isdir(a)
    assert storage.isdir(storage.join(root, "sub"))
    assert storage.size(storage.join(root, "sub", "b.bin")) == 100
    assert storage.read_range(storage.join(root, "sub", "b.bin"), 10, 5) == bytes(range(10, 15))
    assert storage.listdir(root) == ["a.txt", "sub"]
    storage.probe_write(root, ".probe")  # written and gone again
    assert storage.listdir(root) == ["a.txt", "sub"]
    assert storage.file_sizes(root) == {"a.txt": 5, os.path.join("sub", "b.bin"): 100}
    with storage.open_file(storage.join(root, "sub", "b.bin")) as f:
        f.seek(98)
        assert f.read() == bytes([98, 99])
    storage.write_text(a, "replaced")  # a whole-file write replaces
    assert storage.read_text(a) == "replaced"
    storage.rename(storage.join(root, "sub"), storage.join(root, "moved"))
    assert storage.listdir(root) == ["a.txt", "moved"]
    storage.remove(a)
    assert not storage.exists(a)
    storage.rmtree(storage.join(root, "moved"))
    assert storage.listdir(root) == []
    assert storage.listdir(storage.join(root, "never")) == []
    assert storage.size_or_zero(storage.join(root, "never")) == 0


def test_create_exclusive_refuses_an_existing_file(root):
    path = storage.join(root, "lease.json")
    assert storage.create_exclusive(path, b"first")
    assert not storage.create_exclusive(path, b"second")
    assert storage.read_bytes(path) == b"first"


def test_a_local_copy_of_an_object_is_keyed_by_its_version(gcs, tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIPOD_STORAGE_CACHE", str(tmp_path / "cache"))
    url = "gs://multipod-test/vocab.txt"
    storage.write_text(url, "one\ntwo\n")
    first = storage.local_copy(url)
    assert storage.read_text(first) == "one\ntwo\n" and first.startswith(str(tmp_path / "cache"))
    assert storage.local_copy(url) == first  # cached
    storage.write_text(url, "one\ntwo\nthree\n")
    second = storage.local_copy(url)
    assert second != first and storage.read_text(second).endswith("three\n")


def test_store_faults_are_one_line(gcs, monkeypatch):
    # A short bound per store call: gcsfs's own retries would take about half a minute.
    monkeypatch.setenv("MULTIPOD_STORE_TIMEOUT_S", "5")
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("gs://multipod-test/absent")
    gcs.stop()
    with pytest.raises(storage.StorageError) as raised:
        storage.write_text("gs://multipod-test/x", "y")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("gs://multipod-test: writing gs://multipod-test/x failed")
    assert "unreachable" in message and raised.value.transient  # a supervisor retries it


class _HttpError(Exception):
    def __init__(self, code: int):
        super().__init__(f"{code} from the server")
        self.code = code


@pytest.mark.parametrize(
    "error, transient",
    [
        (ConnectionRefusedError("refused"), True),
        (TimeoutError("timed out"), True),
        (_HttpError(503), True),
        (_HttpError(429), True),
        (_HttpError(500), True),
        (_HttpError(403), False),
        (_HttpError(404), False),
        (ValueError("a bad argument"), False),
    ],
)
def test_only_an_unreachable_or_failing_store_is_transient(error, transient):
    assert storage.transient(error) is transient
    wrapped = RuntimeError("the client's own wrapper")
    wrapped.__cause__ = error
    assert storage.transient(wrapped) is transient  # found anywhere in the chain
    with pytest.raises(storage.StorageError) as raised, storage.errors("reading", "gs://b/x"):
        raise error
    assert raised.value.transient is transient


@pytest.mark.parametrize("port", [40321, 8403, 4403])
def test_an_unreachable_store_whose_port_holds_403_is_not_a_refused_permission(port, monkeypatch):
    """A connection error's text names the store's address: digits 403 in its port are
    no HTTP status, and the message must agree with the exit code (69: unreachable)."""
    monkeypatch.setenv(storage.EMULATOR_ENV, f"http://127.0.0.1:{port}")
    error = ConnectionRefusedError(f"Cannot connect to host 127.0.0.1:{port} ssl:default")
    wrapped = RuntimeError(f"upload to 127.0.0.1:{port} failed")
    wrapped.__cause__ = error
    for e in (error, wrapped):
        why = storage.describe(e, "writing", "gs://b/x").split(" failed: ", 1)[1]
        assert why.startswith("the store is unreachable") and storage.transient(e), why


@pytest.mark.parametrize(
    "error",
    [
        _HttpError(403),
        _HttpError(401),
        Exception("403 Forbidden: no access"),
        Exception("Forbidden"),
    ],
)
def test_a_refused_permission_is_named_with_its_status_or_text(error):
    assert storage.describe(error, "reading", "gs://b/x").endswith(
        "failed: permission denied (check the credentials of this host: docs/multi-host.md)"
    )
    assert not storage.transient(error)


def _upload_folder(local: str, url: str) -> None:
    for name in sorted(os.listdir(local)):
        if os.path.isfile(os.path.join(local, name)):
            storage.upload(os.path.join(local, name), storage.join(url, name))


def test_a_tf1_bert_checkpoint_in_a_bucket_reads_as_the_local_one(gcs, tmp_path, monkeypatch):
    from mlperf.bert.checkpoint_import import open_source

    monkeypatch.setenv("MULTIPOD_STORAGE_CACHE", str(tmp_path / "cache"))
    local = os.path.join(
        os.path.dirname(os.path.dirname(__file__)), "fixtures", "bert_checkpoints", "tf1"
    )
    _upload_folder(local, "gs://multipod-test/bert/tf1")
    ours = open_source("gs://multipod-test/bert/tf1/model.ckpt-5")
    theirs = open_source(os.path.join(local, "model.ckpt-5"))
    assert ours.format == theirs.format == "TF1 checkpoint"
    names = sorted(theirs.reader.entries)
    assert sorted(ours.reader.entries) == names and names
    for name in names:
        assert (ours.reader.read(name) == theirs.reader.read(name)).all(), name
    assert os.path.isfile(ours.config_path)  # bert_config.json came along
    with pytest.raises(FileNotFoundError):
        storage.local_mirror("gs://multipod-test/absent/model.ckpt-5")


def test_a_backbone_in_a_bucket_is_checked_and_read_like_a_local_file(gcs, tmp_path, monkeypatch):
    from mlperf.checkpoint.torch_file import load_state_dict
    from mlperf.layers.resnet_import import check_backbone_checkpoint

    monkeypatch.setenv("MULTIPOD_STORAGE_CACHE", str(tmp_path / "cache"))
    folder = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "torchvision")
    name = sorted(n for n in os.listdir(folder) if n.endswith(".pth"))[0]
    url = f"gs://multipod-test/backbones/{name}"
    storage.upload(os.path.join(folder, name), url)
    check_backbone_checkpoint({"init": {"backbone_checkpoint": url}})
    with pytest.raises(FileNotFoundError, match="is not a file"):
        check_backbone_checkpoint({"init": {"backbone_checkpoint": url + ".missing"}})
    ours = load_state_dict(storage.local_copy(url))
    theirs = load_state_dict(os.path.join(folder, name))
    assert sorted(ours) == sorted(theirs)
    assert all((ours[k] == theirs[k]).all() for k in theirs)


def test_a_workdir_in_a_missing_bucket_fails_before_anything_is_built(gcs, capsys):
    from mlperf.validate import ConfigError, check_workdir

    check_workdir("gs://multipod-test/run", "gs://multipod-test/run/checkpoints")
    said = capsys.readouterr().out
    assert said.count("no free-space check there") == 1  # said once for both paths
    with pytest.raises(ConfigError) as raised:
        check_workdir("gs://no-such-bucket/run")
    message = str(raised.value)
    assert message.startswith("--workdir gs://no-such-bucket/run: cannot write there")
    assert "\n" not in message
