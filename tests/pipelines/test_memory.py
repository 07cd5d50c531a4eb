"""Memory stays bounded as the input grows: 10x more rows, at most 1.5x the peak memory.

Each run is a fresh `hpd extract` (its own local Ray, started by the driver) with the dry-run decoder;
the peak is the largest sum of proportional set sizes (PSS: shared object-store pages counted once)
over the driver and every process it started. A pipeline that materialized its input or output
would hold 10x the data at its peak.
"""

import json
import subprocess
import sys
import time

import psutil
import pytest

from .helpers import REPO

ROWS = 8000
DESCRIPTION_CHARS = 4000  # 1x is ~32 MB of records, 10x ~320 MB
SAMPLE_SECONDS = 0.25
CATEGORIES = {f"Category {i}": ["Brand", "Color", "Size"] for i in range(8)}


def _write_input(path, rows):
    with open(path, "w") as out:
        for i in range(rows):
            record = {"product_id": f"p{i}", "category": f"Category {i % 8}", "title": f"Product {i}",
                      "description": ("lorem ipsum %d " % i * 400)[:DESCRIPTION_CHARS]}
            out.write(json.dumps(record) + "\n")


def _tree_pss(root: psutil.Process) -> int:
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total


def _peak_memory(tmp_path, rows: int) -> tuple[int, float]:
    source, output = tmp_path / f"in-{rows}.jsonl", tmp_path / f"out-{rows}"
    attributes = tmp_path / "attributes.json"
    attributes.write_text(json.dumps(CATEGORIES))
    _write_input(source, rows)
    command = [sys.executable, "-m", "jobs.cli", "extract", "--input", str(source), "--attributes", str(attributes),
               "--output", str(output), "--decoder", "dry-run", "--chunk-rows", "256", "--address", "local"]
    started = time.time()
    driver = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root, peak = psutil.Process(driver.pid), 0
    while driver.poll() is None:
        peak = max(peak, _tree_pss(root))
        time.sleep(SAMPLE_SECONDS)
    assert driver.returncode == 0
    report = json.loads((output / "_report.json").read_text())
    assert report["rows_in"] == report["products_out"] == rows
    return peak, time.time() - started


@pytest.mark.slow
def test_peak_memory_for_10x_rows_within_1_5x(tmp_path):
    small, small_seconds = _peak_memory(tmp_path, ROWS)
    large, large_seconds = _peak_memory(tmp_path, 10 * ROWS)
    print(f"\npeak PSS: {ROWS} rows {small / 2**20:.0f} MiB ({small_seconds:.0f} s), "
          f"{10 * ROWS} rows {large / 2**20:.0f} MiB ({large_seconds:.0f} s), ratio {large / small:.2f}")
    assert large <= 1.5 * small
