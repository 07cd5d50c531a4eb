"""Per-prompt decoder failures and the commit-time accounting by row identity (no Ray needed).

The stage is the real ExtractStage with the real dry-run decoder told to fail on given products;
the chunks are built the way the prepare stage builds them (PREPARED_SCHEMA rows)."""

import json

import pyarrow as pa
import pytest

from pipelines import io
from pipelines.accounting import AccountingError, problems
from pipelines.commit import OutputConfig, write_chunk
from pipelines.dryrun import DryRunConfig
from pipelines.extract_stage import ExtractConfig, ExtractStage
from pipelines.prepare import OK, PREPARED_SCHEMA, REJECTED, SKIPPED
from pipelines.schema import load_schema
from pipelines.stacking import StackingConfig, assign_stacks

from .helpers import SAMPLE_ATTRIBUTES, read_attributes, read_rejected, sample_records

SCHEMA = load_schema(str(SAMPLE_ATTRIBUTES))


def prepared(records: list[dict], statuses: dict[int, str] | None = None, docs_per_prompt: int = 2) -> dict:
    """A chunk as the prepare stage sends it: rows in PREPARED_SCHEMA, OK unless ``statuses`` says."""
    statuses = statuses or {}
    rows = []
    for i, record in enumerate(records):
        status = statuses.get(i, OK)
        rows.append({
            "row": 100 + i, "status": status, "reason": None if status == OK else "bad", "stage": None if status == OK else "validate",
            "record": json.dumps(record), "product_id": record["product_id"],
            "category": record["category"] if status == OK else None, "title": record["title"],
            "description": None, "features": [], "input_truncated": False, "stack": -1,
        })
    categories = [row["category"] for row in rows]
    for row, stack in zip(rows, assign_stacks(categories, StackingConfig(docs_per_prompt))):
        row["stack"] = stack
    payload = io.table_to_bytes(pa.Table.from_pylist(rows, schema=PREPARED_SCHEMA))
    return {"chunk": "s-000000", "shard": "s", "index": 0, "rows_in": len(rows), "payload": payload}


def stage(failures=(), prompts_per_call=None, attempts=2, progress=None, progress_seconds=0.0) -> ExtractStage:
    config = ExtractConfig(decoder="dry-run", schema=SCHEMA, run_id="r", dry_run=DryRunConfig(failures=tuple(failures)),
                           prompts_per_call=prompts_per_call, decode_attempts=attempts, progress_seconds=progress_seconds)
    return ExtractStage(config, progress=progress)


def run_chunk(extract: ExtractStage, chunk: dict) -> dict:
    return extract(pa.Table.from_pylist([chunk])).to_pylist()[0]


def shoes(n: int) -> list[dict]:
    return [{"product_id": f"shoe-{i}", "category": "Shoes", "title": f"shoe {i}"} for i in range(n)]


def written_ids(result: dict) -> set:
    return set(io.table_from_bytes(result["attributes"]).column("product_id").to_pylist())


def rejected_rows(result: dict) -> list[dict]:
    return io.table_from_bytes(result["rejected"]).to_pylist()


def check(result: dict) -> list[str]:
    return problems(result, json.loads(result["stats"]), io.table_from_bytes(result["attributes"]),
                    io.table_from_bytes(result["rejected"]))


def test_a_prompt_that_always_fails_rejects_its_products_with_the_reason_and_no_others():
    result = run_chunk(stage(failures=[("raise", "shoe-2")]), prepared(shoes(6)))  # prompts {0,1} {2,3} {4,5}
    assert written_ids(result) == {"shoe-0", "shoe-1", "shoe-4", "shoe-5"}
    rejected = rejected_rows(result)
    assert sorted(json.loads(r["record"])["product_id"] for r in rejected) == ["shoe-2", "shoe-3"]
    assert all(r["stage"] == "extract" and "DryRunFailure" in r["reason"] and "'shoe-2'" in r["reason"] for r in rejected)
    assert json.loads(result["stats"])["rejected_by_stage"] == {"extract": 2}
    assert check(result) == []


