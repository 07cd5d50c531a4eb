"""`hpd pick`: which products of a catalog to label first (training/selection.py, jobs/pick.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.cli import main
from datafiles.dataset import gold_draft
from training.selection import Lowest, SelectionConfig, quotas, rank, seed_key, select


def test_quotas_give_each_category_its_minimum_and_the_rest_by_size():
    sizes = {"Shirts": 300, "Eyewear": 300, "Shorts": 300, "Guitar": 206, "Swimwear": 142, "Lure": 108,
             "Fishing Rod": 60, "Baseball Caps": 59, "Stove": 51, "Helmet": 42}  # AE-110k train
    assert quotas(sizes, 50, 2, 0) == {"Shirts": 8, "Eyewear": 8, "Shorts": 8, "Guitar": 6, "Swimwear": 4, "Lure": 4,
                                    "Fishing Rod": 3, "Baseball Caps": 3, "Stove": 3, "Helmet": 3}
    assert sum(quotas(sizes, 200, 2, 0).values()) == 200
    assert quotas({"a": 1, "b": 100}, 10, 2, 0) == {"a": 1, "b": 9}  # a small category gives what it lacks to the others
    assert quotas({"a": 3, "b": 3}, 100, 2, 0) == {"a": 3, "b": 3}  # fewer products than asked: all of them
    assert quotas({"a": 5, "b": 5, "c": 5}, 2, 2, 0) == {"a": 2, "b": 2, "c": 2}  # the minimum holds over the count
    assert quotas({"a": 50, "b": 50}, 7, 0, 0) in ({"a": 4, "b": 3}, {"a": 3, "b": 4})
    with pytest.raises(ValueError, match="must be >= 0"):
        quotas({"a": 5}, 3, -1, 0)


def test_a_seeded_sample_per_category_in_input_order():
    products = [(f"a{i}", "A") for i in range(20)] + [(f"b{i}", "B") for i in range(5)] + [("c0", "C")]
    chosen = select(products, SelectionConfig(6, min_per_category=1, seed=3))
    assert chosen == select(products, SelectionConfig(6, min_per_category=1, seed=3))  # seeded
    assert chosen != select(products, SelectionConfig(6, min_per_category=1, seed=4))
    assert chosen == [p for p, _ in products if p in set(chosen)]  # input order
    assert [c for p, c in products if p in set(chosen)].count("A") == 3 and "c0" in chosen  # every category


def test_categories_tied_on_their_share_are_ordered_by_the_seed_not_by_name():
    """--min-per-category 0 and fewer products than categories of one size: which category gets
    the product is the seed's draw (the same for the same seed), not the first name each time."""
    products = [(f"{c}{i}", c) for c in "ABCD" for i in range(10)]
    picks = {seed: select(products, SelectionConfig(1, min_per_category=0, seed=seed)) for seed in range(12)}
    assert all(len(chosen) == 1 for chosen in picks.values())
    assert len({chosen[0][0] for chosen in picks.values()}) > 1  # not always category A
    assert all(select(products, SelectionConfig(1, min_per_category=0, seed=seed)) == chosen for seed, chosen in picks.items())
    tied = {"a": 50, "b": 50}  # the spare product of an odd count too
    assert {tuple(sorted(quotas(tied, 7, 0, seed).items())) for seed in range(12)} == {(("a", 4), ("b", 3)), (("a", 3), ("b", 4))}
    exact = {"a": 30, "b": 60, "c": 10}  # shares 1.2, 2.4, 0.4: b and c tie (in floats 2.4 - 2 < 0.4)
    assert {tuple(quotas(exact, 4, 0, seed).values()) for seed in range(12)} == {(1, 3, 0), (1, 2, 1)}
    untied = {"a": 25, "b": 60, "c": 15}  # shares 1.0, 2.4, 0.6: no tie, the seed changes nothing
    assert {tuple(quotas(untied, 4, 0, seed).values()) for seed in range(12)} == {(1, 2, 1)}


def test_the_order_is_a_keyed_hash_of_the_id_the_same_on_every_run():
    """The sample is reproducible from the seed alone: the rank of an id is fixed (pinned here, so
    a change of the hash is seen), the seeds give different orders, and a seed of any size is a key."""
    key = hashlib.blake2b(b"0", digest_size=16).digest()
    assert seed_key(0) == key
    assert rank("p1", key) == (int.from_bytes(hashlib.blake2b(b"p1", digest_size=8, key=key).digest(), "big"), "p1")
    assert rank("p1", key) == (0xA29F1F83CE2845AC, "p1")
    ids = [f"p{i}" for i in range(100)]
    orders = {seed: sorted(ids, key=lambda p: rank(p, seed_key(seed))) for seed in (0, 1, -1, 10**100)}
    assert len({tuple(order) for order in orders.values()}) == 4


_ids = st.lists(st.text(min_size=1, max_size=6), unique=True, max_size=60)


