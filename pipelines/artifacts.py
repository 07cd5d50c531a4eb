"""Model and adapter artifacts on S3: copied once per node into a local cache, shared by all actors.

``resolve_model_path("s3://bucket/prefix/")`` lists the prefix, derives a cache directory from the
URI and the listing (names, sizes, modification times; a changed model gets a new directory), and
downloads it under an exclusive file lock into a hidden temporary directory that is renamed into
place when complete. Every other actor on the node waits for the lock, then finds the directory and
returns at once. Local paths and hub ids are returned unchanged.

Cache root: ``$HPD_CACHE_DIR`` or ``~/.cache/hpd-ave`` (the engine's ModelConfig uses the same).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import uuid
from pathlib import Path

import pyarrow.fs as pafs

from pipelines import io

CACHE_ENV = "HPD_CACHE_DIR"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "hpd-ave")


def _listing(fs: pafs.FileSystem, path: str) -> tuple[str, list[pafs.FileInfo]]:
    """(directory the files are relative to, file infos) for one object or a prefix."""
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return path.rsplit("/", 1)[0], [info]
    if info.type != pafs.FileType.Directory:
        raise ValueError(f"model artifact {path!r} not found on S3")
    files = [i for i in fs.get_file_info(pafs.FileSelector(path, recursive=True)) if i.type == pafs.FileType.File]
    if not files:
        raise ValueError(f"model artifact prefix {path!r} holds no files")
    return path, files


def _download(fs: pafs.FileSystem, base: str, files: list[pafs.FileInfo], target: Path) -> None:
    for info in files:
        local = target / info.path[len(base) :].lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        with fs.open_input_stream(info.path) as source, open(local, "wb") as sink:
            shutil.copyfileobj(source, sink)


def s3_fingerprint(uri: str) -> str:
    """A hash of an S3 artifact's listing (names, sizes, modification times): another when it changed."""
    fs, path = io.filesystem(uri)
    return _fingerprint(uri, _listing(fs, path)[1])


def _fingerprint(uri: str, files: list[pafs.FileInfo]) -> str:
    fingerprint = hashlib.sha256(uri.encode())
    for info in sorted(files, key=lambda i: i.path):
        fingerprint.update(f"|{info.path}|{info.size}|{info.mtime_ns}".encode())
    return fingerprint.hexdigest()


def resolve_model_path(uri: str) -> str:
    """A local path for ``uri``: s3:// artifacts are downloaded once per node; others pass through."""
    if not uri.startswith("s3://"):
        return uri
    fs, path = io.filesystem(uri)
    base, files = _listing(fs, path)
    bucket = path.split("/", 1)[0]
    directory = cache_root() / "models" / "s3" / bucket / _fingerprint(uri, files)[:16]
    # a single object (e.g. a .gguf file) resolves to the file inside the directory
    answer = directory / files[0].path[len(base) :].lstrip("/") if base != path else directory
    if directory.is_dir():
        return str(answer)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not directory.is_dir():
            temporary = directory.parent / f".tmp-{directory.name}-{uuid.uuid4().hex}"
            try:
                _download(fs, base, files, temporary)
                os.rename(temporary, directory)
            finally:
                shutil.rmtree(temporary, ignore_errors=True)
    return str(answer)