def test_a_flaky_prompt_succeeds_on_its_retry_alone():
    result = run_chunk(stage(failures=[("flaky", "shoe-2")]), prepared(shoes(6)))
    assert written_ids(result) == {f"shoe-{i}" for i in range(6)} and rejected_rows(result) == []
    assert check(result) == []


def test_without_retries_a_flaky_prompt_costs_its_whole_call():
    result = run_chunk(stage(failures=[("flaky", "shoe-2")], attempts=1), prepared(shoes(6)))
    assert written_ids(result) == set() and len(rejected_rows(result)) == 6  # one call of 3 prompts, no retry


def test_an_engine_error_result_rejects_the_prompt_at_once():
    result = run_chunk(stage(failures=[("error", "shoe-5")]), prepared(shoes(6)))
    assert written_ids(result) == {f"shoe-{i}" for i in range(4)}
    assert {r["reason"] for r in rejected_rows(result)} == {"extract error: simulated engine error on a prompt holding 'shoe-5'"}


def test_a_decoder_that_fails_every_prompt_fails_the_chunk_instead_of_rejecting_everything():
    failing = [("raise", f"shoe-{i}") for i in (0, 2, 4)]
    with pytest.raises(RuntimeError, match="every one of 3 prompts failed"):
        run_chunk(stage(failures=failing), prepared(shoes(6)))


@pytest.mark.parametrize("attempts", [1, 2])
def test_a_chunk_of_one_prompt_on_a_broken_decoder_fails_instead_of_rejecting_it(attempts):
    """One prompt cannot tell a bad prompt from a broken decoder (a GPU after a device-side assert):
    a one-product probe does. Before, the chunk was committed with its products rejected, for good."""
    with pytest.raises(RuntimeError, match="and so did a one-product probe: the decoder itself is failing"):
        run_chunk(stage(failures=[("broken", "shoe-1")], attempts=attempts), prepared(shoes(2)))  # one prompt {0, 1}


@pytest.mark.parametrize("attempts", [1, 2])
def test_a_chunk_of_one_bad_prompt_is_rejected_once_the_probe_decodes(attempts):
    progress = Recorder()
    extract = stage(failures=[("raise", "shoe-1")], attempts=attempts, progress=progress)
    result = run_chunk(extract, prepared(shoes(2)))
    assert written_ids(result) == set() and len(rejected_rows(result)) == 2 and check(result) == []
    assert sum(call[2] for call in progress.calls if call[0] == "add") == 2  # the probe is not progress
    assert extract.decoder.on_prompt_done is None  # the hook is the chunk's, put back after it


