"""Chunks stream through the stages one by one: each is its own Ray Data block."""

import subprocess

import pyarrow as pa
import ray

from pipelines.build import one_block_per_chunk

from .helpers import WAIT_SECONDS, catalog, check_exactly_once, extract_args, jsonl, start_extract


def test_each_row_a_stage_yields_is_its_own_block(ray_cluster):
    def chunks(batch):  # like prepare_shards: several one-row chunk tables per input row
        for shard in batch.column("item").to_pylist():
            for index in range(5):
                yield pa.table({"chunk": [f"{shard}:{index}"], "payload": [b"x" * 1000]})

    saved = ray.data.DataContext.get_current().target_max_block_size
    try:
        one_block_per_chunk()
        ds = ray.data.from_items([0, 1, 2], override_num_blocks=3)
        ds = ds.map_batches(chunks, batch_size=1, batch_format="pyarrow", num_cpus=0.25).materialize()
        assert ds.count() == 15 and ds.num_blocks() == 15
    finally:
        ray.data.DataContext.get_current().target_max_block_size = saved


def test_shards_of_many_chunks_stream_through_two_cpus(ray_cluster, tmp_path):
    """Three shards of 25 chunks each, on 2 CPUs with one 1-CPU extract actor: every chunk a block
    of its own, each prepare task is held back a few blocks ahead of the actor (Ray stops a
    generator 4 unread blocks ahead) and goes on as the actor takes them; every row ends in
    exactly one place."""
    records, valid = catalog(300)
    inputs = tmp_path / "in"
    inputs.mkdir()
    for part in range(3):
        (inputs / f"part-{part}.jsonl").write_bytes(jsonl(records[part::3]))
    output = str(tmp_path / "out")
    argv = extract_args(inputs, output, "--chunk-rows", 4, "--dry-run-seconds-per-prompt", 0.01)
    driver = start_extract(argv, ray_cluster.address)
    try:
        log, _ = driver.communicate(timeout=WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        driver.kill()
        log, _ = driver.communicate()
        raise AssertionError(f"the job hung:\n{log.decode()[-3000:]}") from None
    assert driver.returncode == 0, log.decode()[-3000:]
    check_exactly_once(output, records, valid)
