"""`hpd finetune` end to end on a tiny model saved to disk, and the training-data loaders."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpd_core.lora_merge import plain_lora
from jobs.cli import main
from jobs.finetune import CONFIG_FILE, EPOCH_FILE, docs_options, split
from jobs.quiet import LevelPrefix, quiet_libraries
from training import data as gold

ATTRIBUTES = {"Shoes": ["Brand", "Color", "Size"], "Food": ["Brand", "Flavor"]}
TITLES = [
    ("Shoes", "Acme red sneaker size 10", {"Brand": {"Acme": 1}, "Color": {"red": 1, "Red": 1}, "Size": {"10": 1}}),
    ("Shoes", "Nike black loafer", {"Brand": {"Nike": 1}, "Color": {"black": 1}}),
    ("Food", "Acme cola 500 ml", {"Brand": {"Acme": 1}, "Flavor": {"n/a": 1}}),
    ("Shoes", "leather shoe blue", {"Color": {"blue": 1}}),
    ("Food", "cherry drink pack of 12", {"Flavor": {"cherry": 1}}),
    ("Shoes", "women's sneaker small", {"Size": {"small": 1}}),
]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """What `hpd convert extractgpt` writes: records.jsonl, gold.jsonl, attributes.json."""
    folder = tmp_path_factory.mktemp("train")
    records = [{"product_id": f"p{i}", "category": c, "title": t} for i, (c, t, _) in enumerate(TITLES)]
    records.append({"product_id": "bad", "category": "Toys", "title": "unknown category"})
    write_jsonl(folder / "records.jsonl", records)
    gold_rows = [{"product_id": f"p{i}", "category": c, "target_scores": g} for i, (c, _, g) in enumerate(TITLES)]
    write_jsonl(folder / "gold.jsonl", gold_rows)
    (folder / "attributes.json").write_text(json.dumps(ATTRIBUTES))
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from tests.hpd_core.conftest import build_tokenizer, tiny_model

    folder = tmp_path_factory.mktemp("model")
    tokenizer = build_tokenizer()
    tiny_model("llama", len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_gold_targets_first_key_and_nulls(data_dir):
    data = gold.load_gold(gold.resolve_sources(data_dir))
    by_id = {p.product.product_id: p for p in data.products}
    assert by_id["p0"].values == ("Acme", "red", "10")  # first key of target_scores
    assert by_id["p1"].values == ("Nike", "black", None)  # absent attribute: null
    assert by_id["p2"].values == ("Acme", None)  # "n/a": null
    assert [a.name for a in data.attributes["Food"]] == ["Brand", "Flavor"]
    assert data.stats["rejected"] == {"unknown category 'Toys' (not in the attribute schema, --attributes)": 1}
    assert data.stats["products"] == 6


def test_gold_targets_prefer_a_spelling_of_the_text_and_count_the_rest(data_dir, tmp_path, caplog):
    """Extraction writes only values of the product's text: a target is the first acceptable value
    the text holds (else the first), and targets outside the text are counted and warned about."""
    assert "targets_not_in_text" not in gold.load_gold(gold.resolve_sources(data_dir)).stats  # all in text
    folder = tmp_path / "mine"
    folder.mkdir()
    write_jsonl(folder / "records.jsonl", [
        {"product_id": "a", "category": "Shoes", "title": "Acme Men's runner, Red"},
        {"product_id": "b", "category": "Shoes", "title": "Zed trail shoe"},
    ])
    write_jsonl(folder / "gold.jsonl", [
        {"product_id": "a", "category": "Shoes", "target_scores": {"Brand": {"ACME": 1, "Acme": 1}, "Color": {"red": 1}}},
        {"product_id": "b", "category": "Shoes", "target_scores": {"Brand": {"Zed": 1}, "Size": {"n/a": 1, "10": 1}}},
    ])
    (folder / "attributes.json").write_text(json.dumps(ATTRIBUTES))
    data = gold.load_gold(gold.resolve_sources(folder))
    by_id = {p.product.product_id: p for p in data.products}
    assert by_id["a"].values == ("Acme", "red", None)  # "ACME" is not in the text, "Acme" is; no "red" there
    assert by_id["b"].values == ("Zed", None, None)  # "n/a" first: null
    assert data.stats["targets_not_in_text"] == 1
    assert data.stats["target_not_in_text_example"] == "'red' for a"
    caplog.set_level("WARNING")
    assert main(["finetune", "--train", str(folder), "--out", str(tmp_path / "out"), "--model", str(tmp_path / "nothing")]) != 0
    assert "1 of the 3 target values are not in their product's text (e.g. 'red' for a)" in caplog.text


def test_integer_product_ids_train_and_their_held_out_products_are_written(tmp_path):
    """Catalogs number their products: integer ids in records and gold are their decimal strings,
    and the validation folder holds the held-out products' records and gold (it came out empty)."""
    from jobs.finetune import write_validation
    from datafiles.dataset import read_gold

    folder = tmp_path / "numbered"
    folder.mkdir()
    write_jsonl(folder / "records.jsonl", [{"product_id": 10 + i, "category": c, "title": t} for i, (c, t, _) in enumerate(TITLES)])
    write_jsonl(folder / "gold.jsonl", [{"product_id": 10 + i, "category": c, "target_scores": g} for i, (c, _, g) in enumerate(TITLES)])
    (folder / "attributes.json").write_text(json.dumps(ATTRIBUTES))
    sources = gold.resolve_sources(folder)
    data = gold.load_gold(sources)
    assert [p.product.product_id for p in data.products] == [str(10 + i) for i in range(len(TITLES))]
    held_out = write_validation(sources, data.products[:2], tmp_path / "out")
    kept = [json.loads(line)["product_id"] for line in (held_out / "records.jsonl").read_text().splitlines()]
    assert kept == [10, 11]  # the records as given
    assert [g.product_id for g in read_gold(str(held_out / "gold.jsonl"))] == ["10", "11"]


