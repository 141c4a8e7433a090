"""The one path layer of the project: local paths and object-store URLs (`gs://bucket/x`).

Every path a run reads or writes goes through here: the work directory, checkpoints,
logs, TensorBoard and profile folders, and every input file. Local paths behave exactly
as plain files do (made absolute, `~` expanded); a URL is read and written through
fsspec's gcsfs, the client behind `etils.epath` (orbax's path type) when TensorFlow is
absent, so the run's files and orbax's checkpoint metadata share one client
(docs/design.md says why).

An object store has no directories, no appends and no atomic renames: `makedirs` is a
no-op there, a write replaces a whole object (atomic by itself), and `rename` copies and
deletes. Errors of the store (missing bucket, permission denied, server unreachable) come
out as `StorageError`, one line naming the store, the operation and the path.

Tests and local development point the standard endpoint variables at a GCS-protocol
server: `STORAGE_EMULATOR_HOST` (gcsfs) and, derived from it when unset,
`TENSORSTORE_GCS_HTTP_URL` (tensorstore, which writes orbax's arrays).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO, Any

# Under an emulator: no credentials lookup (nothing may reach a metadata server), no
# probe of the bucket's layout (gcsfs asks a gRPC control endpoint that only real GCS
# has, and waits a minute for it). Set before gcsfs or tensorstore read them.
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


def configure_emulator() -> None:
    """Points every client at `$STORAGE_EMULATOR_HOST` when it is set (no-op otherwise)."""
    host = os.environ.get(EMULATOR_ENV, "")
    if not host:
        return
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    os.environ.setdefault("FSSPEC_GS_TOKEN", "anon")
    os.environ.setdefault("FSSPEC_GCS_TOKEN", "anon")
    os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", host)
    os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")


configure_emulator()

# gcsfs logs every request that ran out of retries with its traceback; the error itself
# reaches the caller, which reports it in one line (StorageError).
logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
# fsspec announces every read-ahead cache it opens at INFO.
logging.getLogger("fsspec").setLevel(logging.WARNING)

_URL = re.compile(r"^([a-z][a-z0-9+.-]*)://")
SUPPORTED_SCHEMES = ("gs",)


class StorageError(OSError):
    """An object-store operation failed: one line naming the store, operation and path.

    `transient` is True when the store could not be reached or answered that it is busy
    or failing (a timeout, a refused connection, HTTP 408, 429 or 5xx): the same
    operation may succeed later, so a run stopped by it is started again by a supervisor
    (exit code 69), unlike a missing bucket or a permission refused."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


def scheme(path: str) -> str | None:
    """'gs' for gs://..., None for a local path."""
    m = _URL.match(str(path))
    return m.group(1) if m else None


def is_url(path: str) -> bool:
    """True for an object-store URL (gs://bucket/...), False for a local path."""
    return scheme(path) is not None


def resolve(path: str) -> str:
    """The canonical form of a path: local ones absolute with `~` expanded, URLs without
    a trailing slash. Raises StorageError for a scheme the project cannot open."""
    path = str(path)
    s = scheme(path)
    if s is None:
        return os.path.abspath(os.path.expanduser(path))
    if s not in SUPPORTED_SCHEMES:
        raise StorageError(
            f"{path}: the {s}:// scheme is not supported (supported: local paths and "
            f"{', '.join(x + '://' for x in SUPPORTED_SCHEMES)})"
        )
    if len(path.rstrip("/")) <= len(f"{s}://"):
        raise StorageError(f"{path}: no bucket named; give {s}://BUCKET/FOLDER")
    return path.rstrip("/")


def join(base: str, *parts: str) -> str:
    """`base`/`parts` for local paths and URLs alike."""
    if is_url(base):
        out = str(base).rstrip("/")
        for p in parts:
            out = f"{out}/{str(p).strip('/')}"
        return out
    return os.path.join(base, *parts)


