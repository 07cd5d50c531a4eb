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

from tests.scripts import load_script

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


def _pipeline_scale():
    return load_script("pipeline_scale")


def test_growth_splits_heap_from_shared_memory_over_the_second_half():
    """The growth table of a trace: per kind, KiB per committed chunk from the middle line where the
    kind is alive to its last, heap and shared memory apart; a kind gone before the end (actors exit
    first) is measured up to its own last line, and a line before the first commit is ignored."""
    def line(chunks, **kinds):
        return {"chunks_committed": chunks, "by_kind_pss_anon_shmem": kinds}

    trace = [line(0, driver=[400, 350, 0]), line(100, driver=[400, 350, 0], **{"ray::MapWorker": [250, 240, 10]}),
             line(200, driver=[402, 351, 1], **{"ray::MapWorker": [260, 240, 20]}),
             line(300, driver=[404, 352, 2], **{"ray::MapWorker": [270, 240, 30]}),
             line(400, driver=[500, 353, 0])]
    rows = {row["kind"]: row for row in _pipeline_scale().growth(trace)}
    assert set(rows) == {"ray::MapWorker", "driver"}  # no gcs_server line at all
    worker = rows["ray::MapWorker"]
    assert worker["chunks"] == 100 and worker["anon_kib_per_chunk"] == 0.0
    assert worker["shmem_kib_per_chunk"] == worker["pss_kib_per_chunk"] == 102.4  # 10 MiB over 100 chunks
    driver = rows["driver"]
    assert driver["chunks"] == 100 and driver["anon_mib"] == [352, 353] and driver["anon_kib_per_chunk"] == 10.2
