"""S3 model artifacts are copied once per node into the cache and reused; local names pass through."""

import os
import subprocess
import sys
from pathlib import Path

from pipelines.artifacts import CACHE_ENV, resolve_model_path

FILES = {"config.json": b'{"model_type": "llama"}', "model.safetensors": os.urandom(300_000), "sub/tok.json": b"{}"}


def _upload_model(s3_server, bucket):
    for name, data in FILES.items():
        s3_server.client().put_object(Bucket=bucket, Key=f"models/tiny/{name}", Body=data)
    return f"s3://{bucket}/models/tiny/"


def test_local_paths_and_hub_ids_pass_through():
    assert resolve_model_path("default") == "default"
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_model_path("/models/x") == "/models/x"


def test_s3_prefix_is_downloaded_once_and_shared(s3_server, tmp_path, monkeypatch):
    bucket = s3_server.make_bucket("model")
    uri = _upload_model(s3_server, bucket)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    # four processes on one "node" resolve at once: one downloads, the others wait and reuse it
    script = "import sys; from pipelines.artifacts import resolve_model_path; print(resolve_model_path(sys.argv[1]))"
    procs = [subprocess.Popen([sys.executable, "-c", script, uri], stdout=subprocess.PIPE) for _ in range(4)]
    paths = {p.communicate(timeout=120)[0].decode().strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    (path,) = paths
    directory = Path(path)
    assert directory.parent == tmp_path / "cache" / "models" / "s3" / bucket
    assert {str(f.relative_to(directory)): f.read_bytes() for f in directory.rglob("*") if f.is_file()} == FILES
    leftovers = [p.name for p in directory.parent.iterdir() if p.name.startswith(".tmp-")]
    assert leftovers == []
    mtime = (directory / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path(uri) == path  # cached: no second download
    assert (directory / "model.safetensors").stat().st_mtime_ns == mtime


def test_changed_model_gets_a_new_directory_and_single_files_resolve_to_the_file(s3_server, tmp_path, monkeypatch):
    bucket = s3_server.make_bucket("model")
    uri = _upload_model(s3_server, bucket)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    first = resolve_model_path(uri)
    s3_server.client().put_object(Bucket=bucket, Key="models/tiny/config.json", Body=b'{"model_type": "qwen3moe"}')
    second = resolve_model_path(uri)  # the listing (names, sizes, times) changed
    assert first != second and Path(second, "config.json").read_bytes() == b'{"model_type": "qwen3moe"}'
    s3_server.client().put_object(Bucket=bucket, Key="gguf/model-q4.gguf", Body=b"GGUF...")
    single = resolve_model_path(f"s3://{bucket}/gguf/model-q4.gguf")
    assert single.endswith("/model-q4.gguf") and Path(single).read_bytes() == b"GGUF..."
