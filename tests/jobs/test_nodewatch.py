"""The local Ray node dying under `hpd extract`: one hpd line with the resume hint, at once."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from jobs import nodewatch
from tests.pipelines.helpers import (
    REPO,
    WAIT_SECONDS,
    catalog,
    check_exactly_once,
    commits,
    extract_args,
    jsonl,
    wait_for,
)


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_process_that_ends_in_the_block_is_said_once_and_one_that_ends_after_it_is_not():
    lost, ended_after = _sleeper(), _sleeper()
    try:
        said = []
        with nodewatch.watching({"raylet": psutil.Process(lost.pid)}, said.append, poll_seconds=0.1):
            lost.kill()  # not waited for: a zombie, as a killed child of the driver is until Ray reaps it
            deadline = time.time() + 10
            while not said and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)
        assert len(said) == 1 and f"Ray's local node stopped under the job: its raylet (pid {lost.pid}) ended" in said[0]

        said = []
        with nodewatch.watching({"gcs_server": psutil.Process(ended_after.pid)}, said.append, poll_seconds=0.1):
            pass
        ended_after.kill()  # the node's own shutdown after the job: not a loss
        time.sleep(0.5)
        assert said == []
    finally:
        for process in (lost, ended_after):
            process.kill()
            process.wait()


@pytest.mark.slow
def test_a_killed_raylet_ends_the_job_with_one_line_and_the_job_resumes(tmp_path):
    records, valid = catalog(300)
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(records))
    output = str(tmp_path / "out")
    argv = extract_args(source, output, "--chunk-rows", 10, "--dry-run-seconds-per-prompt", 0.05)
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}  # its own local Ray
    command = [sys.executable, "-m", "jobs.cli", "extract", *argv]
    driver = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: len(commits(output)) >= 2 or driver.poll() is not None, "commits")
        raylets = [child for child in psutil.Process(driver.pid).children() if child.name() == "raylet"]
        assert len(raylets) == 1, "the driver started no local raylet of its own"
        raylets[0].send_signal(signal.SIGKILL)
        log = driver.communicate(timeout=60)[0].decode()
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 1, log[-3000:]
    failed = [line for line in log.splitlines() if line.startswith("hpd extract: failed:")]
    assert failed == [f"hpd extract: failed: Ray's local node stopped under the job: its raylet (pid {raylets[0].pid}) "
                      "ended, killed by a signal or by the system's out-of-memory killer (`dmesg` says which; Ray's "
                      "logs are in /tmp/ray/session_latest/logs); run the same command again to resume (the chunks "
                      "committed so far, if any, are kept)"], log[-3000:]

    resumed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=WAIT_SECONDS)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert check_exactly_once(output, records, valid)["resumed"]
