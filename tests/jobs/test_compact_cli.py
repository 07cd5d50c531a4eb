"""`hpd compact`: one JSON line, exit 2 for what the user must change, and every command that reads an
output says the same of it before and after (the job is still complete, --skip-existing still skips
its products, `hpd evaluate`, `hpd pick`, `hpd rejected` and scripts/show_values.py give the same)."""

from __future__ import annotations

import json

from jobs import cli
from pipelines import compact, io
from tests.pipelines.helpers import extract_args, jsonl, report, run_extract
from tests.scripts import load_script

CATEGORIES = {f"C{i:02d}": {"Brand": "the maker", "Color": "its colour"} for i in range(8)}


def show_values():
    return load_script("show_values")


def last_json(capsys) -> tuple[dict, str]:
    captured = capsys.readouterr()
    return json.loads(captured.out.strip().splitlines()[-1]), captured.err


def follow_on(tmp_path, output, name: str, capsys) -> dict:
    """What each reader of the output says (paths of this call's own files taken out)."""
    said = {}
    gold = tmp_path / "gold.jsonl"
    capsys.readouterr()
    assert cli.main(["evaluate", "--predictions", str(output), "--gold", str(gold), "--no-write"]) == 0
    said["evaluate"] = last_json(capsys)
    out = tmp_path / f"{name}-rejected.jsonl"
    assert cli.main(["rejected", str(output), "--out", str(out)]) == 0
    result, err = last_json(capsys)
    said["rejected"] = ({k: v for k, v in result.items() if k != "out"}, out.read_text())
    picks = tmp_path / f"{name}-pick"
    assert cli.main(["pick", str(output), "--attributes", str(tmp_path / "attributes.json"), "--count", "8",
                     "--out", str(picks)]) == 0
    said["pick"] = [(picks / f).read_text() for f in ("records.jsonl", "attributes.json", "gold-draft.jsonl")]
    capsys.readouterr()
    said["show_values"] = show_values().render(str(output), str(tmp_path / "in.jsonl"), 4)
    return said


def test_a_compacted_output_reads_the_same_everywhere(ray_cluster, tmp_path, capsys):
    records = [{"product_id": f"p{i:03d}", "category": f"C{i % 8:02d}", "title": f"product {i}"} for i in range(160)]
    records.insert(40, {"product_id": "bad", "category": "Nope", "title": "unknown"})
    (tmp_path / "in.jsonl").write_bytes(jsonl(records))
    (tmp_path / "attributes.json").write_text(json.dumps(CATEGORIES))
    (tmp_path / "gold.jsonl").write_text("".join(json.dumps({"product_id": f"p{i:03d}", "category": f"C{i % 8:02d}",
                                                              "target_scores": {"Brand": {"n/a": 1}, "Color": {"red": 1}}})
                                                 + "\n" for i in range(0, 160, 7)))
    output = tmp_path / "out"
    argv = extract_args(tmp_path / "in.jsonl", output, "--chunk-rows", 20, "--group-chunks", 1,
                        attributes=tmp_path / "attributes.json")
    assert run_extract(argv) == 0
    before = follow_on(tmp_path, output, "before", capsys)

    assert cli.main(["compact", str(output), "--dry-run"]) == 0
    planned, err = last_json(capsys)
    assert planned["dry_run"] and planned["files_after"] == 9 and "hpd compact --dry-run: 9 partitions" in err
    assert cli.main(["compact", str(output), "--workers", "2"]) == 0
    done, err = last_json(capsys)
    assert (done["partitions"], done["files_after"]) == (9, 9) and done["files_before"] > 9 * 4
    assert done["files_before"] == planned["files_before"] and done["bytes_after"] < done["bytes_before"]
    assert f"hpd compact: {output}: {done['files_before']:,} -> 9 files" in err
    assert follow_on(tmp_path, output, "after", capsys) == before

    assert run_extract(argv) == 0  # the same job: still complete, nothing to do
    assert "is already complete" in capsys.readouterr().err
    later = tmp_path / "later"  # the same records again: every product is in the compacted output (its _dedup/)
    assert run_extract(extract_args(tmp_path / "in.jsonl", later, "--skip-existing", output,
                                    attributes=tmp_path / "attributes.json")) == 0
    assert (report(str(later))["rows_skipped"], report(str(later))["products_out"]) == (160, 0)

    io.write_json(io.join(str(output), compact.MARKER), {"attempt": "x"})  # as a compaction stopped midway leaves it
    capsys.readouterr()
    assert run_extract(argv) == 0  # the job is done, and the command says what readers will say
    assert "warning: " + compact.compacting_message(str(output)) in capsys.readouterr().err
    for argv in (["evaluate", "--predictions", str(output), "--gold", str(tmp_path / "gold.jsonl")],
                 ["rejected", str(output)],
                 ["pick", str(output), "--attributes", str(tmp_path / "attributes.json"), "--count", "8", "--out",
                  str(tmp_path / "pick-while")]):
        assert cli.main(argv) == 2
        assert "is being compacted, or a compaction was stopped there (_compacting.json)" in capsys.readouterr().err
    assert cli.main(["compact", str(output)]) == 0  # which finishes it
    assert not io.exists(io.join(str(output), compact.MARKER))


def test_what_cannot_be_compacted_is_said_with_exit_2(tmp_path, capsys):
    assert cli.main(["compact", str(tmp_path / "nothing")]) == 2
    assert "hpd compact: error: " in (err := capsys.readouterr().err) and "is not an `hpd extract` output" in err
    io.write_json(str(tmp_path / "running" / "_job.json"), {"run_id": "x"})
    assert cli.main(["compact", str(tmp_path / "running")]) == 2
    assert "has not finished (no _report.json yet)" in capsys.readouterr().err
    assert cli.main(["compact", str(tmp_path / "running"), "--target-mb", "0"]) == 2
    assert "--target-mb must be a positive whole number, got 0" in capsys.readouterr().err