class Recorder:
    """Stands in for the progress actor handle: ``handle.method.remote(*args)`` is recorded."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, method):
        recorder = self

        class Method:
            @staticmethod
            def remote(*args):
                recorder.calls.append((method, *args))

        return Method


def test_progress_is_reported_after_every_call_inside_a_chunk():
    """A decoder that does not report prompts as they finish: the line moves after each call."""
    progress = Recorder()
    extract = stage(prompts_per_call=2, progress=progress)
    dry = extract.decoder

    class Plain:  # the decoder interface without the hook
        name, model_name, decode = dry.name, dry.model_name, dry.decode

    extract._decoder = Plain()
    run_chunk(extract, prepared(shoes(10)))  # 5 prompts: calls of 2, 2, 1
    assert progress.calls == [("start", "s-000000", 10), ("add", "s-000000", 4), ("add", "s-000000", 4),
                              ("add", "s-000000", 2)]


def test_progress_counts_are_summed_between_reports_and_all_sent_by_the_chunk_end():
    """With a reporting interval longer than the chunk, one call tells all its products (one actor call
    per prompt was a third of the job's CPU at 5,000 products/s); with 0, every prompt is told."""
    for seconds, adds in ((3600, [10]), (0, [2] * 5)):
        progress = Recorder()
        run_chunk(stage(progress=progress, progress_seconds=seconds), prepared(shoes(10)))  # 5 prompts of 2
        assert progress.calls[0] == ("start", "s-000000", 10)
        assert [n for method, _, n in progress.calls if method == "add"] == adds


def test_progress_seconds_must_be_a_non_negative_number():
    with pytest.raises(ValueError, match="progress_seconds"):
        ExtractConfig(decoder="dry-run", schema=SCHEMA, run_id="r", progress_seconds=-1)


def test_a_chunk_without_products_loads_no_model():
    config = ExtractConfig(decoder="hpd", schema=SCHEMA, run_id="r")  # the real engine: would import torch
    extract = ExtractStage(config)
    rejected = prepared(shoes(2), statuses={0: REJECTED, 1: REJECTED})
    result = run_chunk(extract, rejected)
    assert extract._decoder is None and len(rejected_rows(result)) == 2 and check(result) == []


# ------------------------------------------------------------------ accounting by row identity


@pytest.fixture
def good():
    records = shoes(4) + [sample_records()[1]]
    return run_chunk(stage(failures=[("raise", "shoe-2")]), prepared(records, statuses={4: SKIPPED}))


def test_a_correct_chunk_adds_up(good):
    assert check(good) == [] and len(good["read_rows"]) == 5 and good["skipped_rows"] == [104]


def test_rows_of_a_failed_prompt_dropped_are_caught(good):
    bad = dict(good, rejected_rows=[], rejected=io.table_to_bytes(io.table_from_bytes(good["rejected"]).slice(0, 0)))
    stats = json.loads(good["stats"])
    bad["stats"] = json.dumps(dict(stats, rejected=0, rows_in=stats["rows_in"] - 2))  # counters "fixed" too
    found = check(bad)
    assert any("neither written, rejected nor skipped: 102, 103" in p for p in found)


def test_a_dropped_row_and_a_duplicated_row_are_caught_although_the_counts_add_up(good):
    written = good["written_rows"]  # 100, 101
    attributes = io.table_from_bytes(good["attributes"])
    bad = dict(good, written_rows=[written[0], written[0]])  # row 101 lost, row 100 twice: 2 products either way
    found = check(bad)
    assert any("neither written, rejected nor skipped: 101" in p for p in found)
    assert any("more than once: 100" in p for p in found)
    assert attributes.num_rows == json.loads(good["stats"])["attribute_rows"]


def test_attribute_rows_must_be_those_of_the_written_rows(good):
    attributes = io.table_from_bytes(good["attributes"])
    doubled = pa.concat_tables([attributes, attributes.slice(0, 1)])
    found = problems(good, json.loads(good["stats"]), doubled, io.table_from_bytes(good["rejected"]))
    assert any("(product, attribute) rows written more than once" in p for p in found)
    other = attributes.set_column(0, "product_id", pa.array(["ghost"] * attributes.num_rows))
    found = problems(good, json.loads(good["stats"]), other, io.table_from_bytes(good["rejected"]))
    assert any("attribute rows of products not written: ghost" in p for p in found)


def test_the_writer_commits_nothing_for_a_chunk_that_does_not_add_up(good, tmp_path):
    output = OutputConfig(str(tmp_path / "out"), "r")
    bad = dict(good, written_rows=[good["written_rows"][0]] * 2)
    with pytest.raises(AccountingError, match="rows do not add up, not committing it"):
        write_chunk(pa.Table.from_pylist([bad]), output)
    assert io.list_files(output.uri) == []  # checked before any file is written
    write_chunk(pa.Table.from_pylist([good]), output)
    assert set(read_attributes(output.uri).column("product_id").to_pylist()) == {"shoe-0", "shoe-1"}
    assert len(read_rejected(output.uri)) == 2


def test_the_writer_writes_nothing_for_an_attempt_that_lost_its_lease(good, tmp_path):
    """The writers check the attempt's lease before a chunk's files and again before its manifest: a
    paused attempt's writers, woken after another took the output over, overwrote that one's files."""
    from pipelines import attempts

    output = OutputConfig(str(tmp_path / "out"), "r", attempt="000000000000001-host-1")
    attempts.save(output.uri, attempts.Attempt(output.attempt, 1.0, 2.0, "cpu", 1, 0.0425))
    io.write_json(attempts.taken_uri(output.uri, output.attempt), {"by": "000000000000002-host-2"})
    with pytest.raises(attempts.LostLeaseError, match="attempt 000000000000002-host-2 .*took the output over"):
        write_chunk(pa.Table.from_pylist([good]), output)
    assert [uri for uri in io.list_files(output.uri) if "/_attempts/" not in uri] == []
    io.delete_if_exists(attempts.taken_uri(output.uri, output.attempt))
    write_chunk(pa.Table.from_pylist([good]), output)
    assert set(read_attributes(output.uri).column("product_id").to_pylist()) == {"shoe-0", "shoe-1"}


def test_progress_moves_with_each_finished_prompt_and_a_retried_prompt_counts_once():
    """A decoder that reports each prompt as it finishes (the engine's sessions do, and so does the
    dry-run decoder) moves the line inside one call; a call that fails after some prompts finished
    and is retried prompt by prompt still adds up to the chunk's products, each counted once."""
    progress = Recorder()
    result = run_chunk(stage(failures=[("flaky", "shoe-7")], progress=progress), prepared(shoes(10)))  # one call of 5 prompts
    adds = [n for method, _, n in progress.calls if method == "add"]
    assert progress.calls[0] == ("start", "s-000000", 10)
    assert adds == [2] * 5  # one per prompt of 2 products; the retry added nothing twice
    assert len(written_ids(result)) == 10 and check(result) == []


def test_busy_decoding_seconds_leave_out_loading_the_model(monkeypatch):
    """The report's "busy decoding" seconds (decode_seconds) start once the decoder is loaded: a GPU run of
    40 products measured 35 s busy of which about 25 s were loading the model."""
    from pipelines import extract_stage

    real_load = extract_stage.load

    def slow_load(config):
        import time

        time.sleep(1.0)  # a slow model load (a GGUF conversion, a checkpoint off a network disk)
        return real_load(config)

    monkeypatch.setattr(extract_stage, "load", slow_load)
    extract = stage()
    first = json.loads(run_chunk(extract, prepared(shoes(4)))["stats"])
    assert first["products_out"] == 4
    assert first["decode_seconds"] < 0.5
    assert first["decode_devices"] == 1  # no threads given: a GPU actor, one GPU


def test_a_chunk_names_the_devices_its_actor_decoded_on():
    """A CPU actor's torch threads are the vCPUs its busy seconds occupied (the report multiplies)."""
    extract = ExtractStage(stage().config, threads=3)
    assert json.loads(run_chunk(extract, prepared(shoes(2)))["stats"])["decode_devices"] == 3


@pytest.mark.parametrize("cut", ["a value", "a product"])
def test_a_decoder_result_of_the_wrong_shape_fails_the_chunk(monkeypatch, cut):
    """One value fewer than the category's attributes (or one product fewer than the prompt's) was
    dropped by a zip: the attribute rows of the product went missing and the counters still agreed
    (helper-27, session 51). Now the chunk fails and nothing is committed."""
    from dataclasses import replace

    extract = stage()
    call = extract._call

    def short(requests):
        results = list(call(requests))
        first = results[0]
        values = [first.values[0][:-1], *first.values[1:]] if cut == "a value" else first.values[:-1]
        return [replace(first, values=values), *results[1:]]

    monkeypatch.setattr(extract, "_call", short)
    with pytest.raises(ValueError, match="zip"):
        run_chunk(extract, prepared(shoes(4)))