@settings(max_examples=300, deadline=None)
@given(_ids, st.integers(0, 70), st.integers(-3, 3), st.randoms(use_true_random=False))
def test_the_streamed_sample_is_the_lowest_ranks_of_all(ids, limit, seed, rng):
    """``Lowest`` (a bottom-k sample, O(limit) memory) keeps what sorting every id by rank keeps,
    whatever the order the ids come in, split over files and repeated; and where each kept id was
    seen is every file that named it."""
    key = seed_key(seed)
    stream = [(product_id, f"file{rng.randrange(4)}") for product_id in ids for _ in range(rng.randrange(1, 4))]
    rng.shuffle(stream)
    lowest = Lowest(limit, key)
    for product_id, where in stream:
        lowest.offer([product_id], where)
    assert lowest.ranked() == sorted(ids, key=lambda p: rank(p, key))[:limit]  # the slow, obvious reference
    assert len(lowest.kept) == len(lowest.seen_in) == min(limit, len(ids))
    for product_id in lowest.ranked():
        assert lowest.seen_in[product_id] == {where for p, where in stream if p == product_id}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400), st.sampled_from("ABCDE")), unique_by=lambda t: t[0], min_size=1, max_size=120),
       st.integers(1, 40), st.integers(0, 3), st.integers(0, 5))
def test_select_is_each_categorys_quota_of_its_lowest_ranks(products, count, minimum, seed):
    """``select`` (the reference `hpd pick` streams): per category its quota, the products first in
    the seed's order, in input order; the same as a ``Lowest`` per category fed in any order."""
    products = [(f"p{i}", c) for i, c in products]
    config = SelectionConfig(count, minimum, seed)
    chosen = select(products, config)
    sizes = {c: sum(1 for _, k in products if k == c) for _, c in products}
    wanted = quotas(sizes, count, minimum, seed)
    assert sorted(c for p, c in products if p in set(chosen)) == sorted(c for c, k in wanted.items() for _ in range(k))
    assert chosen == [p for p, _ in products if p in set(chosen)]  # input order
    streamed = {c: Lowest(wanted[c], seed_key(seed)) for c in sizes}
    for product_id, category in reversed(products):
        streamed[category].offer([product_id], "file")
    assert set(chosen) == {p for lowest in streamed.values() for p in lowest.ranked()}


def test_bad_settings_are_named():
    for kwargs, message in (({"count": 0}, "count must be"), ({"count": 5, "min_per_category": -1}, "min_per_category must be"),
                            ({"count": 5, "reserves": -1}, "reserves must be"), ({"count": 5, "seed": "1"}, "seed must be")):
        with pytest.raises(ValueError, match=message):
            SelectionConfig(**kwargs)


def test_the_draft_holds_every_attribute_the_models_value_or_none():
    line = gold_draft("p1", "Shoes", {"Brand": "Acme", "Color": None}, ["Brand", "Color", "Size"])
    assert line == {"product_id": "p1", "category": "Shoes",
                    "target_scores": {"Brand": {"Acme": 1}, "Color": {"n/a": 1}, "Size": {"n/a": 1}}}


def _job_output(folder: Path, rows: list[tuple]) -> None:
    """What `hpd extract` writes: attributes/category=<c>/part.parquet."""
    for category in sorted({r[1] for r in rows}):
        part = folder / "attributes" / f"category={category}"
        part.mkdir(parents=True)
        mine = [r for r in rows if r[1] == category]
        table = {"product_id": [r[0] for r in mine], "attribute": [r[2] for r in mine], "value": [r[3] for r in mine]}
        pq.write_table(pa.table(table), part / "part-0.parquet")


def test_cli_writes_records_schema_and_a_gold_draft_that_finetune_reads(tmp_path, capsys):
    records = [{"product_id": 1, "category": "Shoes", "title": "Acme red shoe"},
               {"product_id": 2, "category": "Shoes", "title": "Zed blue shoe"},
               {"product_id": 3, "category": "Tea", "title": "Leafy green tea"},
               {"product_id": 4, "category": "Tea", "title": "not in the output"}]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "attributes.json").write_text(json.dumps({"Shoes": ["Brand", "Color"], "Tea": ["Flavor"]}))
    output = tmp_path / "run"
    _job_output(output, [("1", "Shoes", "Brand", "Acme"), ("1", "Shoes", "Color", "red"),
                         ("2", "Shoes", "Brand", "Zed"), ("2", "Shoes", "Color", None), ("3", "Tea", "Flavor", "green")])
    argv = ["pick", str(output), "--input", str(tmp_path / "records.jsonl"), "--attributes", str(tmp_path / "attributes.json"),
            "--count", "2", "--min-per-category", "1", "--seed", "1", "--out", str(tmp_path / "label")]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary == {"picked": 2, "of": 3, "looked_up": 3, "not_in_input": 0, "seed": 1,
                       "per_category": {"Shoes": 1, "Tea": 1}, "out": str(tmp_path / "label")}
    picked = [json.loads(line) for line in (tmp_path / "label" / "records.jsonl").read_text().splitlines()]
    assert picked == [records[1], records[2]]  # one of each category, as they were (4 was not extracted)
    assert select([("1", "Shoes"), ("2", "Shoes"), ("3", "Tea")], SelectionConfig(2, 1, seed=1)) == ["2", "3"]  # the rule's
    drafts = [json.loads(line) for line in (tmp_path / "label" / "gold-draft.jsonl").read_text().splitlines()]
    assert drafts[0] == {"product_id": "2", "category": "Shoes", "target_scores": {"Brand": {"Zed": 1}, "Color": {"n/a": 1}}}
    # corrected and saved as gold.jsonl, the folder is what `hpd finetune --train` reads
    (tmp_path / "label" / "gold.jsonl").write_text((tmp_path / "label" / "gold-draft.jsonl").read_text())
    from training import data

    loaded = data.load_gold(data.resolve_sources(tmp_path / "label"))
    assert [p.product.product_id for p in loaded.products] == ["2", "3"] and loaded.products[0].values == ("Zed", None)
    # a folder in use is refused by name; --seed picks another sample
    assert main(argv) == 2 and "is not a new or empty folder" in capsys.readouterr().err
    assert main([*argv[:7], "1", *argv[8:-1], str(tmp_path / "label3")]) == 0  # --count 1, one of each of 2 categories
    assert "more than --count 1: at least 1 of each of the 2 categories" in capsys.readouterr().err
    argv[argv.index("--seed") + 1], argv[-1] = "0", str(tmp_path / "label2")  # seed 0 ranks product 1 before 2
    assert main(argv) == 0
    assert (tmp_path / "label2" / "records.jsonl").read_text() != (tmp_path / "label" / "records.jsonl").read_text()