def parent(path: str) -> str:
    """The folder holding `path`."""
    if is_url(path):
        return str(path).rstrip("/").rsplit("/", 1)[0]
    return os.path.dirname(path)


def basename(path: str) -> str:
    return str(path).rstrip("/").rsplit("/", 1)[-1]


def bucket(path: str) -> str:
    """The store a URL lives in, e.g. gs://bucket; the path itself for a local path."""
    if not is_url(path):
        return path
    s = scheme(path)
    return f"{s}://{path[len(s) + 3 :].split('/', 1)[0]}"


def _fs(path: str):
    """The fsspec file system of a URL (gcsfs for gs://)."""
    import fsspec

    return fsspec.filesystem(scheme(path))


def timeout_s() -> float:
    """The longest one store operation may take, retries included
    ($MULTIPOD_STORE_TIMEOUT_S, default 300 s): gcsfs retries each request 6 times and
    nests them for uploads, so a store that is gone would otherwise hold a caller for many
    minutes before it fails."""
    return float(os.environ.get("MULTIPOD_STORE_TIMEOUT_S", "300"))


def _call(path: str, method: str, *args: Any, **kwargs: Any) -> Any:
    """`fs.method(*args)` on the file system of `path`, bounded by timeout_s()."""
    return getattr(_fs(path), method)(*args, timeout=timeout_s(), **kwargs)


_PERMISSION_DENIED = "permission denied (check the credentials of this host: docs/multi-host.md)"
# HTTP 403 as a status in an error's text, not digits of an address or a number.
_FORBIDDEN_TEXT = re.compile(r"(?<![\d:.])403(?!\d)")


@contextlib.contextmanager
def errors(operation: str, path: str) -> Iterator[None]:
    """Turns an object store's errors into StorageError (one line); local errors pass."""
    if not is_url(path):
        yield
        return
    try:
        yield
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, FileExistsError):
        raise
    except StorageError:
        raise
    except Exception as e:  # noqa: BLE001 - gcsfs, aiohttp and google-auth raise many kinds
        raise StorageError(describe(e, operation, path), transient=transient(e)) from e


def describe(error: BaseException, operation: str, path: str) -> str:
    """One line for a failed store operation: the store, what was done, and why."""
    text = " ".join(str(error).split())[:300] or type(error).__name__
    code = getattr(error, "code", None)
    store = bucket(path)
    # A refusal read off the text only once the store is known to have answered: an
    # unreachable store's text names its address, whose port may hold the digits 403.
    if code in (401, 403):
        why = _PERMISSION_DENIED
    elif code == 404 or "bucket does not exist" in text.lower():
        why = f"not found ({text})"
    elif _unreachable(error):
        endpoint = os.environ.get(EMULATOR_ENV, "the storage endpoint")
        why = f"the store is unreachable ({endpoint}: {type(error).__name__})"
    elif _FORBIDDEN_TEXT.search(text[:40]) or "Forbidden" in text:
        why = _PERMISSION_DENIED
    else:
        why = f"{type(error).__name__}: {text}"
    return f"{store}: {operation} {path} failed: {why}"


# HTTP answers that say "not now" rather than "no": a request timeout, too many requests,
# and the server's own failures. Google's client libraries retry the same set.
TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})


def transient(error: BaseException) -> bool:
    """True when a store's error may pass by itself: the store unreachable or timing out,
    or an HTTP status in TRANSIENT_HTTP anywhere in the error's chain."""
    return _unreachable(error) or any(
        getattr(e, "code", None) in TRANSIENT_HTTP for e in _chain(error)
    )


def _unreachable(error: BaseException) -> bool:
    return any(
        isinstance(e, ConnectionError | TimeoutError) or "Connect" in type(e).__name__
        for e in _chain(error)
    )


def _chain(error: BaseException) -> Iterator[BaseException]:
    """The error and the errors it was raised from or during, outermost first."""
    seen: BaseException | None = error
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


