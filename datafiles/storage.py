"""Files the jobs read and write, named by a local path, a ``file://`` or an ``s3://bucket/prefix`` URI.

S3 settings come from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN and AWS_REGION (or AWS_DEFAULT_REGION). A ``Path`` is always a local file.
Text is UTF-8; gzip input (detected by its magic bytes) is decompressed. JSON Lines readers skip
blank lines and name the file and the 1-based line in every error.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from urllib.parse import urlparse

from pipelines import jsontext

GZIP_MAGIC = b"\x1f\x8b"


def s3_options(env: Mapping[str, str]) -> dict[str, str]:
    """Keyword arguments for ``pyarrow.fs.S3FileSystem`` from AWS_* environment variables."""
    options: dict[str, str] = {}
    endpoint = env.get("AWS_ENDPOINT_URL")
    if endpoint:
        parsed = urlparse(endpoint)
        if parsed.scheme in ("http", "https") and parsed.netloc:
            options["scheme"] = parsed.scheme
            options["endpoint_override"] = parsed.netloc
        else:
            options["endpoint_override"] = endpoint
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        options["access_key"] = env["AWS_ACCESS_KEY_ID"]
        options["secret_key"] = env["AWS_SECRET_ACCESS_KEY"]
        if env.get("AWS_SESSION_TOKEN"):
            options["session_token"] = env["AWS_SESSION_TOKEN"]
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    return options


def resolve(uri: str | Path):
    """``(pyarrow FileSystem, path)`` for a local path, ``file://`` or ``s3://bucket/prefix`` URI."""
    from pyarrow import fs

    if isinstance(uri, Path):
        return fs.LocalFileSystem(), os.path.abspath(uri)
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"S3 URI needs a bucket: {uri!r} (expected s3://bucket/prefix)")
        return fs.S3FileSystem(**s3_options(os.environ)), f"{parsed.netloc}{parsed.path}".rstrip("/")
    if parsed.scheme == "file":
        return fs.LocalFileSystem(), os.path.abspath(parsed.path)
    if parsed.scheme:
        raise ValueError(f"unsupported URI scheme {parsed.scheme!r} in {uri!r}: use a local path or s3://")
    return fs.LocalFileSystem(), os.path.abspath(uri)


def exists(uri: str | Path) -> bool:
    """True if ``uri`` (local or s3://) is a file."""
    from pyarrow import fs

    filesystem, path = resolve(uri)
    return filesystem.get_file_info(path).type == fs.FileType.File


def read_text(uri: str | Path) -> str:
    """Whole file as UTF-8 text; gzip (detected by its magic bytes) is decompressed."""
    filesystem, path = resolve(uri)
    try:
        with filesystem.open_input_stream(path, compression=None) as stream:
            data = stream.read()
    except FileNotFoundError as err:
        raise ValueError(f"file not found: {uri}") from err
    try:
        # utf-8-sig: a leading byte-order mark (Excel, Windows tools) is dropped, as `hpd extract` drops it
        return (gzip.decompress(data) if data[:2] == GZIP_MAGIC else data).decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"{uri}: not UTF-8 text ({err.reason} at byte {err.start})") from err


def read_json_lines(uri: str | Path) -> Iterator[tuple[int, object]]:
    """``(1-based line number, JSON value)`` for each non-blank line of a JSON Lines file."""
    for number, line in enumerate(read_text(uri).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            value = jsontext.loads(line)
        except jsontext.KeyGivenTwice as err:
            raise ValueError(f"{uri} line {number}: {err} (JSON would keep only the last)") from err
        except json.JSONDecodeError as err:
            raise ValueError(f"{uri} line {number}: not valid JSON ({err.msg} at column {err.colno})") from err
        yield number, value


def read_jsonl(uri: str | Path) -> Iterator[tuple[int, dict]]:
    """As ``read_json_lines``, but every line must be a JSON object."""
    for number, row in read_json_lines(uri):
        if not isinstance(row, dict):
            raise ValueError(f"{uri} line {number}: expected a JSON object, got {type(row).__name__}")
        yield number, row