def test_cli_takes_the_records_the_job_took_and_refuses_another_schema(tmp_path, capsys):
    """The first valid copy of an id is the product (a rejected copy before it is not), a record
    under another category than the output's is not it, and a schema that is not the job's is
    refused (its draft would be all n/a)."""
    records = [{"product_id": 1, "category": "Nope", "title": "rejected: unknown category"},
               {"product_id": 1, "category": "Shoes", "title": "Acme red shoe"},
               {"product_id": 2, "category": "Tea", "title": "a shoe, filed as tea here"},
               {"product_id": 3, "category": "Tea", "title": "Leafy green tea"}]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    schema = {"Shoes": ["Brand", "Color"], "Tea": ["Flavor"]}
    (tmp_path / "attributes.json").write_text(json.dumps(schema))
    output = tmp_path / "run"
    _job_output(output, [("1", "Shoes", "Brand", "Acme"), ("2", "Shoes", "Brand", "Zed"), ("3", "Tea", "Flavor", "green")])
    argv = ["pick", str(output), "--input", str(tmp_path / "records.jsonl"), "--attributes", str(tmp_path / "attributes.json"),
            "--count", "5", "--out", str(tmp_path / "label")]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.splitlines()[-1])["not_in_input"] == 1
    assert "warning: 1 of the 3 products of" in captured.err and "(1 under another category)" in captured.err
    assert "more than --count" not in captured.err
    picked = [json.loads(line) for line in (tmp_path / "label" / "records.jsonl").read_text().splitlines()]
    assert picked == [records[1], records[3]]
    (tmp_path / "other.json").write_text(json.dumps({"Shoes": ["Maker", "Colour"], "Tea": ["Flavor"]}))
    argv[5], argv[-1] = str(tmp_path / "other.json"), str(tmp_path / "label2")
    assert main(argv) == 2
    assert "--attributes does not hold the category 'Shoes' or its attributes ['Brand']" in capsys.readouterr().err
    (output / "_job.json").write_text(json.dumps({"run_id": "r", "arguments": {"attributes": "0" * 64}}))
    argv[5] = str(tmp_path / "attributes.json")
    assert main(argv) == 2 and "is not the schema the job in" in capsys.readouterr().err
    (output / "_job.json").unlink()
    del argv[2:4]  # no --input, and no _job.json to name it
    assert main(argv) == 2 and "has no _job.json to name its input: pass --input" in capsys.readouterr().err
    argv[1] = str(tmp_path)  # not an output (it holds the catalog's files): said so, not "pass --input"
    assert main(argv) == 2 and "is not an `hpd extract` output (no _job.json, no attributes/)" in capsys.readouterr().err


def test_cli_reads_the_input_as_the_job_did_and_accepts_the_jobs_own_schema(tmp_path, capsys):
    """A line that is not JSON is passed over (the job rejects it); an id's first valid copy settles
    it, even under another category than the output's; the job's `_job.json` gives the schema's
    digest and the record checks (--oversize reject here)."""
    import hashlib

    from pipelines.schema import load_schema

    lines = ['{"product_id": "a", "category": "Tea", "title": "' + "long " * 40 + '"}',  # rejected by this job
             '{"product_id": "a", "category": "Shoes", "title": "Acme shoe"}',
             "{not json",
             '{"product_id": "b", "category": "Tea", "title": "filed as tea first"}',
             '{"product_id": "b", "category": "Shoes", "title": "a later copy: a duplicate to the job"}',
             '{"product_id": "c", "category": "Tea", "title": "green tea"}']
    (tmp_path / "records.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "attributes.json").write_text(json.dumps({"Shoes": ["Brand"], "Tea": ["Flavor"]}))
    output = tmp_path / "run"
    _job_output(output, [("a", "Shoes", "Brand", "Acme"), ("b", "Shoes", "Brand", "Zed"), ("c", "Tea", "Flavor", "green")])
    digest = hashlib.sha256(load_schema(str(tmp_path / "attributes.json")).to_json().encode()).hexdigest()
    validation = {"max_id_chars": 256, "max_text_chars": 100, "oversize": "reject"}
    (output / "_job.json").write_text(json.dumps({"run_id": "r", "arguments": {"attributes": digest, "validation": validation}}))
    argv = ["pick", str(output), "--input", str(tmp_path / "records.jsonl"), "--attributes", str(tmp_path / "attributes.json"),
            "--count", "5", "--out", str(tmp_path / "label")]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.splitlines()[-1])["not_in_input"] == 1
    assert "(1 under another category)" in captured.err
    picked = [json.loads(line)["title"] for line in (tmp_path / "label" / "records.jsonl").read_text().splitlines()]
    assert picked == ["Acme shoe", "green tea"]
    (output / "_job.json").write_text(json.dumps(["not", "a", "job"]))
    argv[-1] = str(tmp_path / "label2")
    assert main(argv) == 2 and "is not an `hpd extract` job record" in capsys.readouterr().err