# ---- queries ------------------------------------------------------------------------------
def exists(path: str) -> bool:
    if not is_url(path):
        return os.path.exists(path)
    with errors("checking", path):
        return _call(path, "exists", path)


def isdir(path: str) -> bool:
    """A local folder, or a URL prefix under which at least one object exists."""
    if not is_url(path):
        return os.path.isdir(path)
    with errors("listing", path):
        return _call(path, "isdir", path)


def isfile(path: str) -> bool:
    if not is_url(path):
        return os.path.isfile(path)
    with errors("checking", path):
        return _call(path, "isfile", path)


def size(path: str) -> int:
    """Bytes of a file or object (FileNotFoundError when absent)."""
    if not is_url(path):
        return os.path.getsize(path)
    with errors("reading the size of", path):
        return int(_call(path, "size", path))


def size_or_zero(path: str) -> int:
    try:
        return size(path)
    except FileNotFoundError:
        return 0


def file_version(path: str) -> tuple[int, int | str]:
    """(bytes, version) of a file, for cache keys of what was built from it: a local
    file's modification time in ns, an object's generation (a rewrite gives a new one).
    FileNotFoundError when absent."""
    if not is_url(path):
        st = os.stat(path)
        return st.st_size, st.st_mtime_ns
    with errors("reading the version of", path):
        info = _call(path, "info", path)
    return int(info.get("size") or 0), str(info.get("generation") or info.get("etag") or "")


def listdir(path: str) -> list[str]:
    """Names directly under a folder or prefix ([] when there is none), sorted."""
    if not is_url(path):
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
    with errors("listing", path):
        try:
            entries = _call(path, "ls", path, detail=False, refresh=True)
        except FileNotFoundError:
            return []
    return sorted({basename(e) for e in entries if basename(e)})


def file_sizes(path: str) -> dict[str, int]:
    """Every file under a folder or prefix, relative path -> bytes."""
    if not is_url(path):
        out = {}
        for root, _, files in os.walk(path):
            for name in files:
                full = os.path.join(root, name)
                out[os.path.relpath(full, path)] = os.path.getsize(full)
        return out
    with errors("listing", path):
        fs = _fs(path)
        try:
            found = _call(path, "find", path, detail=True, refresh=True)
        except FileNotFoundError:
            return {}
    prefix = fs._strip_protocol(path).rstrip("/") + "/"
    return {
        name[len(prefix) :]: int(info.get("size") or 0)
        for name, info in found.items()
        if name.startswith(prefix) and info.get("type") != "directory"
    }


def glob(pattern: str) -> list[str]:
    """Paths matching a shell pattern (one level of `*` per folder), sorted."""
    if not is_url(pattern):
        import glob as _glob

        return sorted(_glob.glob(os.path.expanduser(pattern)))
    with errors("listing", pattern):
        found = _call(pattern, "glob", pattern)
    s = scheme(pattern)
    return sorted(f"{s}://{f}" if not is_url(f) else f for f in found)


# ---- reading and writing ------------------------------------------------------------------
def open_file(path: str, mode: str = "rb", **kwargs: Any) -> IO:
    """An open file: a local one, or an object read in ranges (seek works) or written
    whole on close."""
    if not is_url(path):
        return open(path, mode, **kwargs)  # noqa: SIM115 - the caller closes it
    with errors("opening", path):
        return _fs(path).open(path, mode, **kwargs)


def read_bytes(path: str) -> bytes:
    with open_file(path, "rb") as f, errors("reading", path):
        return f.read()


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def read_range(path: str, offset: int, length: int) -> bytes:
    """`length` bytes of a file from `offset` (a ranged read of an object: no download)."""
    if not is_url(path):
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length)
    with errors("reading", path):
        return _call(path, "cat_file", path, start=offset, end=offset + length)


