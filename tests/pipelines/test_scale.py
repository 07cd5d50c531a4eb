"""Catalog scale (``-m scale``, minutes): the dry-run pipeline on generated records, 10x the rows.

Runs scripts/pipeline_scale.py (a fresh `hpd extract` with its own local Ray per size) at
``HPD_SCALE_ROWS`` rows (default 100,000 and 1,000,000; the benchmark in benchmarks/pipeline-scale/
ran 1M and 10M). The script itself checks that every row is accounted for and that each planted
duplicate, the last one ``rows - 1`` rows after its first occurrence, is the row rejected.
"""

import json
import os
import subprocess
import sys

import pytest

from .helpers import REPO

MAX_MEMORY_GROWTH = 1.3  # peak at 10x the rows, over the peak at 1x
MIN_PRODUCTS_PER_SECOND = 5000  # the pipeline alone, at the largest size


@pytest.mark.scale
def test_memory_stays_flat_and_throughput_holds_at_10x_rows(tmp_path):
    sizes = os.environ.get("HPD_SCALE_ROWS", "100000,1000000").split(",")
    command = [sys.executable, "scripts/pipeline_scale.py", "--rows", *sizes, "--out", str(tmp_path / "result"),
               "--work", str(tmp_path / "work")]
    subprocess.run(command, cwd=REPO, check=True)
    runs = json.loads((tmp_path / "result" / "scale.json").read_text())["runs"]
    assert all(run["duplicates_checked"] == 3 for run in runs)
    small, large = runs[-2], runs[-1]
    assert large["rows"] == 10 * small["rows"]
    print(f"\npeak PSS {small['peak_pss_mib']} -> {large['peak_pss_mib']} MiB; {large['products_per_second']} products/s")
    assert large["peak_pss_mib"] <= MAX_MEMORY_GROWTH * small["peak_pss_mib"]
    assert large["products_per_second"] >= MIN_PRODUCTS_PER_SECOND