def _job_record(output: Path, attributes: Path, **arguments) -> None:
    import hashlib

    from pipelines.schema import load_schema

    digest = hashlib.sha256(load_schema(str(attributes)).to_json().encode()).hexdigest()
    (output / "_job.json").write_text(json.dumps({"run_id": "r", "arguments": {"attributes": digest, **arguments}}))


def test_cli_reads_the_jobs_own_input_from_s3_files_and_parquet(tmp_path, s3_server, capsys):
    """Without --input, the input `_job.json` names: a prefix of JSON Lines and Parquet files on S3,
    read in the job's order and within its --limit."""
    bucket = s3_server.make_bucket("pick")
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="in/a.jsonl", Body=b'{"product_id": "a", "category": "Tea", "title": "green tea"}\n'
                      b'{"product_id": "b", "category": "Shoes", "title": "Acme shoe", "title": "twice"}\n')
    buffer = pa.BufferOutputStream()
    pq.write_table(pa.table({"product_id": [7, 8], "category": ["Shoes", "Tea"], "title": ["Zed shoe", "past the limit"],
                             "features": [["leather"], None]}), buffer)
    client.put_object(Bucket=bucket, Key="in/b.parquet", Body=buffer.getvalue().to_pybytes())
    (tmp_path / "attributes.json").write_text(json.dumps({"Shoes": ["Brand"], "Tea": ["Flavor"]}))
    output = tmp_path / "run"
    _job_output(output, [("a", "Tea", "Flavor", "green"), ("7", "Shoes", "Brand", "Zed"), ("8", "Tea", "Flavor", None)])
    _job_record(output, tmp_path / "attributes.json", input=f"s3://{bucket}/in/", read={"limit": 3, "chunk_rows": 5})
    argv = ["pick", str(output), "--attributes", str(tmp_path / "attributes.json"), "--count", "5", "--out", str(tmp_path / "label")]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.splitlines()[-1])["not_in_input"] == 1  # 8 lies past the job's --limit 3
    assert f"1 of the 3 products of {output} are not in s3://{bucket}/in/ as the job read it" in captured.err
    picked = [json.loads(line) for line in (tmp_path / "label" / "records.jsonl").read_text().splitlines()]
    assert picked == [{"product_id": "a", "category": "Tea", "title": "green tea"},
                      {"product_id": 7, "category": "Shoes", "title": "Zed shoe", "features": ["leather"]}]


def test_cli_stops_reading_once_every_product_is_found(tmp_path, capsys, monkeypatch):
    from pipelines import reader

    lines = [{"product_id": f"p{i}", "category": "Tea", "title": f"tea {i}"} for i in range(50)]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (tmp_path / "attributes.json").write_text(json.dumps({"Tea": ["Flavor"]}))
    output = tmp_path / "run"
    _job_output(output, [(f"p{i}", "Tea", "Flavor", None) for i in range(3)])
    _job_record(output, tmp_path / "attributes.json", input=str(tmp_path / "records.jsonl"))
    parsed = []
    monkeypatch.setattr(reader, "parse_raw", lambda row, raw, parse=reader.parse_raw: parsed.append(row) or parse(row, raw))
    argv = ["pick", str(output), "--attributes", str(tmp_path / "attributes.json"), "--count", "2", "--out", str(tmp_path / "label")]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["of"] == 3 and parsed == [0, 1, 2]
    argv[argv.index("--count") + 1], argv[-1] = "5", str(tmp_path / "label2")
    assert main(argv) == 0
    assert "fewer than --count 5: the output holds only 3 products of its input: all of them" in capsys.readouterr().err


def test_a_yaml_schema_is_written_as_json_attributes(tmp_path, capsys):
    """A YAML --attributes was copied verbatim into attributes.json, which the next documented
    command (`hpd finetune --train FOLDER`) refused as not JSON: it is written as the same schema in JSON."""
    from pipelines.schema import load_schema

    (tmp_path / "records.jsonl").write_text(json.dumps({"product_id": "1", "category": "Tea", "title": "Leafy green tea"}) + "\n")
    (tmp_path / "attributes.yaml").write_text("Tea:\n  Flavor: the taste\n  Form:\n")
    output = tmp_path / "run"
    _job_output(output, [("1", "Tea", "Flavor", "green"), ("1", "Tea", "Form", None)])
    argv = ["pick", str(output), "--input", str(tmp_path / "records.jsonl"), "--attributes", str(tmp_path / "attributes.yaml"),
            "--count", "1", "--out", str(tmp_path / "label")]
    assert main(argv) == 0
    written = load_schema(str(tmp_path / "label" / "attributes.json"))  # JSON, by its name
    assert written == load_schema(str(tmp_path / "attributes.yaml"))
    (tmp_path / "label" / "gold.jsonl").write_text((tmp_path / "label" / "gold-draft.jsonl").read_text())
    from training import data

    assert data.load_gold(data.resolve_sources(tmp_path / "label")).products[0].values == ("green", None)


