"""`ray job submit --working-dir . -- hpd extract ...` against a separate `ray start --head`.

Ray 2.60 clusters use token authentication: the head and every client need ``RAY_AUTH_MODE=token``
and the same token (``RAY_AUTH_TOKEN``, or the file ``~/.ray/auth_token``). The job's driver gets
the S3 settings through the runtime environment.
"""

import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time

import psutil
import pytest

from tests.conftest import free_port

from .helpers import REPO, SAMPLE, commits, read_attributes, report, upload, wait_for

SUBMIT_SECONDS = 600


def _head_processes(temp_dir: str) -> list[psutil.Process]:
    """Processes of the head started with ``temp_dir`` (found by their command line) and children."""
    found = {}
    for process in psutil.process_iter(["cmdline"]):
        if temp_dir in " ".join(process.info["cmdline"] or ()):
            for member in [process, *process.children(recursive=True)]:
                found[member.pid] = member
    return list(found.values())


def _stop_head(temp_dir: str) -> None:
    processes = _head_processes(temp_dir)
    for process in processes:
        try:
            process.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(processes, timeout=20)
    for process in alive:
        process.kill()


@pytest.mark.cluster
def test_ray_job_submit_runs_the_job_on_a_started_head(s3_server):
    bucket = s3_server.make_bucket("cluster")
    upload(s3_server, bucket, "in/sample.jsonl", SAMPLE.read_bytes())
    temp_dir = tempfile.mkdtemp(prefix="rayc-", dir="/tmp")
    dashboard = free_port()
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    env.pop("RAY_ADDRESS", None)
    head = [
        "ray", "start", "--head", f"--port={free_port()}", f"--dashboard-port={dashboard}",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", "--num-cpus=2", f"--temp-dir={temp_dir}",
        f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}", f"--metrics-export-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}", "--disable-usage-stats",
    ]
    subprocess.run(head, env=env, check=True, capture_output=True, timeout=120)
    try:
        runtime_env = {"env_vars": s3_server.env}
        output = f"s3://{bucket}/out"
        submit = [
            "ray", "job", "submit", "--address", f"http://127.0.0.1:{dashboard}", "--working-dir", ".",
            "--runtime-env-json", json.dumps(runtime_env), "--",
            "hpd", "extract", "--input", f"s3://{bucket}/in", "--attributes", "samples/attributes.json",
            "--output", output, "--decoder", "dry-run",
        ]
        started = time.time()
        done = subprocess.run(submit, cwd=REPO, env=env, capture_output=True, timeout=SUBMIT_SECONDS)
        log = done.stdout.decode() + done.stderr.decode()
        assert done.returncode == 0, log[-4000:]
        assert "succeeded" in log
        result = report(output)
        assert result["rows_in"] == result["products_out"] == 40 and result["rows_rejected"] == 0
        assert len(set(read_attributes(output).column("product_id").to_pylist())) == 40
        print(f"\nray job submit: {time.time() - started:.0f} s")

        # `ray job stop` sends SIGTERM and, 3 s later (RAY_JOB_STOP_WAIT_TIME_S), SIGKILL: the job ends
        # cleanly within that, and the same command submitted again resumes it
        address = ["--address", f"http://127.0.0.1:{dashboard}"]
        slow = [*submit, "--chunk-rows", "5", "--dry-run-seconds-per-prompt", "2"]  # 8 chunks of about 4 s
        slow[slow.index("--output") + 1] = stopped = f"s3://{bucket}/stopped"
        job_id = f"hpd-stop-{secrets.token_hex(4)}"
        subprocess.run([*slow[:3], "--submission-id", job_id, "--no-wait", *slow[3:]], cwd=REPO, env=env, check=True,
                       capture_output=True, timeout=SUBMIT_SECONDS)
        wait_for(lambda: len(commits(stopped)) >= 1, "a committed chunk")
        subprocess.run(["ray", "job", "stop", *address, job_id], env=env, check=True, capture_output=True,
                       timeout=SUBMIT_SECONDS)
        logs = subprocess.run(["ray", "job", "logs", *address, job_id], env=env, capture_output=True,
                              timeout=120).stdout.decode()
        assert "hpd extract: stopped (SIGTERM); run the same command again to resume" in logs, logs[-4000:]
        assert "SIGTERM received" not in logs and "Traceback" not in logs, logs[-4000:]
        assert 1 <= len(commits(stopped)) < 8  # stopped before its 8 chunks were done
        again = subprocess.run(slow, cwd=REPO, env=env, capture_output=True, timeout=SUBMIT_SECONDS)
        assert again.returncode == 0, (again.stdout + again.stderr).decode()[-4000:]
        result = report(stopped)
        assert result["rows_in"] == result["products_out"] == 40 and result["attempts"] == 2
    finally:
        _stop_head(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
