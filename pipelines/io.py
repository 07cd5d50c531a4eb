"""Files on local disk or S3: file systems from URIs, whole-file atomic writes, listings, IPC bytes.

S3 uses the standard AWS environment: credentials, ``AWS_REGION``/``AWS_DEFAULT_REGION`` and
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` for S3-compatible stores. pyarrow's
``S3FileSystem()`` ignores ``AWS_ENDPOINT_URL`` (checked with pyarrow 26), so it is passed as
``endpoint_override``.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import functools
import json
import os
import re
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq


S3_ATTEMPTS = 10  # per request, the first included: AWS_MAX_ATTEMPTS overrides it
TEMPORARY_PREFIX = ".tmp-"  # a local file on its way to its name (``write_bytes``, ``writing``)


def _s3_settings() -> tuple[str | None, str | None]:
    """(endpoint, region) from the standard AWS environment variables."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return endpoint, os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")


_probe_attempts: contextvars.ContextVar[int | None] = contextvars.ContextVar("probe_attempts", default=None)
PROBE_ATTEMPTS = 2  # the checks before a job starts: a wrong endpoint is said in seconds, not minutes


@contextlib.contextmanager
def probing(attempts: int = PROBE_ATTEMPTS):
    """S3 requests made in this block (this thread) are tried at most ``attempts`` times: a job's
    checks before it starts, where an unreachable endpoint is a mistake to report at once."""
    token = _probe_attempts.set(attempts)
    try:
        yield
    finally:
        _probe_attempts.reset(token)


def s3_attempts() -> int:
    """Attempts per S3 request (``AWS_MAX_ATTEMPTS``, else ``S3_ATTEMPTS``; fewer in a ``probing``
    block), for boto3 and pyarrow alike, with the AWS SDKs' standard retry mode (exponential backoff
    with jitter, up to 20 s a wait): a throttled (503 SlowDown) or dropped request during a catalog
    backfill is tried again rather than stopping the job (their defaults are 3 attempts for pyarrow,
    5 for boto3)."""
    attempts = _configured_attempts()
    probe = _probe_attempts.get()
    return attempts if probe is None else min(attempts, probe)


def _configured_attempts() -> int:
    given = os.environ.get("AWS_MAX_ATTEMPTS")
    try:
        attempts = int(given) if given else S3_ATTEMPTS
    except ValueError:
        raise ValueError(f"AWS_MAX_ATTEMPTS must be a whole number, got {given!r}") from None
    if attempts < 1:
        raise ValueError(f"AWS_MAX_ATTEMPTS must be at least 1, got {attempts}")
    return attempts


# S3 errors whose usual cause is a setting, as pyarrow (the AWS C++ SDK: "AWS Error ACCESS_DENIED
# during HeadObject") and boto3 ("An error occurred (AccessDenied) when calling", its exception
# types) write them; matched on ``Type: message`` of an error and of the errors it was raised from
_S3_CAUSES = (
    ("credentials", re.compile(
        r"AWS Error (ACCESS_DENIED|INVALID_ACCESS_KEY_ID|SIGNATURE_DOES_NOT_MATCH|INVALID_SIGNATURE|"
        r"MISSING_AUTHENTICATION_TOKEN|UNRECOGNIZED_CLIENT|INVALID_CLIENT_TOKEN_ID)|"
        r"\((AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|InvalidToken|ExpiredToken)\)|"
        r"NoCredentialsError|PartialCredentialsError")),
    ("bucket", re.compile(r"AWS Error NO_SUCH_BUCKET|\(NoSuchBucket\)")),
    ("region", re.compile(r"\((PermanentRedirect|AuthorizationHeaderMalformed)\)|AWS Error \w+ \(HTTP status 301\)")),
    ("endpoint", re.compile(r"AWS Error NETWORK_CONNECTION|EndpointConnectionError|ConnectTimeoutError")),
)