def _catalog(folder: Path, sizes: dict[str, int], chunk: int = 16) -> list[dict]:
    """An `hpd extract` output of generated products (a file per chunk of input rows and category,
    two attributes each, `_job.json` naming the input) and its input; returns the records."""
    order = [c for c, n in sizes.items() for _ in range(n)]
    __import__("random").Random(7).shuffle(order)  # the categories spread through the input
    records = [{"product_id": f"p{i:07d}", "category": c, "title": f"product {i}"} for i, c in enumerate(order)]
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "attributes.json").write_text(json.dumps({c: ["Brand", "Color"] for c in sizes}))
    for start in range(0, len(records), chunk):
        rows = [(r["product_id"], r["category"], a, f"{a} of {r['product_id']}") for r in records[start:start + chunk]
                for a in ("Brand", "Color")]
        for category in sorted({r[1] for r in rows}):
            part = folder / "run" / "attributes" / f"category={category}"
            part.mkdir(parents=True, exist_ok=True)
            mine = [r for r in rows if r[1] == category]
            pq.write_table(pa.table({"product_id": [r[0] for r in mine], "attribute": [r[2] for r in mine],
                                     "value": [r[3] for r in mine]}), part / f"{start // chunk:06d}.parquet")
    _job_record(folder / "run", folder / "attributes.json", input=str(folder / "records.jsonl"))
    return records


def _pick(folder: Path, capsys, *options: str, out: str = "label") -> tuple[dict, list[dict], str]:
    argv = ["pick", str(folder / "run"), "--attributes", str(folder / "attributes.json"), *options, "--out", str(folder / out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    picked = [json.loads(line) for line in (folder / out / "records.jsonl").read_text().splitlines()]
    return json.loads(captured.out.splitlines()[-1]), picked, captured.err


def test_cli_picks_each_categorys_share_first_in_the_seeds_order(tmp_path, capsys):
    """Each category's quota of the output's products, those first in the seed's order (the
    reference ``select``), in input order; the same for a seed, another for another seed."""
    sizes = {"A": 60, "B": 30, "C": 10}
    records = _catalog(tmp_path, sizes)
    products = [(r["product_id"], r["category"]) for r in records]
    runs = {}
    for n, seed in enumerate((0, 0, 1)):
        summary, picked, _ = _pick(tmp_path, capsys, "--count", "20", "--seed", str(seed), out=f"label{n}")
        assert summary["per_category"] == quotas(sizes, 20, 2, seed)
        assert (summary["of"], summary["looked_up"], summary["not_in_input"]) == (100, 40, 0)  # quota + 1 reserve each
        assert [r["product_id"] for r in picked] == select(products, SelectionConfig(20, seed=seed))
        assert picked == [r for r in records if r in picked]  # as they were, in input order
        drafts = [json.loads(line) for line in (tmp_path / f"label{n}" / "gold-draft.jsonl").read_text().splitlines()]
        assert [d["target_scores"]["Color"] for d in drafts] == [{f"Color of {r['product_id']}": 1} for r in picked]
        runs[n] = picked
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_cli_takes_reserves_for_products_not_in_the_input_and_says_when_they_run_out(tmp_path, capsys):
    """A product the input (as the job read it) lacks is stood in for by the next in the seed's
    order: the picks are each category's quota of the products it has, first in the order (quotas
    by the output's counts), as long as no more are missing than the reserves (one per product
    picked); past that, the category gets fewer and the command says so."""
    sizes = {"A": 60, "B": 30, "C": 10}
    records = _catalog(tmp_path, sizes)
    key = seed_key(0)
    first = {c: sorted((r["product_id"] for r in records if r["category"] == c), key=lambda p: rank(p, key)) for c in sizes}
    gone = {first["A"][0], first["A"][3], first["B"][1], first["C"][0]}  # within each category's reserves
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records if r["product_id"] not in gone))
    summary, picked, err = _pick(tmp_path, capsys, "--count", "20")
    wanted = quotas(sizes, 20, 2, 0)
    assert summary["per_category"] == wanted and summary["not_in_input"] == 4 and summary["looked_up"] == 40
    assert {r["product_id"] for r in picked} == {p for c in sizes for p in [p for p in first[c] if p not in gone][: wanted[c]]}
    assert (f"warning: 4 of the 40 products of {tmp_path / 'run'} are not in {tmp_path / 'records.jsonl'} as the job read "
            "it (0 under another category; it looked up only those it may pick and their reserves, of 100)") in err
    assert "fewer than --count" not in err and "short of" not in err
    gone |= set(first["C"][:-1])  # all of C's but its last in the order: its reserves are not enough
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records if r["product_id"] not in gone))
    summary, picked, err = _pick(tmp_path, capsys, "--count", "20", out="label2")
    assert summary["per_category"] == {c: n for c, n in wanted.items() if c != "C"} and summary["picked"] == 20 - wanted["C"]
    assert (f"fewer than --count 20: short of their share: C 0 of {wanted['C']} (more of its products are not in the "
            "input than its reserves (1 per product picked)); a share follows the output's count") in err
    # a category of 2, 1 of them in the input: every product of it was looked up
    small = {**sizes, "C": 2}
    (tmp_path / "small").mkdir()
    records = _catalog(tmp_path / "small", small)
    first = sorted((r["product_id"] for r in records if r["category"] == "C"), key=lambda p: rank(p, key))
    (tmp_path / "small" / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records if r["product_id"] != first[0]))
    summary, _, err = _pick(tmp_path / "small", capsys, "--count", "20")
    assert summary["per_category"]["C"] == 1 and quotas(small, 20, 2, 0)["C"] == 2
    assert "short of their share: C 1 of 2 (no more of its products are in the input)" in err