def write_bytes(path: str, data: bytes) -> None:
    """Writes a whole file atomically: a local one through a temporary file and a rename,
    an object in one upload (a reader sees the old or the new object, never part)."""
    if not is_url(path):
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
        return
    with errors("writing", path):
        _call(path, "pipe_file", path, data)


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def create_exclusive(path: str, data: bytes) -> bool:
    """Writes `path` only if it does not exist (the store's atomic create: a local
    temporary file linked to `path`, an object upload with generation precondition 0).
    False if it existed. A reader sees the whole file or none."""
    if not is_url(path):
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        return True
    with errors("creating", path):
        try:
            _call(path, "pipe_file", path, data, mode="create")
        except FileExistsError:
            return False
        except Exception as e:  # noqa: BLE001 - gcsfs reports a failed precondition as 412
            if getattr(e, "code", None) == 412 or "412" in str(e)[:60]:
                return False
            raise
    return True


def probe_write(folder: str, name: str = "") -> None:
    """Writes and deletes a small file in `folder` (created if local): an unwritable
    folder, a full disk, a missing bucket or an unreachable store fails here, as an
    OSError (StorageError for a store), before the real writes begin."""
    probe = join(folder, name or f".write_probe_{os.getpid()}")
    if is_url(folder):
        write_bytes(probe, b"\0" * 4096)
        remove(probe)
        return
    os.makedirs(folder, exist_ok=True)
    with open(probe, "wb") as f:
        f.write(b"\0" * 4096)
        f.flush()
        os.fsync(f.fileno())
    os.remove(probe)


def upload(local: str, remote: str) -> None:
    """Copies a local file to `remote` (a URL or another local path)."""
    if not is_url(remote):
        os.makedirs(os.path.dirname(os.path.abspath(remote)), exist_ok=True)
        shutil.copyfile(local, remote)
        return
    with errors("uploading to", remote):
        _call(remote, "put_file", local, remote)


def download(remote: str, local: str) -> None:
    """Copies `remote` (a URL or a local path) to the local file `local`."""
    os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
    if not is_url(remote):
        shutil.copyfile(remote, local)
        return
    with errors("downloading", remote):
        _call(remote, "get_file", remote, local)


# ---- changing the tree --------------------------------------------------------------------
def makedirs(path: str) -> None:
    """Creates a local folder (and its parents); nothing to do for an object store."""
    if not is_url(path):
        os.makedirs(path, exist_ok=True)


def remove(path: str) -> None:
    if not is_url(path):
        os.remove(path)
        return
    with errors("deleting", path):
        _call(path, "rm_file", path)