def s3_hint(err: BaseException) -> str | None:
    """What to check when ``err`` is an S3 error a setting usually causes (credentials, endpoint,
    region, bucket), as a sentence naming the settings in effect; None for any other error."""
    said, seen = [], err
    while seen is not None and len(said) < 8:  # the error and those it was raised from
        said.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    cause = next((name for name, pattern in _S3_CAUSES if any(pattern.search(s) for s in said)), None)
    if cause is None:
        return None
    endpoint, region = _s3_settings()
    variable = "AWS_ENDPOINT_URL_S3" if os.environ.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
    where = f"{variable}={endpoint}" if endpoint else "AWS (AWS_ENDPOINT_URL is unset: set it for an S3-compatible store)"
    if cause == "credentials":
        return ("Check the S3 credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or the "
                f"instance role), and that they may use this bucket; requests go to {where}.")
    if cause == "bucket":
        return f"No such bucket at {where}: check the bucket's name, and AWS_REGION ({region or 'unset'})."
    if cause == "region":
        return f"The bucket is in another region: set AWS_REGION to the bucket's region (now {region or 'unset'})."
    if endpoint:
        return f"S3 was not reached at {variable}={endpoint}: is the store running there, and is the URL right?"
    return ("S3 was not reached at AWS (AWS_ENDPOINT_URL is unset): for an S3-compatible store (MinIO, SeaweedFS, "
            f"...) set AWS_ENDPOINT_URL to its URL; on AWS, check the network and AWS_REGION ({region or 'unset'}).")


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """(file system, path inside it) for a local path or an ``s3://bucket/key`` URI."""
    if uri.startswith("s3://"):
        endpoint, region = _s3_settings()
        retries = pafs.AwsStandardS3RetryStrategy(max_attempts=s3_attempts())
        return (pafs.S3FileSystem(endpoint_override=endpoint, region=region, retry_strategy=retries),
                filesystem_path(uri))
    if "://" in uri:
        raise ValueError(f"unsupported URI scheme in {uri!r}: use a local path or s3://bucket/prefix")
    return pafs.LocalFileSystem(), filesystem_path(uri)


def _s3_key(uri: str) -> tuple[str, str] | None:
    """(bucket, key) of an ``s3://`` URI, None for a local path; no file system built (one that then
    makes requests opens its own connections: a new one per small write made them slow)."""
    if not uri.startswith("s3://"):
        return None
    bucket, _, key = uri[len("s3://") :].rstrip("/").partition("/")
    return bucket, key


def to_uri(fs: pafs.FileSystem, path: str) -> str:
    return f"s3://{path}" if fs.type_name == "s3" else path


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts])


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole file so that readers see all of it or nothing, even if interrupted.

    S3: one PutObject request (boto3). Not pyarrow's output stream: an exception or a garbage-
    collected stream between open and write completes the upload with what it has, so a worker
    interrupted there would leave an empty object. Local: a hidden temporary file in the same
    directory, flushed to disk (fsync), then an atomic rename, itself flushed: after a power loss a
    file (a commit manifest) is never there without its content, nor its content without the files
    written before it.
    """
    if (s3 := _s3_key(uri)) is not None:
        _s3_client(*_s3_settings()).put_object(Bucket=s3[0], Key=s3[1], Body=data)
        return
    _write_local(filesystem(uri)[1], data, exclusive=False)


def create_new(uri: str, data: bytes) -> bool:
    """Write a whole file only if none is there: True if this call created it, False if the file
    existed (whoever wrote it; two callers at once: exactly one gets True).

    First a check (a store that ignores the condition then still finds an existing file); then, on
    S3, a conditional PutObject (``If-None-Match: *``; AWS S3 since 2024, SeaweedFS): 412, the file
    is there; 409, another conditional write of it is under way, asked again. A store that does not
    implement the condition (501) gets a plain PutObject, which two callers at the same moment can
    both make. Local: the written temporary file is hard-linked to the name, which fails if the name
    exists (``O_EXCL`` where the file system has no hard links)."""
    if exists(uri):
        return False
    fs, path = filesystem(uri)
    if fs.type_name != "s3":
        return _write_local(path, data, exclusive=True)
    import botocore.exceptions

    bucket, _, key = path.partition("/")
    client = _s3_client(*_s3_settings())
    for attempt in range(CONFLICT_ATTEMPTS):
        try:
            client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
            return True
        except botocore.exceptions.ClientError as err:
            code = err.response.get("Error", {}).get("Code")
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "PreconditionFailed" or status == 412:
                return False
            if code == "ConditionalRequestConflict" and attempt + 1 < CONFLICT_ATTEMPTS:
                time.sleep(0.2 * (attempt + 1))
                continue
            if code != "NotImplemented" and status != 501:
                raise
        break
    if exists(uri):
        return False
    client.put_object(Bucket=bucket, Key=key, Body=data)
    return True


CONFLICT_ATTEMPTS = 5  # S3 409 ConditionalRequestConflict: another conditional write of the key under way


def _write_local(path: str, data: bytes, exclusive: bool) -> bool:
    directory, name = os.path.split(path)
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f"{TEMPORARY_PREFIX}{name}-{uuid.uuid4().hex}")
    try:
        with open(temporary, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if not exclusive:
            os.replace(temporary, path)
        else:
            try:
                os.link(temporary, path)
            except FileExistsError:
                return False
            except OSError as err:  # no hard links here (some FUSE and network file systems)
                if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK,
                                     errno.ENOSYS):
                    raise
                if not _create_exclusive(path, data):
                    return False
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)
    _fsync_directory(directory)
    return True


def _create_exclusive(path: str, data: bytes) -> bool:
    """``O_EXCL``: False if ``path`` exists. Not atomic for readers (the file is empty until written);
    a write that fails removes the file, so it never blocks a later caller."""
    try:
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        os.unlink(path)
        raise
    return True


def _fsync_directory(directory: str) -> None:
    """Flush a directory's entries (a rename into it) to disk; a no-op where a directory cannot be opened."""
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:  # some file systems refuse fsync on a directory
        pass
    finally:
        os.close(handle)