def test_cli_picks_odd_outputs_by_the_rule_or_says_why_not(tmp_path, capsys):
    """A category whose files hold no product (a crash before, KeyError); integer ids; a product
    written under two categories counts only under its record's (it took the other's place); a
    product whose rows lie in two files is said (counts per category are per file); an output
    without _report.json is said to be unfinished; an output of no products is refused."""
    sizes = {"A": 10, "B": 10}
    records = _catalog(tmp_path, sizes)
    (tmp_path / "run" / "_report.json").write_text("{}")
    empty = tmp_path / "run" / "attributes" / "category=E"
    empty.mkdir()
    pq.write_table(pa.table({"product_id": pa.array([], pa.string()), "attribute": pa.array([], pa.string()),
                             "value": pa.array([], pa.string())}), empty / "0.parquet")
    summary, picked, err = _pick(tmp_path, capsys, "--count", "6", "--min-per-category", "1")
    assert summary["per_category"] == quotas(sizes, 6, 1, 0) == {"A": 3, "B": 3} and "warning" not in err

    key = seed_key(0)
    a_first = min((r["product_id"] for r in records if r["category"] == "A"), key=lambda p: rank(p, key))
    intruder = tmp_path / "run" / "attributes" / "category=B" / "intruder.parquet"  # A's first, also written under B
    pq.write_table(pa.table({"product_id": [a_first], "attribute": ["Brand"], "value": ["x"]}), intruder)
    summary, picked, err = _pick(tmp_path, capsys, "--count", "6", "--min-per-category", "1", out="label2")
    by_category = {c: [r["product_id"] for r in picked if r["category"] == c] for c in sizes}
    assert a_first in by_category["A"] and a_first not in by_category["B"] and len(picked) == len(set(r["product_id"] for r in picked))
    assert summary["per_category"] == {"A": 3, "B": 3} and "under more than one category (1)" in err
    intruder.unlink()
    split = tmp_path / "run" / "attributes" / "category=A" / "split.parquet"  # another attribute of A's first, in a file of its own
    pq.write_table(pa.table({"product_id": [a_first], "attribute": ["Size"], "value": ["10"]}), split)
    _, _, err = _pick(tmp_path, capsys, "--count", "6", "--min-per-category", "1", out="label3")
    assert f"have their rows in more than one file (1 of those looked up, e.g. '{a_first}')" in err
    split.unlink()

    (tmp_path / "run" / "_report.json").unlink()
    _, _, err = _pick(tmp_path, capsys, "--count", "6", out="label4")
    assert f"warning: {tmp_path / 'run'} has no _report.json: its job has not finished" in err

    ints = tmp_path / "ints"
    (ints / "run" / "attributes" / "category=A").mkdir(parents=True)
    (ints / "records.jsonl").write_text("".join(json.dumps({"product_id": i, "category": "A", "title": f"t {i}"}) + "\n"
                                                for i in range(8)))
    (ints / "attributes.json").write_text(json.dumps({"A": ["Brand", "Color"]}))
    pq.write_table(pa.table({"product_id": list(range(8)), "attribute": ["Brand"] * 8, "value": [f"b{i}" for i in range(8)]}),
                   ints / "run" / "attributes" / "category=A" / "0.parquet")
    _job_record(ints / "run", ints / "attributes.json", input=str(ints / "records.jsonl"))
    summary, picked, _ = _pick(ints, capsys, "--count", "3")
    assert summary["picked"] == 3
    assert [str(r["product_id"]) for r in picked] == select([(str(i), "A") for i in range(8)], SelectionConfig(3))  # records as they were

    for path in (tmp_path / "run" / "attributes").rglob("*.parquet"):
        path.unlink()
    pq.write_table(pa.table({"product_id": pa.array([], pa.string()), "attribute": pa.array([], pa.string()),
                             "value": pa.array([], pa.string())}), empty / "0.parquet")
    assert main(["pick", str(tmp_path / "run"), "--attributes", str(tmp_path / "attributes.json"), "--count", "3",
                 "--out", str(tmp_path / "label5")]) == 2
    assert "holds no products: nothing to pick" in capsys.readouterr().err


