"""Helpers for the pipeline tests: run `hpd extract`, read its outputs, make inputs."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads

from jobs import extract
from pipelines import io

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "samples" / "oa-mine-sample.jsonl"
SAMPLE_ATTRIBUTES = REPO / "samples" / "attributes.json"


def sample_records() -> list[dict]:
    return [json.loads(line) for line in SAMPLE.read_text().splitlines()]


def extract_args(input_uri, output_uri, attributes=SAMPLE_ATTRIBUTES, *extra) -> list[str]:
    return ["--input", str(input_uri), "--attributes", str(attributes), "--output", str(output_uri),
            "--decoder", "dry-run", *map(str, extra)]


def run_extract(argv: list[str]) -> int:
    """`hpd extract` in this process (it joins the session's Ray)."""
    parser = argparse.ArgumentParser()
    extract.add_arguments(parser)
    return extract.run(parser.parse_args(argv))


def start_extract(argv: list[str], address: str) -> subprocess.Popen:
    """`hpd extract` as a separate driver process joined to the session's Ray."""
    command = [sys.executable, "-m", "jobs.cli", "extract", *argv, "--address", address]
    return subprocess.Popen(command, cwd=REPO, env=dict(os.environ), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def read_attributes(output_uri: str) -> pa.Table:
    fs, path = io.filesystem(io.join(output_uri, "attributes"))
    dataset = pads.dataset(path, filesystem=fs, format="parquet", partitioning="hive")
    return dataset.to_table()


def read_rejected(output_uri: str) -> list[dict]:
    rows = []
    for uri in io.list_files(io.join(output_uri, "rejected")):
        fs, path = io.filesystem(uri)
        rows += pads.dataset(path, filesystem=fs, format="parquet").to_table().to_pylist()
    return rows


def report(output_uri: str) -> dict:
    return io.read_json(io.join(output_uri, "_report.json"))


def commits(output_uri: str) -> list[str]:
    return [u for u in io.list_files(io.join(output_uri, "_commits")) if not u.rsplit("/", 1)[1].startswith("_")]


def upload(s3_server, bucket: str, key: str, data: bytes) -> str:
    s3_server.client().put_object(Bucket=bucket, Key=key, Body=data)
    return f"s3://{bucket}/{key}"


def jsonl(records: list) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records).encode()