def rmtree(path: str) -> None:
    """Deletes a folder or every object under a prefix (no error when absent)."""
    if not is_url(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    with errors("deleting", path), contextlib.suppress(FileNotFoundError):
        _call(path, "rm", path, recursive=True)


def rename(src: str, dst: str) -> None:
    """Moves a file or folder; on an object store every object is copied, then deleted
    (not atomic: callers write a marker they check, as orbax does)."""
    if not is_url(src):
        os.rename(src, dst)
        return
    with errors("moving", src):
        _fs(src).mv(src, dst, recursive=True)


# ---- a local copy of a remote input -------------------------------------------------------
def cache_root() -> str:
    """Where local copies of remote inputs go ($MULTIPOD_STORAGE_CACHE, else
    ~/.cache/multipod/storage)."""
    return os.path.expanduser(os.environ.get("MULTIPOD_STORAGE_CACHE", "~/.cache/multipod/storage"))


# Bounded: the oldest copies go first once the cache holds more than this.
CACHE_LIMIT_BYTES = int(os.environ.get("MULTIPOD_STORAGE_CACHE_BYTES", str(8 << 30)))


def local_copy(path: str) -> str:
    """A local file with `path`'s bytes: `path` itself when local; for a URL a copy in a
    cache keyed by the URL, the object's size and its generation (a changed object is
    fetched again), the least recently used copies removed beyond CACHE_LIMIT_BYTES.
    For inputs that a library opens by name (a vocabulary, COCO annotations)."""
    if not is_url(path):
        return path
    with errors("reading", path):
        info = _call(path, "info", path)
    version = f"{path}|{info.get('size')}|{info.get('generation') or info.get('etag') or ''}"
    key = hashlib.sha256(version.encode()).hexdigest()[:24]
    root = cache_root()
    target = os.path.join(root, key, basename(path))
    if os.path.exists(target):
        os.utime(target)  # recently used
        return target
    tmp = f"{target}.{os.getpid()}.partial"
    download(path, tmp)
    os.replace(tmp, target)
    _trim_cache(root, keep=target)
    return target


def _trim_cache(root: str, keep: str) -> None:
    entries = []
    for folder in os.listdir(root):
        for name in os.listdir(os.path.join(root, folder)):
            full = os.path.join(root, folder, name)
            if full != keep and not name.endswith(".partial"):
                st = os.stat(full)
                entries.append((st.st_mtime, st.st_size, full))
    total = sum(e[1] for e in entries) + os.path.getsize(keep)
    for _, nbytes, full in sorted(entries):
        if total <= CACHE_LIMIT_BYTES:
            break
        with contextlib.suppress(OSError):
            os.remove(full)
            os.rmdir(os.path.dirname(full))
        total -= nbytes


def local_mirror(path: str) -> str:
    """A local path standing for `path`, for readers that open a file's siblings by name
    (a TF1 checkpoint's .index and .data shards, a config.json beside the weights): `path`
    itself when local; for a URL, the files of its folder (the URL itself when it is a
    folder) are copied into the cache, keyed by their names, sizes and generations, and
    the copy of `path` is returned."""
    if not is_url(path):
        return path
    folder = path if isdir(path) else parent(path)
    with errors("listing", folder):
        listing = _call(folder, "ls", folder, detail=True, refresh=True)
        infos = [i for i in listing if i.get("type") == "file"]
    if not infos:
        raise FileNotFoundError(f"{path}: no such object or folder")
    version = "|".join(
        f"{i['name']}:{i.get('size')}:{i.get('generation') or i.get('etag') or ''}"
        for i in sorted(infos, key=lambda i: i["name"])
    )
    key = hashlib.sha256(version.encode()).hexdigest()[:24]
    target = os.path.join(cache_root(), key, basename(folder))
    done = os.path.join(target, ".complete")
    if not os.path.exists(done):
        for info in infos:
            name = basename(info["name"])
            download(join(folder, name), os.path.join(target, name))
        open(done, "w").close()
    if path == folder:
        return target
    return os.path.join(target, basename(path))


def staging_dir(workdir: str) -> str:
    """A local folder standing for a remote work directory: files that are appended to
    (logs, TensorBoard events, profiles) are written here and uploaded. A local work
    directory is its own staging folder."""
    if not is_url(workdir):
        return workdir
    key = hashlib.sha256(workdir.encode()).hexdigest()[:16]
    path = os.path.join(cache_root(), "workdirs", f"{key}-{basename(workdir)}")
    os.makedirs(path, exist_ok=True)
    return path


__all__ = [
    "EMULATOR_ENV",
    "StorageError",
    "basename",
    "bucket",
    "configure_emulator",
    "create_exclusive",
    "download",
    "errors",
    "exists",
    "file_sizes",
    "file_version",
    "glob",
    "is_url",
    "isdir",
    "isfile",
    "join",
    "listdir",
    "local_copy",
    "local_mirror",
    "makedirs",
    "open_file",
    "probe_write",
    "parent",
    "read_bytes",
    "read_range",
    "read_text",
    "remove",
    "rename",
    "resolve",
    "rmtree",
    "scheme",
    "size",
    "size_or_zero",
    "staging_dir",
    "upload",
    "write_bytes",
    "write_text",
]