def test_cli_places_products_of_no_category_by_their_input_record(tmp_path, capsys):
    """A hand-made output whose file has no category (no category= folder, no column) is picked
    from by the categories of the products' records in the input; one with a category column (an
    older output) by that column."""
    records = [{"product_id": f"p{i}", "category": "Tea" if i % 3 else "Shoes", "title": f"product {i}"} for i in range(12)]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "attributes.json").write_text(json.dumps({"Shoes": ["Brand"], "Tea": ["Flavor"]}))
    rows = [(r["product_id"], "Brand" if r["category"] == "Shoes" else "Flavor", f"v{r['product_id']}") for r in records[:10]]
    (tmp_path / "run" / "attributes").mkdir(parents=True)
    pq.write_table(pa.table({"product_id": [r[0] for r in rows], "attribute": [r[1] for r in rows], "value": [r[2] for r in rows]}),
                   tmp_path / "run" / "attributes" / "loose.parquet")
    argv = ["--input", str(tmp_path / "records.jsonl"), "--count", "4", "--min-per-category", "1"]
    summary, picked, _ = _pick(tmp_path, capsys, *argv)
    products = [(r["product_id"], r["category"]) for r in records[:10]]
    assert summary["per_category"] == quotas({"Shoes": 4, "Tea": 6}, 4, 1, 0) == {"Shoes": 2, "Tea": 2}
    assert summary["of"] == 10
    assert [r["product_id"] for r in picked] == select(products, SelectionConfig(4, 1))
    drafts = [json.loads(line) for line in (tmp_path / "label" / "gold-draft.jsonl").read_text().splitlines()]
    assert [d["category"] for d in drafts] == [r["category"] for r in picked]
    assert all(set(d["target_scores"][a]) == {f"v{d['product_id']}"} for d in drafts for a in d["target_scores"])
    (tmp_path / "run" / "attributes" / "loose.parquet").unlink()
    categories = {p: c for p, c in products}
    pq.write_table(pa.table({"product_id": [r[0] for r in rows], "category": [categories[r[0]] for r in rows],
                             "attribute": [r[1] for r in rows], "value": [r[2] for r in rows]}),
                   tmp_path / "run" / "attributes" / "older.parquet")
    assert _pick(tmp_path, capsys, *argv, out="label2")[1] == picked


def test_cli_picks_from_an_output_on_s3(tmp_path, s3_server, capsys):
    """An output on S3 is read as a local one is: the same picks."""
    from pyarrow import fs

    from datafiles.storage import s3_options

    _catalog(tmp_path, {"A": 20, "B": 10})
    bucket = s3_server.make_bucket("pick-output")
    filesystem = fs.S3FileSystem(**s3_options(s3_server.env))
    for file in (tmp_path / "run").rglob("*"):
        if file.is_file():
            with filesystem.open_output_stream(f"{bucket}/run/{file.relative_to(tmp_path / 'run')}") as out:
                out.write(file.read_bytes())
    local = _pick(tmp_path, capsys, "--count", "8")
    argv = ["pick", f"s3://{bucket}/run", "--attributes", str(tmp_path / "attributes.json"), "--count", "8",
            "--out", str(tmp_path / "label-s3")]
    assert main(argv) == 0 and json.loads(capsys.readouterr().out.splitlines()[-1])["per_category"] == local[0]["per_category"]
    assert (tmp_path / "label-s3" / "records.jsonl").read_text() == (tmp_path / "label" / "records.jsonl").read_text()
    assert (tmp_path / "label-s3" / "gold-draft.jsonl").read_text() == (tmp_path / "label" / "gold-draft.jsonl").read_text()