def put_file(local_path: str, uri: str) -> None:
    """Put a local file (of any size) at ``uri`` whole: S3 by boto3's managed upload (multipart for
    large files; the object appears only when complete), a local path by an atomic rename (the
    file is moved)."""
    if (s3 := _s3_key(uri)) is not None:
        _s3_client(*_s3_settings()).upload_file(local_path, *s3)
        return
    fs, path = filesystem(uri)
    fs.create_dir(os.path.dirname(path), recursive=True)
    os.replace(local_path, path)


@contextlib.contextmanager
def writing(uri: str) -> Iterator[str]:
    """A local path to write a file of any size to (by a writer that wants a path, such as
    ``pyarrow.parquet.ParquetWriter``), put at ``uri`` whole once the block ends without an error,
    so readers see all of it or nothing: locally a hidden temporary file in the destination folder
    (``.tmp-<name>-<hex>``, which readers pass over), flushed to disk and renamed into place, as
    ``write_bytes`` does; on S3 a temporary file in the local temporary folder (``TMPDIR``), uploaded by
    ``put_file``. An error in the block (or an interrupt) leaves nothing at ``uri`` and removes the
    temporary file; a killed process leaves it: locally the next compaction removes it
    (``compact_journal``), in ``TMPDIR`` the next process of this host that writes to S3 here
    (``sweep_temporaries``)."""
    local = _s3_key(uri) is None
    if local:
        directory, name = os.path.split(path := filesystem(uri)[1])
        os.makedirs(directory, exist_ok=True)
        temporary = os.path.join(directory, f"{TEMPORARY_PREFIX}{name}-{uuid.uuid4().hex}")
    else:
        sweep_temporaries()
        handle, temporary = tempfile.mkstemp(prefix=_temporary_prefix(os.getpid()), suffix=f"-{uri.rsplit('/', 1)[-1]}")
        os.close(handle)
    try:
        yield temporary
        if local:
            with open(temporary, "rb+") as written:
                os.fsync(written.fileno())
            os.replace(temporary, path)
            _fsync_directory(directory)
        else:
            put_file(temporary, uri)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


def _temporary_prefix(pid: int) -> str:
    """The name ``writing``'s files in ``TMPDIR`` start with: this host's, its process-number space's
    (containers on one host that share a folder may share a host name, never that space) and the
    writer's process's, so a later process can tell the files of one that is gone
    (``sweep_temporaries``)."""
    host = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())
    return f".hpd-{host}-{_pid_space()}-{pid}-"