def test_teacher_targets_from_extract_output(data_dir, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for i, (category, _, _) in enumerate(TITLES[:4]):
        for name in ATTRIBUTES[category]:
            rows.append({"product_id": f"p{i}", "category": category, "attribute": name,
                         "value": None if name == "Size" else f"t{i}-{name}", "truncated": i == 3 and name == "Color"})
    for category in ATTRIBUTES:
        part = tmp_path / "run" / "attributes" / f"category={category}"
        part.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist([r for r in rows if r["category"] == category]), part / "part-0.parquet")
    data = gold.load_teacher(gold.resolve_sources(data_dir / "records.jsonl"), str(tmp_path / "run"))
    by_id = {p.product.product_id: p for p in data.products}
    assert sorted(by_id) == ["p0", "p1", "p2"]  # p3 truncated, p4/p5 not answered
    assert by_id["p0"].values == ("t0-Brand", "t0-Color", None)
    assert by_id["p2"].values == ("t2-Brand", "t2-Flavor")
    assert data.stats["skipped"] == {"teacher value truncated": 1, "no teacher values": 2}


def write_teacher(folder: Path, confidence: bool) -> str:
    """An `hpd extract` output for the first three TITLES products: value ``v<i><n>``; with
    ``confidence``, 0.95 or 0.5 by turns, and each product's third value null with none (the text
    check's null)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for i, (category, _, _) in enumerate(TITLES[:3]):
        for n, attribute in enumerate(ATTRIBUTES[category]):
            row = {"product_id": f"p{i}", "category": category, "attribute": attribute,
                   "value": None if confidence and n == 2 else f"v{i}{n}", "truncated": False}
            if confidence:
                row["confidence"] = None if n == 2 else (0.95 if (i + n) % 2 == 0 else 0.5)
            rows.append(row)
    for category in ATTRIBUTES:
        part = folder / "attributes" / f"category={category}"
        part.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist([r for r in rows if r["category"] == category]), part / "part-0.parquet")
    return str(folder)


def test_teacher_values_below_a_confidence_are_no_targets(data_dir, tmp_path):
    """--min-confidence: a teacher value under it (or without one: the text check's null) is kept
    as the slot's value and marked unscored; an output without confidences is refused."""
    sources = gold.resolve_sources(data_dir / "records.jsonl")
    run = write_teacher(tmp_path / "run", confidence=True)
    data = gold.load_teacher(sources, run, min_confidence=0.9)
    by_id = {p.product.product_id: p for p in data.products}
    assert by_id["p0"].values == ("v00", "v01", None) and by_id["p0"].scored == (True, False, False)
    assert by_id["p1"].scored == (False, True, False) and by_id["p2"].scored == (True, False)
    assert data.stats["teacher_values_below_confidence"] == 5
    # the nulls below the floor are fed, not learned: no null targets
    assert (data.stats["slots"], data.stats["targets"], data.stats["null_targets"]) == (8, 3, 0)
    plain = gold.load_teacher(sources, run)
    assert all(p.scored is None for p in plain.products) and "teacher_values_below_confidence" not in plain.stats
    assert "targets" not in plain.stats and plain.stats["null_targets"] == 2
    assert gold.digest(plain) != gold.digest(data)  # a resume with another floor trains on other targets
    with pytest.raises(ValueError, match="has no confidence for these records' values .no confidence column.; extract it with `hpd extract --confidence`"):
        gold.load_teacher(sources, write_teacher(tmp_path / "bare", confidence=False), min_confidence=0.9)


def test_a_teachers_floor_reads_confidences_as_stored_and_refuses_what_it_cannot_use(data_dir, tmp_path):
    """The float32 column stores 0.9 as 0.89999998: at --min-confidence 0.9 it is a target, as
    `hpd evaluate`'s 0.9 row keeps it. A floor no value reaches, and an attribute given twice, are
    refused; of the products the records lack no value is held."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sources = gold.resolve_sources(data_dir / "records.jsonl")
    category, _, _ = TITLES[0]
    names = ATTRIBUTES[category]

    def teacher(folder: Path, rows: list[dict]) -> str:
        part = folder / "attributes" / f"category={category}"
        part.mkdir(parents=True)
        schema = pa.schema([("product_id", pa.string()), ("attribute", pa.string()), ("value", pa.string()),
                            ("truncated", pa.bool_()), ("confidence", pa.float32())])
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), part / "part-0.parquet")
        return str(folder)

    rows = [{"product_id": pid, "attribute": name, "value": f"{pid}-{name}", "truncated": False, "confidence": 0.9}
            for pid in ("p0", "stray") for name in names]
    data = gold.load_teacher(sources, teacher(tmp_path / "at", rows), min_confidence=0.9)
    assert [p.scored for p in data.products] == [(True,) * len(names)]
    assert data.stats["teacher_values_below_confidence"] == 0 and data.stats["teacher_rows"] == 6
    with pytest.raises(ValueError, match="none of the teacher's 3 values .* has that confidence, so there is nothing to train on"):
        gold.load_teacher(sources, str(tmp_path / "at"), min_confidence=0.95)
    twice = rows[:1] + [{**rows[0], "value": None, "confidence": None}]
    with pytest.raises(ValueError, match="duplicate prediction for product 'p0', attribute 'Brand'"):
        gold.load_teacher(sources, teacher(tmp_path / "twice", twice), min_confidence=0.9)


def test_cli_trains_on_a_teachers_sure_values(data_dir, model_dir, tmp_path, capsys):
    out = tmp_path / "adapter"
    argv = ["finetune", "--train", str(data_dir), "--model", str(model_dir), "--out", str(out),
            "--teacher", write_teacher(tmp_path / "teacher", confidence=True), "--min-confidence", "0.9",
            "--docs-per-prompt", "2", "--max-value-tokens", "8", "--lora-rank", "4", "--epochs", "1",
            "--val-fraction", "0.34", "--lr", "1e-2"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    record = json.loads((out / CONFIG_FILE).read_text())
    assert summary["steps"] >= 1 and record["args"]["min_confidence"] == 0.9
    assert record["data"]["teacher_values_below_confidence"] == 5 and record["data"]["products"] == 3


@pytest.mark.parametrize("extra, message", [
    ([], "--min-confidence is for a teacher's values (--teacher OUTPUT)"),
    (["--teacher", "T", "--decoder", "ar"], "--min-confidence is for --decoder hpd"),
    (["--teacher", "T", "--min-confidence", "1.5"], "--min-confidence must be in (0, 1], got 1.5"),
])
def test_a_confidence_floor_needs_a_teacher_and_the_hpd_view(data_dir, tmp_path, capsys, extra, message):
    argv = ["finetune", "--train", str(data_dir), "--out", str(tmp_path / "run"), "--min-confidence", "0.9", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_split_is_seeded_and_disjoint():
    items = list(range(20))
    train, val = split(items, 0.25, seed=3)
    assert len(val) == 5 and sorted(train + val) == items
    assert split(items, 0.25, seed=3) == (train, val)
    with pytest.raises(ValueError):
        split(items, 1.0, seed=0)


@pytest.mark.parametrize("decoder", ["hpd", "ar"])
def test_cli_smoke(data_dir, model_dir, tmp_path, capsys, caplog, decoder):
    from hpd_core.config import ModelConfig
    from hpd_core.models import load_model

    out = tmp_path / "adapter"
    argv = ["finetune", "--train", str(data_dir), "--model", str(model_dir), "--out", str(out),
            "--decoder", decoder, "--docs-per-prompt", "2", "--max-value-tokens", "8", "--lora-rank", "4",
            "--epochs", "2", "--val-fraction", "0.34", "--log-every", "1", "--lr", "1e-2",
            *(["--dtype", "auto"] if decoder == "ar" else [])]  # fmt: skip
    caplog.set_level(logging.INFO)
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["decoder"] == decoder and summary["steps"] >= 2
    record = json.loads((out / CONFIG_FILE).read_text())
    assert record["train_config"]["decoder"] == decoder
    from hpd_core.models import resolve_dtype

    asked = "auto" if decoder == "ar" else ModelConfig().dtype  # --dtype auto: what it chose is said and recorded
    assert record["args"]["dtype"] == record["model"]["dtype"] == asked and record["dtype"] == resolve_dtype(asked, "cpu")
    said = f"weights dtype: {record['dtype']}" + (" (--dtype auto on cpu)" if decoder == "ar" else "")
    assert said in caplog.text
    assert record["data"]["train_products"] == 4 and record["data"]["val_products"] == 2
    assert len(record["report"]["val_losses"]) == 3  # before training and after each epoch
    assert all(v is not None for v in record["report"]["val_losses"])
    assert record["targets"] == "gold" and record["args"]["docs_per_prompt"] == 2
    from hpd_core import prompts

    assert record["prompt_format"] == prompts.PROMPT_FORMAT  # how its prompts were laid out
    assert (out / "adapter_config.json").is_file()
    assert not (out / "checkpoint").exists()  # removed once the run completed
    # the held-out products, as an `hpd convert` folder to extract and evaluate on
    validation = out / "validation"
    val_ids = [json.loads(line)["product_id"] for line in (validation / "records.jsonl").read_text().splitlines()]
    gold_ids = [json.loads(line)["product_id"] for line in (validation / "gold.jsonl").read_text().splitlines()]
    assert len(val_ids) == 2 and gold_ids == val_ids
    from datafiles.dataset import read_attributes

    assert read_attributes(str(validation / "attributes.json")) == ATTRIBUTES  # the schema, written as JSON
    assert main(argv + ["--resume"]) == 2  # nothing to resume
    assert "no checkpoint" in capsys.readouterr().err
    model, _ = load_model(ModelConfig(name=str(model_dir), adapter=str(out)))
    assert not any("lora" in name for name, _ in model.named_parameters())  # merged on load


def test_save_epochs_keeps_each_epochs_adapter(data_dir, model_dir, tmp_path, capsys):
    import torch

    from hpd_core.config import ModelConfig
    from hpd_core.models import load_model

    out = tmp_path / "run"
    argv = ["finetune", "--train", str(data_dir), "--model", str(model_dir), "--out", str(out),
            "--docs-per-prompt", "2", "--max-value-tokens", "8", "--lora-rank", "4", "--epochs", "2",
            "--val-fraction", "0.34", "--lr", "1e-2", "--save-epochs"]  # fmt: skip
    assert main(argv) == 0
    val_losses = json.loads((out / CONFIG_FILE).read_text())["report"]["val_losses"]
    epochs = [json.loads((out / f"epoch-{n}" / EPOCH_FILE).read_text()) for n in (1, 2)]
    assert [e["epoch"] for e in epochs] == [1, 2] and [e["val_loss"] for e in epochs] == val_losses[1:]
    assert epochs[0]["steps"] < epochs[1]["steps"] == json.loads(capsys.readouterr().out.splitlines()[-1])["steps"]
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        final, first, last = (load_model(ModelConfig(name=str(model_dir), adapter=str(a)))[0](input_ids=ids).logits
                              for a in (out, out / "epoch-1", out / "epoch-2"))
    torch.testing.assert_close(last, final)  # the last epoch is the run's result
    assert (first - final).abs().max() > 1e-4  # and the first is the model as it was then


def test_examples_describe_attributes_from_the_training_products_only(data_dir, model_dir, tmp_path, capsys):
    """--examples K: the schema the run trains with (OUT/attributes.json, and the validation
    folder's) describes each attribute by values of the products it trains on, never the held-out
    ones; the prompts carry it (the first step's loss differs from a plain run's)."""
    base = ["finetune", "--train", str(data_dir), "--model", str(model_dir), "--docs-per-prompt", "2",
            "--max-value-tokens", "8", "--lora-rank", "4", "--max-steps", "1", "--grad-accum", "1",
            "--val-fraction", "0.34"]  # fmt: skip
    losses = {}
    for name, extra in (("plain", []), ("examples", ["--examples", "3"])):
        assert main(base + ["--out", str(tmp_path / name), *extra]) == 0
        losses[name] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["train_loss"]
    assert losses["examples"] != pytest.approx(losses["plain"], rel=1e-4)
    assert not (tmp_path / "plain" / "attributes.json").exists()
    out = tmp_path / "examples"
    schema = json.loads((out / "attributes.json").read_text())
    assert json.loads((out / "validation" / "attributes.json").read_text()) == schema
    data = gold.load_gold(gold.resolve_sources(data_dir))
    train, held = split(data.products, 0.34, 0)
    seen = {v for p in train for v in p.values if v is not None}
    held_only = {v for p in held for v in p.values if v is not None} - seen
    assert held_only  # the check below has something to catch
    descriptions = " ".join(d or "" for attrs in schema.values() for d in attrs.values())
    assert all(json.dumps(v) not in descriptions for v in held_only)
    assert all(json.dumps(v) in descriptions for v in seen)  # K = 3 covers every value of this tiny set
    assert list(schema) == list(ATTRIBUTES) and all(list(schema[c]) == ATTRIBUTES[c] for c in ATTRIBUTES)


def test_cli_max_steps_and_bad_options(data_dir, model_dir, tmp_path, capsys):
    out = tmp_path / "a"
    base = ["finetune", "--train", str(data_dir), "--model", str(model_dir), "--out", str(out), "--max-value-tokens", "8"]
    assert main(base + ["--max-steps", "1", "--grad-accum", "1", "--lora-rank", "2"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 1
    capsys.readouterr()
    assert main(base + ["--docs-per-prompt", "0"]) == 2
    assert "docs_per_prompt" in capsys.readouterr().err
    assert main(base + ["--gold", str(tmp_path / "missing.jsonl")]) == 2
    assert "gold file" in capsys.readouterr().err
    assert main(["finetune", "--train", str(data_dir), "--model", "default", "--out", str(out)]) == 2
    assert "--model default-base" in capsys.readouterr().err
    assert main(["finetune", "--train", str(data_dir), "--model", "smollm2-135m-hpd", "--out", str(out)]) == 2
    assert "use --model smollm2-135m" in capsys.readouterr().err


def test_init_adapter_continues_where_the_adapter_ended(data_dir, model_dir, tmp_path, capsys):
    """A run from an adapter begins at that adapter: its validation loss before training is the
    first run's after training (same held-out products), and it takes the adapter's rank and alpha."""
    base = ["finetune", "--train", str(data_dir), "--model", str(model_dir), "--max-value-tokens", "8",
            "--val-fraction", "0.34", "--grad-accum", "1", "--lr", "1e-2"]  # fmt: skip
    assert main(base + ["--out", str(tmp_path / "first"), "--max-steps", "3", "--lora-rank", "4", "--lora-alpha", "16"]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    argv = base + ["--out", str(tmp_path / "second"), "--max-steps", "1", "--init-adapter", str(tmp_path / "first")]
    assert main(argv) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert second["val_losses"][0] == pytest.approx(first["val_losses"][-1], rel=1e-5)
    assert first["val_losses"][0] > first["val_losses"][-1] + 0.01  # the first run moved it
    record = json.loads((tmp_path / "second" / CONFIG_FILE).read_text())
    assert (record["train_config"]["lora_rank"], record["train_config"]["lora_alpha"]) == (4, 16)
    assert record["args"]["init_adapter"] == record["init_adapter"] == str(tmp_path / "first")
    assert plain_lora(tmp_path / "second") is not None  # so extraction merges it without peft, as any adapter

    assert main(base + ["--out", str(tmp_path / "first"), "--init-adapter", str(tmp_path / "first")]) == 2
    assert "would overwrite the adapter it starts from" in capsys.readouterr().err

    assert main(base + ["--out", str(tmp_path / "third"), "--init-adapter", str(tmp_path / "first"), "--lora-rank", "8"]) == 2
    assert "has LoRA rank 4 and alpha 16, the run 8 and 16" in capsys.readouterr().err
    assert main(base + ["--out", str(tmp_path / "third"), "--init-adapter", str(tmp_path / "first"), "--full"]) == 2
    assert "for LoRA runs" in capsys.readouterr().err
    assert main(base + ["--out", str(tmp_path / "third"), "--init-adapter", str(tmp_path / "missing")]) == 2
    assert f"adapter to start from {tmp_path / 'missing'} does not exist" in capsys.readouterr().err
    assert main(base + ["--out", str(tmp_path / "third"), "--init-adapter", str(data_dir)]) == 2  # a folder, no adapter
    assert f"adapter to start from {data_dir} is not a PEFT adapter directory (no adapter_config.json)" in capsys.readouterr().err
    assert main(base + ["--out", str(tmp_path / "third"), "--init-adapter", "default"]) == 2  # not the default's base
    assert "default (--model default-base)" in capsys.readouterr().err
    assert main(base + ["--out", str(tmp_path / "third"), "--model", "default"]) == 2
    assert "--init-adapter default to start from the shipped adapter" in capsys.readouterr().err


def test_stop_after_epoch_then_resume(data_dir, model_dir, tmp_path, capsys):
    """A run in two sittings: the first stops after epoch 1 (its adapter kept with --save-epochs, the
    checkpoint kept, no final adapter), the same command with --resume finishes the schedule; a
    --resume with other options is refused."""
    out = tmp_path / "run"
    argv = ["finetune", "--train", str(data_dir), "--model", str(model_dir), "--out", str(out),
            "--docs-per-prompt", "2", "--max-value-tokens", "8", "--lora-rank", "4", "--epochs", "2",
            "--grad-accum", "1", "--val-fraction", "0.34", "--lr", "1e-2", "--save-epochs"]  # fmt: skip
    assert main(argv + ["--stop-after-epoch", "1"]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["stopped"] and len(first["val_losses"]) == 2
    assert (out / "checkpoint" / "checkpoint.pt").is_file() and (out / "epoch-1").is_dir()
    assert not (out / CONFIG_FILE).exists() and not (out / "epoch-2").exists()
    # a resumed sitting must be the same run: other options or data are refused, checkpoint kept
    assert main(argv + ["--resume", "--examples", "2"]) == 2
    assert "--examples (unset then, 2 now)" in capsys.readouterr().err
    assert main([*argv[:-3], "--lr", "2e-2", "--save-epochs", "--resume"]) == 2
    assert "--lr (0.01 then, 0.02 now)" in capsys.readouterr().err
    assert (out / "checkpoint" / "checkpoint.pt").is_file()
    assert main(argv + ["--resume", "--checkpoint-minutes", "30"]) == 0  # an option of the sitting only
    record = json.loads((out / CONFIG_FILE).read_text())
    assert record["report"]["steps"] > first["steps"] and len(record["report"]["val_losses"]) == 3
    assert record["report"]["val_losses"][:2] == first["val_losses"]
    assert (out / "epoch-2").is_dir() and not (out / "checkpoint").exists()
    assert main(argv + ["--stop-after-epoch", "0"]) == 2
    assert "--stop-after-epoch" in capsys.readouterr().err


def test_parquet_records_train_and_their_held_out_products_become_a_validation_folder(data_dir, model_dir, tmp_path, capsys):
    """Records given as Parquet: the validation folder gets them as JSON lines (before, reading the
    Parquet file as lines crashed the run after the model had loaded)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import datetime

    records = [json.loads(line) for line in (data_dir / "records.jsonl").read_text().splitlines()]
    table = pa.Table.from_pylist(records)  # with a column JSON cannot hold as it is
    table = table.append_column("listed", pa.array([datetime.datetime(2026, 11, 29)] * len(records)))
    pq.write_table(table, tmp_path / "records.parquet")
    out = tmp_path / "run"
    argv = ["finetune", "--train", str(tmp_path / "records.parquet"), "--attributes", str(data_dir / "attributes.json"),
            "--gold", str(data_dir / "gold.jsonl"), "--model", str(model_dir), "--out", str(out),
            "--max-value-tokens", "8", "--max-steps", "1", "--grad-accum", "1", "--lora-rank", "2", "--val-fraction", "0.34"]
    assert main(argv) == 0
    kept = [json.loads(line) for line in (out / "validation" / "records.jsonl").read_text().splitlines()]
    gold_ids = [json.loads(line)["product_id"] for line in (out / "validation" / "gold.jsonl").read_text().splitlines()]
    assert kept and sorted(r["product_id"] for r in kept) == sorted(gold_ids)
    assert all({k: v for k, v in r.items() if k != "listed"} in records for r in kept)
    assert {r["listed"] for r in kept} == {"2026-11-29 00:00:00"}


def test_options_set_to_zero_are_values_not_defaults():
    """--warmup-ratio 0 (no warm-up), --lora-dropout 0 and --seed 0 reach the run's config
    (before, a 0 was taken for 'not given' and the default trained instead); a gradient norm of 0,
    which would zero every gradient, is refused."""
    import argparse

    from hpd_core.config import TrainConfig
    from jobs.finetune import add_arguments, train_options

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    given = ["--train", "t", "--model", "m", "--out", "o", "--warmup-ratio", "0", "--lora-dropout", "0", "--seed", "0"]
    options = train_options(parser.parse_args(given))
    assert options["warmup_ratio"] == 0 and options["lora_dropout"] == 0 and options["seed"] == 0
    config = TrainConfig(**options)
    assert (config.warmup_ratio, config.lora_dropout) == (0, 0)
    assert "full" not in train_options(parser.parse_args(given))  # a flag left off: the default
    with pytest.raises(ValueError, match="max_grad_norm must be > 0"):
        TrainConfig(**train_options(parser.parse_args([*given, "--max-grad-norm", "0"])))


def test_docs_per_prompt_options_map_to_the_mix():
    """--docs-per-prompt alone fixes J; --max-docs-per-prompt makes a mix; neither: the recipe's mix."""
    import argparse

    from hpd_core.config import TrainConfig

    def config(docs, top):
        return TrainConfig(**docs_options(argparse.Namespace(docs_per_prompt=docs, max_docs_per_prompt=top)))

    default = TrainConfig()
    assert (config(None, None).docs_per_prompt, config(None, None).max_docs_per_prompt) == (1, 8)
    assert (default.docs_per_prompt, default.max_docs_per_prompt) == (1, 8)
    assert (config(6, None).docs_per_prompt, config(6, None).max_docs_per_prompt) == (6, None)
    assert (config(None, 4).docs_per_prompt, config(None, 4).max_docs_per_prompt) == (1, 4)
    assert (config(2, 5).docs_per_prompt, config(2, 5).max_docs_per_prompt) == (2, 5)


def test_resume_check_names_what_differs_and_passes_old_checkpoints(tmp_path, caplog):
    """check_resume: the same identity passes; another option or other data is named; a checkpoint
    from before run.json existed is resumed with a warning, unchecked."""
    import argparse

    from jobs.finetune import RUN_FILE, check_resume, run_identity

    args = argparse.Namespace(train=tmp_path / "t", lr=1e-2, examples=None, resume=False, log_every=5, func=print)
    first = run_identity(args, {"products": 6})
    assert first["options"] == {"train": str(tmp_path / "t"), "lr": 1e-2, "examples": None}  # sitting options left out
    check_resume(tmp_path, first)  # no run.json: an older checkpoint
    assert RUN_FILE in caplog.text and "not checked" in caplog.text
    (tmp_path / RUN_FILE).write_text(json.dumps(first))
    later = argparse.Namespace(**{**vars(args), "resume": True, "log_every": 50})
    check_resume(tmp_path, run_identity(later, {"products": 6}))
    with pytest.raises(ValueError, match=r"--lr \(0.01 then, 0.02 now\)"):
        check_resume(tmp_path, run_identity(argparse.Namespace(**{**vars(later), "lr": 2e-2}), {"products": 6}))
    with pytest.raises(ValueError, match="the data"):
        check_resume(tmp_path, run_identity(later, {"products": 7}))
    # an option left to its default is named by the default's value, not None
    with pytest.raises(ValueError, match=r"--lr \(the default 0.00025 then, 0.0001 now\), --examples \(unset then, 2 now\)"):
        (tmp_path / RUN_FILE).write_text(json.dumps(run_identity(argparse.Namespace(**{**vars(args), "lr": None}), {"products": 6})))
        check_resume(tmp_path, run_identity(argparse.Namespace(**{**vars(later), "lr": 1e-4, "examples": 2}), {"products": 6}))
    with pytest.raises(ValueError, match=r"--lr \(the default 2e-05 then, 0.0001 now\)"):  # full fine-tuning's
        (tmp_path / RUN_FILE).write_text(json.dumps(run_identity(argparse.Namespace(**{**vars(args), "lr": None, "full": True}), {"products": 6})))
        check_resume(tmp_path, run_identity(argparse.Namespace(**{**vars(later), "lr": 1e-4, "full": True}), {"products": 6}))
    with pytest.raises(ValueError, match=r"--epochs \(the default \d+ then, 9 now\)"):
        (tmp_path / RUN_FILE).write_text(json.dumps(run_identity(argparse.Namespace(**{**vars(args), "epochs": None}), {"products": 6})))
        check_resume(tmp_path, run_identity(argparse.Namespace(**{**vars(later), "epochs": 9}), {"products": 6}))


def test_gold_attribute_names_not_in_the_schema_are_refused(data_dir, tmp_path, capsys, caplog):
    """Gold with `brand` where the schema says `Brand` trained every Brand as none: refused, naming
    the file, the line, the name, the category's names; a gold category other than the record's is
    trained with the record's and warned of, counted."""
    folder = tmp_path / "lower"
    folder.mkdir()
    (folder / "records.jsonl").write_text((data_dir / "records.jsonl").read_text())
    (folder / "attributes.json").write_text(json.dumps(ATTRIBUTES))
    rows = [{"product_id": f"p{i}", "category": c, "target_scores": g} for i, (c, _, g) in enumerate(TITLES)]
    rows[1]["target_scores"] = {"brand": {"Nike": 1}, "Color": {"black": 1}}
    write_jsonl(folder / "gold.jsonl", rows)
    with pytest.raises(ValueError) as err:
        gold.load_gold(gold.resolve_sources(folder))
    assert (f"{folder / 'gold.jsonl'} line 2: brand (Brand?) (category 'Shoes': Brand, Color, Size): attribute names not "
            f"in the schema {folder / 'attributes.json'}") in str(err.value)
    rows[3]["target_scores"] = {"Kolor": {"blue": 1}}
    write_jsonl(folder / "gold.jsonl", rows)
    assert main(["finetune", "--train", str(folder), "--out", str(tmp_path / "out"), "--model", str(tmp_path / "none")]) == 2
    assert "line 2: brand (Brand?) (category 'Shoes': Brand, Color, Size) (and 1 more line(s))" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

    rows[1]["target_scores"], rows[3]["target_scores"] = TITLES[1][2], TITLES[3][2]
    rows[2]["category"] = "Shoes"  # its record says Food; its attributes are Food's
    write_jsonl(folder / "gold.jsonl", rows)
    data = gold.load_gold(gold.resolve_sources(folder))
    assert data.stats["gold_category_differs"] == 1
    caplog.set_level("WARNING")
    assert main(["finetune", "--train", str(folder), "--out", str(tmp_path / "out"), "--model", str(tmp_path / "none")]) != 0
    assert ("1 gold line(s) of " + str(folder / "gold.jsonl") + " give another category than their record "
            "(e.g. 'p2': 'Shoes' in the gold, 'Food' in the records)") in caplog.text


def test_a_second_run_into_a_used_out_is_refused(data_dir, model_dir, tmp_path, capsys):
    """A second run into the same --out overwrote the adapter and kept the first run's epoch-N/ and
    validation/ (scoring the new adapter on products it trained on): a non-empty --out is refused
    unless --resume; an empty folder is taken."""
    out = tmp_path / "run"
    out.mkdir()
    argv = ["finetune", "--train", str(data_dir), "--model", str(model_dir), "--out", str(out), "--max-value-tokens", "8",
            "--max-steps", "1", "--grad-accum", "1", "--lora-rank", "2", "--val-fraction", "0.34"]
    assert main(argv) == 0
    adapter = (out / "adapter_model.safetensors").read_bytes()
    capsys.readouterr()
    assert main([*argv[:-1], "0.5"]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} is not empty (it holds " in err and "adapter_model.safetensors" in err and "--resume" in err
    assert (out / "adapter_model.safetensors").read_bytes() == adapter
    assert main(argv + ["--resume"]) == 2  # nothing stopped there to continue
    assert "no checkpoint" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main([*argv[:6], str(tmp_path / "file"), *argv[7:]]) == 2
    assert "is a file" in capsys.readouterr().err
    # a first sitting that stopped before its first checkpoint (run.json and validation/ written):
    # --resume says so before the model loads, and the same command starts it over
    partial = tmp_path / "partial"
    (partial / "checkpoint").mkdir(parents=True)
    (partial / "checkpoint" / "run.json").write_text("{}")
    (partial / "validation").mkdir()
    assert main([*argv[:6], str(partial), *argv[7:], "--resume"]) == 2
    assert "the run stopped before its first one; run the same command without --resume" in capsys.readouterr().err
    assert main([*argv[:6], str(partial), *argv[7:]]) == 0 and (partial / "adapter_model.safetensors").is_file()


def test_gold_lines_without_a_record_and_rejected_records_are_counted_and_warned_of(data_dir, tmp_path, caplog):
    """Gold whose ids the records do not hold (ids written differently) lost its labels with only
    an INFO line: counted in the data summary, with an id of each, and warned of; rejected records
    are warned of too."""
    folder = tmp_path / "ids"
    folder.mkdir()
    (folder / "records.jsonl").write_text((data_dir / "records.jsonl").read_text())
    (folder / "attributes.json").write_text(json.dumps(ATTRIBUTES))
    rows = [{"product_id": f"p{i}", "category": c, "target_scores": g} for i, (c, _, g) in enumerate(TITLES)]
    rows += [{"product_id": "P-7", "category": "Shoes", "target_scores": {"Brand": {"Acme": 1}}},
             {"product_id": "bad", "category": "Toys", "target_scores": {"Brand": {"Acme": 1}}}]  # its record: rejected
    write_jsonl(folder / "gold.jsonl", rows)
    data = gold.load_gold(gold.resolve_sources(folder))
    assert data.stats["gold_not_in_records"] == 1
    assert data.stats["gold_not_in_records_example"] == "'P-7' (a record's id: 'bad')"
    assert "gold_not_in_records" not in gold.load_gold(gold.resolve_sources(data_dir)).stats  # earlier runs' data read the same
    caplog.set_level("WARNING")
    assert main(["finetune", "--train", str(folder), "--out", str(tmp_path / "out"), "--model", str(tmp_path / "none")]) != 0
    assert (f"1 gold line(s) of {folder / 'gold.jsonl'} have no record in {folder / 'records.jsonl'} "
            "(e.g. 'P-7' (a record's id: 'bad')): their labels are not trained on") in caplog.text
    assert (f"1 of the 7 records of {folder / 'records.jsonl'} are rejected, as extraction would reject them, and not "
            "trained on: 1 unknown category 'Toys'") in caplog.text


def test_validation_folder_from_gzipped_records_with_lines_that_are_not_objects(data_dir, tmp_path):
    """Records lines that are JSON but not objects ([1,2,3], null) are rejected records, and gzipped
    records are accepted: writing the validation folder crashed on both (AttributeError,
    UnicodeDecodeError) after the model had loaded."""
    import gzip

    from jobs.finetune import write_validation

    folder = tmp_path / "gz"
    folder.mkdir()
    lines = (data_dir / "records.jsonl").read_text().splitlines()
    text = "\r\n".join([lines[0], "[1, 2, 3]", "null", *lines[1:]]) + "\r\n"
    (folder / "records.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    (folder / "attributes.json").write_text(json.dumps(ATTRIBUTES))
    (folder / "gold.jsonl").write_text((data_dir / "gold.jsonl").read_text())
    sources = gold.resolve_sources(folder / "records.jsonl.gz")
    data = gold.load_gold(sources)
    assert data.stats["records"] == 9 and data.stats["products"] == 6
    held_out = write_validation(sources, data.products[1:3], tmp_path / "out")
    assert (held_out / "records.jsonl").read_text() == lines[1] + "\n" + lines[2] + "\n"
    assert [json.loads(line)["product_id"] for line in (held_out / "gold.jsonl").read_text().splitlines()] == ["p1", "p2"]


def test_a_yaml_schema_is_written_to_the_validation_folder_as_json(data_dir, tmp_path):
    """The validation folder's attributes.json was the YAML --attributes copied as it was: the
    README's next step (`hpd extract --attributes OUT/validation/attributes.json`) refused it."""
    import yaml

    from jobs.finetune import write_validation
    from pipelines.schema import load_schema

    (tmp_path / "attributes.yaml").write_text(yaml.safe_dump(ATTRIBUTES))
    sources = gold.resolve_sources(data_dir, attributes=tmp_path / "attributes.yaml")
    data = gold.load_gold(sources)
    held_out = write_validation(sources, data.products[:2], tmp_path / "out")
    assert load_schema(str(held_out / "attributes.json")) == load_schema(str(tmp_path / "attributes.yaml"))


def test_resume_refuses_other_data_of_the_same_counts(data_dir, tmp_path, caplog):
    """The run's data identity was only counts: a --resume after a gold value changed went on with
    it. The identity holds a digest of the data's content; a run.json from before the digest is
    resumed with a warning (its counts still checked)."""
    import argparse

    from jobs.finetune import RUN_FILE, check_resume, run_identity

    folder = tmp_path / "changed"
    folder.mkdir()
    for name in ("records.jsonl", "attributes.json", "gold.jsonl"):
        (folder / name).write_text((data_dir / name).read_text())
    args = argparse.Namespace(train=folder, lr=1e-2)
    data = gold.load_gold(gold.resolve_sources(folder))
    first = run_identity(args, data.stats, gold.digest(data))
    (tmp_path / RUN_FILE).write_text(json.dumps(first))
    check_resume(tmp_path, run_identity(args, data.stats, gold.digest(gold.load_gold(gold.resolve_sources(folder)))))
    (folder / "gold.jsonl").write_text((data_dir / "gold.jsonl").read_text().replace('"black"', '"loafer"'))
    changed = gold.load_gold(gold.resolve_sources(folder))
    assert changed.stats == data.stats  # the counts alone cannot tell
    with pytest.raises(ValueError, match=r"the data's content \(the same counts, other values"):
        check_resume(tmp_path, run_identity(args, changed.stats, gold.digest(changed)))
    (tmp_path / RUN_FILE).write_text(json.dumps({k: v for k, v in first.items() if k != "data_digest"}))  # an older run.json
    caplog.set_level("WARNING")
    check_resume(tmp_path, run_identity(args, changed.stats, gold.digest(changed)))
    assert "predates the data's digest: only the data's counts are checked" in caplog.text


def test_resume_of_a_teacher_run_counted_before_session_60_passes_with_the_same_content(tmp_path):
    """Session 60 counts null targets and targets not in text over the values above a teacher's
    floor only (and adds ``targets``): a run.json counted the old way, of the same content (digest),
    resumes; its other counts, or another content, are still refused."""
    import argparse

    from jobs.finetune import RUN_FILE, check_resume, run_identity

    args = argparse.Namespace(train=tmp_path / "t", lr=1e-2)
    old = {"products": 3, "slots": 8, "null_targets": 2, "targets_not_in_text": 6, "teacher_values_below_confidence": 5}
    now = {"products": 3, "slots": 8, "targets": 3, "null_targets": 0, "teacher_values_below_confidence": 5}
    (tmp_path / RUN_FILE).write_text(json.dumps(run_identity(args, old, "d" * 64)))
    check_resume(tmp_path, run_identity(args, now, "d" * 64))
    with pytest.raises(ValueError, match="the data"):
        check_resume(tmp_path, run_identity(args, {**now, "teacher_values_below_confidence": 4}, "d" * 64))
    with pytest.raises(ValueError, match="the data"):
        check_resume(tmp_path, run_identity(args, now, "e" * 64))


def test_an_uncorrected_draft_is_warned_of_and_a_draft_alone_says_what_to_do(data_dir, tmp_path, capsys, caplog):
    """`hpd pick` writes gold-draft.jsonl, the model's values to correct: with only the draft, the
    missing-gold error says to correct it and save it as gold.jsonl; a gold.jsonl byte for byte the
    draft (the model's own values) is warned of."""
    folder = tmp_path / "label"
    folder.mkdir()
    for name in ("records.jsonl", "attributes.json"):
        (folder / name).write_text((data_dir / name).read_text())
    (folder / "gold-draft.jsonl").write_text((data_dir / "gold.jsonl").read_text())
    argv = ["finetune", "--train", str(folder), "--out", str(tmp_path / "out"), "--model", str(tmp_path / "none")]
    assert main(argv) == 2
    assert (f"gold file {folder / 'gold.jsonl'} not found, only `hpd pick`'s draft {folder / 'gold-draft.jsonl'}: correct "
            f"the draft (the model's values; n/a where the product has none) and save it as {folder / 'gold.jsonl'}") in capsys.readouterr().err
    (folder / "gold.jsonl").write_text((data_dir / "gold.jsonl").read_text())
    caplog.set_level("WARNING")
    assert main(argv) != 0
    assert f"{folder / 'gold.jsonl'} is {folder / 'gold-draft.jsonl'} as `hpd pick` wrote it: the labels are the model's own" in caplog.text
    caplog.clear()
    (folder / "gold.jsonl").write_text((data_dir / "gold.jsonl").read_text().replace('"black"', '"loafer"'))  # corrected
    assert main(argv) != 0
    assert "as `hpd pick` wrote it" not in caplog.text


def test_warnings_on_stderr_are_marked_as_such(data_dir, tmp_path):
    """`hpd finetune`'s log on stderr marks a warning "warning:" (as `hpd extract` does), not as
    one more progress line; the error that ends the run is `hpd finetune: error:`. In a process of
    its own: under pytest the root logger already has handlers, and the command keeps them."""
    folder = tmp_path / "label"
    folder.mkdir()
    for name in ("records.jsonl", "attributes.json", "gold.jsonl"):
        (folder / name).write_text((data_dir / name).read_text())
    (folder / "gold-draft.jsonl").write_text((data_dir / "gold.jsonl").read_text())  # uncorrected: a warning
    (tmp_path / "out").write_text("a file")  # then an error, before any model loads
    done = subprocess.run([sys.executable, "-m", "jobs.cli", "finetune", "--train", str(folder), "--out", str(tmp_path / "out")],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    drafts = [line for line in lines if "as `hpd pick` wrote it" in line]
    assert len(drafts) == 1 and re.match(r"\d{4}-\d\d-\d\d [\d:,]+ warning: \S+gold.jsonl is ", drafts[0]), lines
    assert f"hpd finetune: error: --out {tmp_path / 'out'} is a file" in lines[-1]


LIBRARY_NOISE = ("Loading weights", "Writing model shards", "FutureWarning", "DeprecationWarning", "kernels")


def test_library_noise_is_hidden_unless_verbose(data_dir, model_dir, tmp_path):
    """What the libraries print (transformers' progress bars and FutureWarnings, bitsandbytes' "pip
    install kernels") is no concern of `hpd finetune`'s user and suggests something is missing: hidden
    by default, shown with --verbose; hpd's own log stays. In a process of its own: the libraries
    print much of it once per process, on import."""
    argv = [sys.executable, "-m", "jobs.cli", "finetune", "--train", str(data_dir), "--model", str(model_dir),
            "--docs-per-prompt", "2", "--max-value-tokens", "8", "--lora-rank", "4", "--max-steps", "1",
            "--gradient-checkpointing"]  # fmt: skip
    said = {}
    for verbose in (False, True):
        done = subprocess.run([*argv, "--out", str(tmp_path / f"out-{verbose}")] + ["--verbose"] * verbose,
                              cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        said[verbose] = done.stderr
    assert [noise for noise in LIBRARY_NOISE if noise in said[False]] == [], said[False]
    assert " data: " in said[False] and " warning: " in said[False]  # its own: the data line, the rejected record
    assert "Loading weights" in said[True] and "FutureWarning" in said[True], said[True]


def test_quiet_libraries_hides_their_lines_not_ours(caplog):
    import warnings

    from transformers.utils import logging as transformers_logging

    def speak() -> list[str]:
        with warnings.catch_warnings(record=True) as caught:  # the filters in effect: no simplefilter here
            warnings.warn_explicit("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning,
                                   "transformers/modeling_utils.py", 3312, module="transformers.modeling_utils")
            warnings.warn_explicit("ours", FutureWarning, "training/data.py", 1, module="training.data")
            logging.getLogger("bitsandbytes.backends.cpu.ops").warning(
                "Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'. Please make "
                "sure you already `pip install kernels` and the kernels >= 0.11.1")
            logging.getLogger("jobs.finetune").warning("a warning of ours")
        return [str(w.message) for w in caught]

    bars = transformers_logging.is_progress_bar_enabled()
    with caplog.at_level(logging.INFO):
        with quiet_libraries():
            assert speak() == ["ours"]
            assert not transformers_logging.is_progress_bar_enabled()
        assert [r.getMessage() for r in caplog.records] == ["a warning of ours"]
        caplog.clear()
        assert len(speak()) == 2 and len(caplog.records) == 2  # as before, after it
    assert transformers_logging.is_progress_bar_enabled() == bars


def test_level_prefix_marks_warnings_and_errors_only():
    formatter = LevelPrefix("%(name)s %(message)s")
    records = [logging.LogRecord("x", level, __file__, 1, "m %d", (1,), None) for level in (logging.INFO, logging.WARNING, logging.ERROR)]
    assert [formatter.format(r) for r in records] == ["x m 1", "x warning: m 1", "x error: m 1"]
    assert records[1].getMessage() == "m 1"  # the record itself unchanged, for other handlers


def test_words_for_none_and_gold_of_nothing_but_none_are_warned_of(data_dir, tmp_path, caplog):
    """Gold values written "N/A", "null", "None" were trained as those words: counted, named and
    warned of (none is {"n/a": 1}); gold whose every value is none is warned of."""
    folder = tmp_path / "none"
    folder.mkdir()
    for name in ("records.jsonl", "attributes.json"):
        (folder / name).write_text((data_dir / name).read_text())
    rows = [{"product_id": f"p{i}", "category": c, "target_scores": g} for i, (c, _, g) in enumerate(TITLES)]
    rows[0]["target_scores"] = {"Brand": {"N/A": 1}, "Color": {"null": 1}, "Size": {"N/A": 1}}
    rows[1]["target_scores"] = {"Brand": {"None": 1}}
    write_jsonl(folder / "gold.jsonl", rows)
    data = gold.load_gold(gold.resolve_sources(folder))
    assert (data.stats["none_words"], data.stats["none_words_written"]) == (4, "'N/A' 2, 'null' 1, 'None' 1")
    assert "none_words" not in gold.load_gold(gold.resolve_sources(data_dir)).stats
    argv = ["finetune", "--train", str(folder), "--out", str(tmp_path / "out"), "--model", str(tmp_path / "nothing")]
    caplog.set_level("WARNING")
    assert main(argv) != 0
    assert """4 target value(s) are a word for none ('N/A' 2, 'null' 1, 'None' 1): they are trained as those words; none is written {"n/a": 1}""" in caplog.text
    assert "every one of the" not in caplog.text
    write_jsonl(folder / "gold.jsonl", [{**row, "target_scores": {"Brand": {"n/a": 1}}} for row in rows])
    caplog.clear()
    assert main(argv) != 0
    assert "every one of the 16 target values is none (n/a or left out)" in caplog.text


def test_gold_with_a_teacher_is_refused(data_dir, tmp_path, capsys):
    """--teacher's values replace gold: a --gold beside it was read by no one, silently."""
    argv = ["finetune", "--train", str(data_dir), "--out", str(tmp_path / "run"), "--teacher", str(tmp_path / "teacher"),
            "--gold", str(data_dir / "gold.jsonl")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--gold {data_dir / 'gold.jsonl'} with --teacher {tmp_path / 'teacher'}: the teacher's values replace gold" in err
    assert not (tmp_path / "run").exists()