def test_cli_holds_the_picks_not_the_output(tmp_path, capsys, monkeypatch):
    """200,000 products: `hpd pick` never holds them all. Its traced Python allocations peak far
    below what the set of their ids alone takes (the pick before this held that and every value of
    each), and hardly higher than on an output of a tenth of the size (what it holds beyond the
    picks is the input reader's blocks); it reads the output a file at a time, only the product_id column
    but for the values of the picks, and those from the files that hold them only."""
    import tracemalloc

    from jobs import pick

    sizes = {"A": 100_000, "B": 60_000, "C": 30_000, "D": 10_000}
    for name, scale in (("small", 10_000), ("tenth", 10), ("big", 1)):
        (tmp_path / name).mkdir()
        records = _catalog(tmp_path / name, {c: n // scale for c, n in sizes.items()}, chunk=2048)
    files = sum(1 for _ in (tmp_path / "big" / "run" / "attributes").rglob("*.parquet"))
    _pick(tmp_path / "small", capsys, "--count", "5")  # what the command imports and caches, before the trace
    reads, values_read, peaks = [], [], {}

    def rows_by_category(filesystem, path, columns, read=pick.rows_by_category):
        tables = read(filesystem, path, columns)
        reads.append((columns, sum(table.num_rows for table in tables.values())))
        return tables

    def read_values(filesystem, paths, product_ids, read=pick.read_values):
        values_read.append((list(paths), set(product_ids)))
        return read(filesystem, values_read[-1][0], product_ids)

    tracemalloc.start()
    try:
        for name in ("tenth", "big"):
            if name == "big":
                monkeypatch.setattr(pick, "rows_by_category", rows_by_category)
                monkeypatch.setattr(pick, "read_values", read_values)
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            summary, picked, _ = _pick(tmp_path / name, capsys, "--count", "300")
            peaks[name] = tracemalloc.get_traced_memory()[1] - before
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        ids = {f"p{i:07d}" for i in range(len(records))}  # what holding the output's ids alone takes
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert summary["picked"] == 300 and summary["of"] == len(ids) == 200_000
    figures = f"peaks {peaks['tenth'] / 2**20:.2f} and {peaks['big'] / 2**20:.2f} MiB, the ids alone {held / 2**20:.2f} MiB"
    assert peaks["big"] < held / 4, figures  # 3.7 MiB and 18.9 MiB here: the input reader's 1 MiB blocks, split in lines
    assert peaks["big"] < peaks["tenth"] + held / 20, figures  # ten times the products, (almost) nothing more held
    assert {columns for columns, _ in reads} == {("product_id",)} and len(reads) == 2 * files  # the census, the sample
    assert max(rows for _, rows in reads) <= 2 * 2048  # one file's rows at a time
    [(paths, wanted)] = values_read
    assert wanted == {r["product_id"] for r in picked} and len(paths) <= 300
    products = [(r["product_id"], r["category"]) for r in records]
    assert [r["product_id"] for r in picked] == select(products, SelectionConfig(300))  # the slow reference agrees


def test_the_summary_names_every_category_of_a_few_and_the_extremes_of_many():
    from collections import Counter

    from jobs.pick import SHOWN_CATEGORIES, by_category

    assert by_category(Counter({"Tea": 2, "Shoes": 3})) == "Shoes 3, Tea 2"
    many = Counter({f"Cat {i:04d}": 2 for i in range(2000)} | {"Big": 40, "Small": 1})
    line = by_category(many)
    assert line.startswith("2002 categories, the most picked Big 40, Cat 0000 2") and line.count(",") < 2 * SHOWN_CATEGORIES
    assert "the least" in line and "Small 1 (all of them: the JSON line's per_category)" in line


def test_cli_writes_a_labelling_sheet_that_convert_labels_turns_into_the_gold(tmp_path, capsys):
    """hpd pick's labels.csv, corrected in a spreadsheet, becomes gold.jsonl (hpd convert labels),
    which hpd finetune reads; saved unchanged it is the draft, byte for byte."""
    import csv

    records = [{"product_id": "a1", "category": "Shoes", "title": "Acme red shoe"},
               {"product_id": "a2", "category": "Tea", "title": "Leafy green tea"}]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "attributes.json").write_text(json.dumps({"Shoes": ["Brand", "Color"], "Tea": ["Flavor"]}))
    _job_output(tmp_path / "run", [("a1", "Shoes", "Brand", "Acme"), ("a1", "Shoes", "Color", None),
                                   ("a2", "Tea", "Flavor", "Leafy")])
    label = tmp_path / "label"
    assert main(["pick", str(tmp_path / "run"), "--input", str(tmp_path / "records.jsonl"), "--attributes",
                 str(tmp_path / "attributes.json"), "--count", "2", "--min-per-category", "1", "--out", str(label)]) == 0
    assert f"hpd convert labels {label / 'labels.csv'} --out {label}" in capsys.readouterr().err
    convert = ["convert", "labels", str(label / "labels.csv"), "--out", str(label)]
    assert main(convert) == 0
    assert (label / "gold.jsonl").read_bytes() == (label / "gold-draft.jsonl").read_bytes()
    capsys.readouterr()

    with open(label / "labels.csv", encoding="utf-8-sig", newline="") as sheet:
        rows = list(csv.reader(sheet))
    assert rows[1:] == [["a1", "Shoes", "Acme red shoe", "Brand", "Acme"], ["a1", "Shoes", "Acme red shoe", "Color", ""],
                        ["a2", "Tea", "Leafy green tea", "Flavor", "Leafy"]]
    rows[2][4], rows[3][4] = "red", "green"  # the person's corrections
    with open(label / "labels.csv", "w", encoding="utf-8-sig", newline="") as sheet:
        csv.writer(sheet).writerows(rows)
    assert main(convert) == 0
    out = capsys.readouterr()
    assert json.loads(out.out.splitlines()[-1]) == {"products": 2, "values": 3, "warnings": 0, "out": str(label / "gold.jsonl")}
    assert "(replaced)" in out.err and f"hpd finetune --train {label} --init-adapter default" in out.err
    from training import data

    loaded = data.load_gold(data.resolve_sources(label))
    assert [(p.product.product_id, p.values) for p in loaded.products] == [("a1", ("Acme", "red")), ("a2", ("green",))]

    rows[1][3] = "brand"
    with open(label / "labels.csv", "w", encoding="utf-8-sig", newline="") as sheet:
        csv.writer(sheet).writerows(rows)
    assert main(convert) == 2
    assert "row 2: attribute 'brand' is not one of category 'Shoes''s (did you mean 'Brand'?)" in capsys.readouterr().err
    assert main([*convert, "--split", "x"]) == 2 and "--split: options of the extractgpt format" in capsys.readouterr().err
    (label / "labels.csv").write_bytes("product_id,category,title,attribute,value\na1,Shoes,Caf\u00e9,Brand,Acme\n".encode("latin-1"))
    assert main(convert) == 2 and 'is not UTF-8 text (byte 0xe9 at byte 54): save it from the spreadsheet program as ' \
        '"CSV UTF-8"' in capsys.readouterr().err
    (label / "records.jsonl").unlink()
    assert main(convert) == 2 and "records.jsonl not found: the sheet must lie in the folder" in capsys.readouterr().err