@functools.cache
def _pid_space() -> int:
    """The identity of this process's PID namespace (Linux: the inode of ``/proc/self/ns/pid``; 0
    where there is none to read)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


_swept: set[str] = set()  # the temporary folders this process has swept


def sweep_temporaries() -> list[str]:
    """Remove, once per process and temporary folder, the files ``writing`` left in ``TMPDIR`` for
    S3 uploads when their process was killed (a compaction's files are up to its target size): those
    of this host and PID namespace whose process no longer runs. A file of another host or
    namespace (a shared folder), of a process that runs, or of one whose number another process
    has taken since, stays. Returns the paths removed."""
    folder = tempfile.gettempdir()
    if folder in _swept:
        return []
    _swept.add(folder)
    pattern = re.compile(re.escape(_temporary_prefix(0)[: -len("0-")]) + r"(\d+)-")
    removed = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            match = pattern.match(entry.name)
            if match and int(match[1]) != os.getpid() and not _running(int(match[1])) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove
                    os.unlink(entry.path)
                    removed.append(entry.path)
    return removed


def _running(pid: int) -> bool:
    """Whether a process of this number runs on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def delete_files(uris: list[str]) -> None:
    """Delete files (one already gone is passed over): on S3 in batches of 1,000 keys a request
    (DeleteObjects), one request per file locally. An S3 key that could not be deleted raises
    ``OSError`` naming it."""
    if not uris:
        return
    if not uris[0].startswith("s3://"):
        for uri in uris:
            try:
                os.unlink(filesystem(uri)[1])
            except FileNotFoundError:
                pass
        return
    client = _s3_client(*_s3_settings())
    by_bucket: dict[str, list[str]] = {}
    for uri in uris:  # parsed here: an S3FileSystem per file would be slow to build
        bucket, _, key = uri[len("s3://") :].partition("/")
        by_bucket.setdefault(bucket, []).append(key)
    for bucket, keys in by_bucket.items():
        for start in range(0, len(keys), DELETE_BATCH):
            batch = [{"Key": key} for key in keys[start : start + DELETE_BATCH]]
            answer = client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
            if errors := answer.get("Errors"):
                first = errors[0]
                raise OSError(f"could not delete {len(errors)} file(s) of s3://{bucket}/, e.g. {first.get('Key')}: "
                              f"{first.get('Code')} {first.get('Message')}")


DELETE_BATCH = 1000  # keys per S3 DeleteObjects request (its limit)


def _s3_client(endpoint: str | None, region: str | None):
    """One boto3 client per process and setting (clients are thread-safe and slow to build)."""
    return _s3_client_with(endpoint, region, s3_attempts())


@functools.lru_cache(maxsize=None)
def _s3_client_with(endpoint: str | None, region: str | None, attempts: int):
    import boto3
    from botocore.config import Config

    retries = Config(retries={"mode": "standard", "max_attempts": attempts})
    return boto3.client("s3", endpoint_url=endpoint, region_name=region, config=retries)


def write_parquet(uri: str, table: pa.Table) -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    write_bytes(uri, sink.getvalue().to_pybytes())


def write_json(uri: str, data: object) -> None:
    write_bytes(uri, json.dumps(data, indent=1, sort_keys=True).encode())


def read_bytes(uri: str) -> bytes:
    fs, path = filesystem(uri)
    with fs.open_input_stream(path) as stream:
        return stream.read()


def read_json(uri: str) -> object:
    data = read_bytes(uri)
    try:
        return json.loads(data)
    except json.JSONDecodeError as err:
        raise ValueError(f"{uri} is not valid JSON ({len(data)} bytes): {err}") from err


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def exist(uris: list[str]) -> list[bool]:
    """``exists`` of each of ``uris``, all on the file system of the first (one S3 file system, and its
    connections, for them all: a new one per request costs a connection each)."""
    if not uris:
        return []
    fs = filesystem(uris[0])[0]
    infos = fs.get_file_info([filesystem_path(uri) for uri in uris])
    return [info.type != pafs.FileType.NotFound for info in infos]


def filesystem_path(uri: str) -> str:
    """The path of ``uri`` inside its file system, as ``filesystem`` gives it, without building one."""
    if uri.startswith("s3://"):
        return uri[len("s3://") :].rstrip("/")
    return os.path.abspath(uri).rstrip("/") or "/"


def delete_if_exists(uri: str) -> None:
    fs, path = filesystem(uri)
    if fs.get_file_info(path).type == pafs.FileType.File:
        fs.delete_file(path)


def list_paths(uri: str) -> tuple[pafs.FileSystem, list[pafs.FileInfo]]:
    """The file system of ``uri`` and every file under it (recursive), sorted by path; none if it
    does not exist. One file system for them all (an S3 one is slow to build)."""
    fs, root = filesystem(uri)
    if fs.get_file_info(root).type != pafs.FileType.Directory:
        return fs, []
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    return fs, sorted((i for i in infos if i.type == pafs.FileType.File), key=lambda i: i.path)


def list_files(uri: str) -> list[str]:
    """URIs of all files under ``uri`` (recursive); none if it does not exist."""
    fs, infos = list_paths(uri)
    return [to_uri(fs, i.path) for i in infos]


def table_to_bytes(table: pa.Table) -> bytes:
    """Arrow IPC stream bytes: how one chunk's rows travel between stages as a single value."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def table_from_bytes(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
