"""`hpd bench` and its workloads, on a tiny random model and the hermetic test tokenizer (CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from bench.decoders import decode, forced_hpd_class
from bench.model import arch_config
from bench.workload import SyntheticSpec, records_workload, stack, synthetic_workload
from hpd_core.batching import PREFILL_TOKENS_CPU
from hpd_core.config import DecodeConfig
from hpd_core.decoders import make_decoder
from hpd_core.layout import encode
from hpd_core.prompts import answer_prefix, render_answer, render_value, value_suffix
from hpd_core.types import Attribute, Product, Request
from jobs import bench as bench_cli
from jobs import cli
from tests.hpd_core.conftest import build_tokenizer, tiny_model

# A few OA-Mine test records (OA-Mine, Apache-2.0), as `hpd convert extractgpt` writes them.
RECORDS = [
    {"product_id": "oa-mine-test-00000", "category": "Shoes", "title": "Diesel Men's Exposure High-Top Sneaker"},
    {"product_id": "oa-mine-test-00001", "category": "Shoes", "title": "Florsheim Men's Milano Slip-On Loafer,Burgundy,10 D US"},
    {"product_id": "oa-mine-test-00098", "category": "Coffee", "title": "Maxwell House International Coffee French Vanilla Iced Latte Singles, 3.42-Ounce 2 Boxes (Pack of 16)"},
    {"product_id": "oa-mine-test-00002", "category": "Shoes", "title": "Finn Comfort Women's 2051-014099"},
    {"product_id": "oa-mine-test-00099", "category": "Coffee", "title": "Starbucks Blonde Roast Ground Coffee \u2014 Veranda Blend \u2014 100% Arabica \u2014 6 bags (12 oz. each)"},
]  # fmt: skip
SCHEMA = {"Shoes": ["Brand", "Gender", "Model name"], "Coffee": ["Brand", "Flavor", "Item form"]}
SMALL = ["--product-tokens", "40", "--attributes-per-product", "3", "--value-tokens-max", "5", "--max-value-tokens", "6"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    path = tmp_path_factory.mktemp("records")
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    (path / "attributes.json").write_text(json.dumps(SCHEMA))
    return str(path / "records.jsonl"), str(path / "attributes.json")


def run_bench(capsys, argv: list[str]) -> dict:
    assert cli.main(["bench", *argv]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    return json.loads(last)


# --- workloads -------------------------------------------------------------------------------


def test_stack_keeps_one_category_per_request_and_order():
    products = [(r["category"], Product(r["product_id"], r["title"])) for r in RECORDS]
    requests = stack(products, SCHEMA, docs_per_prompt=2)
    assert [r.category for r in requests] == ["Shoes", "Shoes", "Coffee"]
    assert [[p.product_id for p in r.products] for r in requests] == [
        ["oa-mine-test-00000", "oa-mine-test-00001"], ["oa-mine-test-00002"], ["oa-mine-test-00098", "oa-mine-test-00099"]
    ]  # fmt: skip
    assert [a.name for a in requests[2].attributes] == SCHEMA["Coffee"]


def test_records_workload_limit_and_missing_category(records, tmp_path):
    workload = records_workload(*records, docs_per_prompt=3, limit=4)
    assert workload.num_products == 4 and not workload.fixed_lengths
    sample = records_workload(*records, docs_per_prompt=3, per_category=1)
    assert [p.product_id for r in sample.requests for p in r.products] == ["oa-mine-test-00000", "oa-mine-test-00098"]
    schema = tmp_path / "attributes.json"
    schema.write_text(json.dumps({"Shoes": ["Brand"]}))
    with pytest.raises(ValueError, match="Coffee"):
        records_workload(records[0], str(schema), docs_per_prompt=1)


def test_synthetic_workload_is_the_same_products_and_lengths_for_every_J(tokenizer):
    spec = SyntheticSpec(num_products=5, product_tokens=30, attributes_per_product=3, value_tokens_max=6, seed=3)
    one = synthetic_workload(spec, tokenizer, max_value_tokens=6)
    three = synthetic_workload(SyntheticSpec(**{**spec.__dict__, "docs_per_prompt": 3}), tokenizer, max_value_tokens=6)
    assert [len(r.products) for r in three.requests] == [3, 2]
    assert [p for r in one.requests for p in r.products] == [p for r in three.requests for p in r.products]
    assert [s for slots in one.forced for s in slots] == [s for slots in three.forced for s in slots]
    lengths = [len(s) for slots in one.forced for s in slots]
    assert min(lengths) >= 1 and max(lengths) <= 6 and len(lengths) == 15
    product = one.requests[0].products[0]
    assert 27 <= len(encode(tokenizer, product.title)) + len(encode(tokenizer, product.description)) <= 36


def test_synthetic_geometric_lengths_and_validation(tokenizer):
    spec = SyntheticSpec(num_products=40, product_tokens=10, attributes_per_product=4, value_tokens_max=30,
                         value_length_dist="geometric", value_length_mean=3.0)  # fmt: skip
    lengths = [len(s) for slots in synthetic_workload(spec, tokenizer, 30).forced for s in slots]
    assert 2.0 < sum(lengths) / len(lengths) < 4.5 and max(lengths) <= 30
    with pytest.raises(ValueError, match="max_value_tokens"):
        synthetic_workload(spec, tokenizer, max_value_tokens=10)
    with pytest.raises(ValueError, match="value_length_dist"):
        SyntheticSpec(value_length_dist="zipf")


def test_baseline_count_matches_the_rendered_answer(tokenizer):
    """The formula (skeleton as HPD tokenizes it + value tokens + closing) against tokenizing the
    whole gold answer, for real string values: equal up to token merges at segment borders."""
    request = Request(
        "Shoes",
        (Attribute("Brand"), Attribute("Size"), Attribute("Color")),
        (Product("a", "acme red shoe"), Product("b", "nike blue sneaker")),
    )
    values = [["acme", "10 D US", None], ["nike", None, "black/white"]]
    from hpd_core.layout import build_layout
    from bench.workload import answer_tokens

    lengths = [
        len(encode(tokenizer, render_value(values[s // 3][s % 3], value_suffix(request, s)))) for s in range(6)
    ]
    formula = answer_tokens(tokenizer, request, len(build_layout(request, tokenizer, 8).input_ids), lengths)
    rendered = render_answer(request, values)
    assert rendered.startswith(answer_prefix())
    truth = len(encode(tokenizer, rendered)) - len(encode(tokenizer, answer_prefix()))
    assert abs(formula - truth) <= 3, (formula, truth)


def test_forced_lengths_are_exact_for_both_decoders(tokenizer):
    """HPD generates exactly the drawn lengths (and the forced ids), the baseline exactly the
    answer's token count; every forced slot ends by the engine's own stop rule."""
    cfg = DecodeConfig(max_value_tokens=6, max_batch_size=2)
    spec = SyntheticSpec(num_products=3, product_tokens=20, attributes_per_product=3, value_tokens_max=6, docs_per_prompt=2)
    workload = synthetic_workload(spec, tokenizer, cfg.max_value_tokens)
    model = tiny_model("qwen3", len(tokenizer))
    hpd = forced_hpd_class()(model, tokenizer, cfg)
    ar = make_decoder("ar", model, tokenizer, cfg)
    hpd_results = decode("hpd", hpd, workload)
    ar_results = decode("ar", ar, workload)
    for result, slots, exact in zip(hpd_results, workload.forced, workload.exact_new_tokens):
        assert result.generated_tokens == sum(len(s) for s in slots)
        assert result.extra["slot_tokens"] == [list(s) for s in slots]
        assert "step_logits" not in result.extra  # nothing recorded
        assert not any(v.truncated for row in result.values for v in row)
    assert [r.generated_tokens for r in ar_results] == list(workload.exact_new_tokens)


def test_report_names_cuda_graphs_from_the_recorded_captures():
    """bench.md's decoding line says CUDA graphs only where captures were recorded, with their
    counts summed over the decoders (a sweep: every baseline batch size and grid cell)."""
    from bench.plot import _graphs

    assert _graphs({"ar": {"cuda_graphs": "0 / 0"}, "hpd": {"cuda_graphs": "0 / 0"}}) == ""
    assert _graphs({"ar": {}, "hpd": {}}) == ""  # a report from before the counts
    assert _graphs({"ar": {"cuda_graphs": "3 / 1"}, "hpd": {"cuda_graphs": "2 / 0"}}) == " (CUDA graphs: 5 captured, 1 failed)"
    sweep = {"baseline": {"8": {"cuda_graphs": "1 / 0"}}, "grid": [{"hpd": {"cuda_graphs": "2 / 0"}}, {"hpd": {"cuda_graphs": "0 / 2"}}]}
    assert _graphs(sweep) == " (CUDA graphs: 3 captured, 2 failed)"


def test_report_names_the_compiled_pieces_that_ran():
    """bench.md's decoding line follows the report's ``compiled`` entry (what ran: "auto" depends on
    device, size and dtype); a report from before it was written when "auto" compiled on CUDA only."""
    from bench.plot import _compiled

    def report(device, body, mode="auto", **decode):
        return {"model": {"device": device, "body_matmul_parameters": body}, "decode": {"compile_layers": mode, **decode}}

    assert _compiled(report("cpu", 10**8, compiled=True)) == ", layers' element-wise work compiled"
    assert _compiled(report("cpu", 10**8, compiled=False)) == ""
    assert _compiled(report("cpu", 10**8)) == ""  # before the entry: auto never compiled on a CPU
    assert _compiled(report("cuda", 7 * 10**9)) == ", layers' MLPs, norms and rotary embeddings compiled"
    assert _compiled(report("cuda", 7 * 10**9, compiled=False)) == ""


# --- the command ------------------------------------------------------------------------------


def test_bench_synthetic_end_to_end(capsys, tmp_path, tokenizer_dir):
    out = tmp_path / "out"
    summary = run_bench(capsys, [
        "--synthetic", "--random-arch", "tiny", "--tokenizer", tokenizer_dir, "--num-products", "4",
        "--docs-per-prompt", "2", *SMALL, "--batch-size", "2", "--out", str(out),
    ])  # fmt: skip
    report = json.loads((out / "bench.json").read_text())
    assert (out / "bench.md").read_text().startswith("# hpd bench")
    assert report["decode"]["compiled"] == (report["model"]["dtype"] == "bfloat16")  # auto on a CPU: bf16 only
    assert summary["speedup"] == pytest.approx(summary["hpd"]["products_per_s"] / summary["ar"]["products_per_s"])
    assert report["speedup"] == pytest.approx(summary["speedup"])
    for name in ("ar", "hpd"):
        s = report[name]
        for key in ("products_per_s", "generated_tokens_per_s", "forward_passes_per_product",
                    "generated_tokens_per_forward_pass", "peak_host_rss_mb", "peak_device_mb", "prompt_tokens_per_product"):  # fmt: skip
            assert key in s
        assert s["products"] == 4 and not s["errors"]
        assert s["products_per_s"] == pytest.approx(s["products"] / s["seconds"])
        floor = report["floor"]
        assert floor[name]["fraction"] == pytest.approx(s["products_per_s"] / floor["limit_products_per_s"])
    assert floor["limit_products_per_s"] == pytest.approx(
        floor["matmul_flops_per_s"] / (2 * report["model"]["body_matmul_parameters"] * floor["tokens_per_product"])
    )
    assert floor["value_tokens_per_product"] == pytest.approx(report["hpd"]["generated_tokens"] / 4)
    spec = SyntheticSpec(num_products=4, product_tokens=40, attributes_per_product=3, value_tokens_max=5, docs_per_prompt=2)
    workload = synthetic_workload(spec, build_tokenizer(), 6)
    assert report["hpd"]["generated_tokens"] == sum(len(s) for slots in workload.forced for s in slots)
    assert report["ar"]["generated_tokens"] == sum(workload.exact_new_tokens)
    # HPD: one prefill + (longest value - 1) steps per batch; AR: one pass per answer token
    assert report["hpd"]["batches"] == 1 and report["ar"]["batches"] == 1
    assert report["hpd"]["step_shapes"] == report["ar"]["step_shapes"] == "0 / 1"  # a CPU: packed steps
    assert "| batches with fixed / packed steps | 0 / 1 | 0 / 1 |" in (out / "bench.md").read_text()
    assert report["ar"]["forward_passes"] == max(workload.exact_new_tokens)
    assert report["hpd"]["forward_passes"] == max(len(s) for slots in workload.forced for s in slots)
    assert report["model"]["random_weights"] and report["workload"]["fixed_lengths"]


def test_bench_records_end_to_end(capsys, tmp_path, tokenizer_dir, records):
    out = tmp_path / "out"
    summary = run_bench(capsys, [
        "--records", records[0], "--attributes", records[1], "--limit", "4", "--docs-per-prompt", "2",
        "--random-arch", "tiny", "--tokenizer", tokenizer_dir, "--max-value-tokens", "3", "--out", str(out),
    ])  # fmt: skip
    report = json.loads((out / "bench.json").read_text())
    assert set(summary) == {"ar", "hpd", "speedup", "speedup_cpu_time", "floor_fraction"}
    assert summary["floor_fraction"] == {n: pytest.approx(report["floor"][n]["fraction"]) for n in ("ar", "hpd")}
    assert report["ar"]["products"] == report["hpd"]["products"] == 4
    assert report["hpd"]["requests"] == 3  # Shoes x2, Shoes x1 ... within the limit: 00000, 00001 | 00098 | 00002
    assert 0.0 <= report["agreement"] <= 1.0
    assert not report["workload"]["fixed_lengths"]
    assert report["decode"]["spans"] == "on"  # --spans auto, resolved for the CPU (as hpd extract's actors do)
    assert report["decode"]["prefill_limit"] == PREFILL_TOKENS_CPU  # auto, resolved for the CPU
    assert f"prefill forwards auto: at most {PREFILL_TOKENS_CPU} new tokens" in (out / "bench.md").read_text()


def test_agreement_matches_slots_by_product_and_attribute():
    """bench.compare.agreement on hand-made results: slots are matched by product id and attribute
    name, whatever the stacking (one product a prompt against two) and attribute order; a null
    agrees with a null; a request that failed (error) leaves its products out on both sides."""
    from bench.compare import agreement
    from hpd_core.types import Result, Value

    shoes, coffee = (Attribute("Brand"), Attribute("Color")), (Attribute("Flavor"),)
    a, b, c = Product("a", "Nike red"), Product("b", "Acme blue"), Product("c", "Fila black")
    d = Product("d", "Maxwell vanilla")

    def result(attributes, products, values, error=None):
        request = Request("Shoes" if attributes != coffee else "Coffee", attributes, products)
        return Result(request, tuple(tuple(Value(v) for v in row) for row in values), 0, 0, 0, "x", error)

    ar = [  # one product a prompt; c's request failed
        result(shoes, (a,), [["Nike", "red"]]),
        result(shoes, (b,), [[None, "blue"]]),
        result(shoes, (c,), [[None, None]], error="out of device memory"),
        result(coffee, (d,), [["vanilla"]]),
    ]
    hpd = [  # a and b stacked, the attributes in another order; d's request failed
        result(shoes[::-1], (b, a), [["blue", None], ["white", "Nike"]]),
        result(shoes, (c,), [["Fila", "black"]]),
        result(coffee, (d,), [["mocha"]], error="out of device memory"),
    ]
    # compared: a/Brand (same), a/Color (red against white), b/Brand (both null), b/Color (same)
    assert agreement(ar, hpd) == 3 / 4
    assert agreement(hpd, ar) == 3 / 4
    assert agreement(ar, ar) == 1.0
    assert agreement(ar[2:3], hpd) is None and agreement([], hpd) is None  # nothing in common


@pytest.mark.parametrize("spans", ["--spans", "--spans=off"])
def test_bench_records_with_spans(capsys, tmp_path, tokenizer_dir, records, monkeypatch, spans):
    """--spans: both decoders decode values as spans of the products' text: every non-null value
    of either, as timed, is part of its own product's title in the records file (random weights
    of --seed 4, whose HPD writes non-null values there, "Flo" and "-T" among them), and the
    report says so. --spans=off
    turns it off in both decoders. (The random model's baseline writes no JSON it could read values
    from, all null: its span rule is checked in tests/hpd_core/test_autoregressive.py.)"""
    import bench.compare

    timed, decoded = bench.compare.timed, {}

    def recording(name, decoder, *args):
        run = timed(name, decoder, *args)
        decoded[name] = (decoder.spans is not None, run["results"])
        return run

    monkeypatch.setattr(bench.compare, "timed", recording)
    out = tmp_path / "out"
    run_bench(capsys, [
        "--records", records[0], "--attributes", records[1], "--limit", "4", "--docs-per-prompt", "2", spans, "--seed", "4",
        "--random-arch", "tiny", "--tokenizer", tokenizer_dir, "--max-value-tokens", "6", "--out", str(out),
    ])  # fmt: skip
    report = json.loads((out / "bench.json").read_text())
    on = spans == "--spans"
    assert report["decode"]["spans"] == ("on" if on else "off")
    assert report["ar"]["products"] == report["hpd"]["products"] == 4
    assert {name: spanned for name, (spanned, _) in decoded.items()} == {"ar": on, "hpd": on}
    if not on:
        return
    titles = {r["product_id"]: r["title"] for r in map(json.loads, open(records[0]))}
    values = {name: [(p.product_id, v.value) for r in results for p, _, v in r.items() if v.value is not None]
              for name, (_, results) in decoded.items()}  # fmt: skip
    assert any(len(value) > 1 for _, value in values["hpd"]), values  # not vacuous
    assert all(value in titles[pid] for written in values.values() for pid, value in written), values


def test_bench_records_matched_baseline(capsys, tmp_path, tokenizer_dir, records):
    """--baseline-lengths matched: the baseline generates exactly the answer with HPD's value lengths."""
    out = tmp_path / "out"
    run_bench(capsys, [
        "--records", records[0], "--attributes", records[1], "--docs-per-prompt", "2", "--baseline-docs-per-prompt", "1",
        "--baseline-lengths", "matched", "--random-arch", "tiny", "--tokenizer", tokenizer_dir, "--max-value-tokens", "3",
        "--out", str(out),
    ])  # fmt: skip
    report = json.loads((out / "bench.json").read_text())
    assert report["ar"]["requests"] == 5 and report["hpd"]["requests"] == 3
    assert report["ar"]["generated_tokens"] == pytest.approx(5 * report["workload"]["answer_tokens_mean_per_product"])
    assert "agreement" not in report or report["agreement"] is None
    assert report["decode"]["spans"] == "off"  # auto: forced lengths do not read values from the text
    assert "HPD's value lengths" in (out / "bench.md").read_text()


def test_matched_baseline_is_warmed_on_its_whole_workload_as_hpd_is(capsys, tmp_path, tokenizer_dir, records, monkeypatch):
    """The matched run decodes HPD's whole workload untimed to read its lengths; the baseline gets
    the same untimed pass before the timed runs (before, only the warm-up's first request)."""
    import bench.compare
    import bench.decoders
    import bench.single

    untimed = []

    def recording(name, decoder, workload):
        untimed.append((name, len(workload.requests)))
        return bench.decoders.decode(name, decoder, workload)

    monkeypatch.setattr(bench.single, "decode", recording)
    monkeypatch.setattr(bench.compare, "decode", recording)
    run_bench(capsys, [
        "--records", records[0], "--attributes", records[1], "--docs-per-prompt", "2", "--baseline-docs-per-prompt", "1",
        "--baseline-lengths", "matched", "--random-arch", "tiny", "--tokenizer", tokenizer_dir, "--max-value-tokens", "3",
        "--out", str(tmp_path / "out"),
    ])  # fmt: skip
    assert ("hpd", 3) in untimed and ("ar", 5) in untimed  # both whole workloads, before any timed run


def test_bench_baseline_docs_per_prompt(capsys, tmp_path, tokenizer_dir):
    out = tmp_path / "out"
    run_bench(capsys, [
        "--synthetic", "--random-arch", "tiny", "--tokenizer", tokenizer_dir, "--num-products", "4",
        "--docs-per-prompt", "4", "--baseline-docs-per-prompt", "1", *SMALL, "--out", str(out),
    ])  # fmt: skip
    report = json.loads((out / "bench.json").read_text())
    assert report["ar"]["requests"] == 4 and report["hpd"]["requests"] == 1
    assert report["baseline_docs_per_prompt"] == 1 and report["decode"]["spans"] == "off"  # synthetic: never spans


def test_bench_sweep_writes_png(capsys, tmp_path, tokenizer_dir):
    out = tmp_path / "sweep"
    summary = run_bench(capsys, [
        "--synthetic", "--random-arch", "tiny", "--tokenizer", tokenizer_dir, "--num-products", "4", *SMALL,
        "--sweep-docs", "1,2", "--sweep-batch", "1,2", "--out", str(out),
    ])  # fmt: skip
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((out / "sweep.json").read_text())
    assert {(g["docs_per_prompt"], g["batch_size"]) for g in report["grid"]} == {(1, 1), (1, 2), (2, 1), (2, 2)}
    best = max(s["products_per_s"] for s in report["baseline"].values())
    for g in report["grid"]:
        assert g["speedup"] == pytest.approx(g["hpd_products_per_s"] / best)
        assert g["hpd"]["mean_batch_rows"] <= g["batch_size"]
    assert summary["ar"]["products_per_s"] == pytest.approx(best)
    assert "J \\ batch size" in (out / "sweep.md").read_text()
    # each cell's share of the floor: products/s over the floor's products/s at the measured matmul speed
    floor = report["floor"]
    for g in report["grid"]:
        limit = g["hpd_products_per_s"] / g["floor_fraction"]
        tokens = floor["matmul_flops_per_s"] / (2 * report["model"]["body_matmul_parameters"] * limit)
        assert tokens > floor["value_tokens_per_product"] > 0  # the product's own text and keys, and its values
    assert set(report["baseline_floor_fraction"]) == set(report["baseline"])
    assert "Share of the per-product floor" in (out / "sweep.md").read_text()


@pytest.fixture(scope="module")
def lora_model(tmp_path_factory, tokenizer):
    """A tiny model directory (with tokenizer) and two different LoRA adapters for it (peft)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("lora")
    tiny_model("qwen3", len(tokenizer)).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    for seed, name in enumerate(("adapter-hpd", "adapter-ar")):
        torch.manual_seed(seed)
        base = AutoModelForCausalLM.from_pretrained(root / "model")
        lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        get_peft_model(base, lora).save_pretrained(root / name)
    return str(root / "model"), str(root / "adapter-hpd"), str(root / "adapter-ar")


def _spy_decoders(monkeypatch) -> list[dict]:
    """Every decoders dict the bench makes, in order."""
    made: list[dict] = []
    real = bench_cli.make_decoders

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(bench_cli, "make_decoders", spy)
    return made


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("own_baseline", [True, False], ids=["two-adapters", "one-adapter"])
def test_bench_adapters(capsys, tmp_path, monkeypatch, lora_model, own_baseline):
    """--adapter for HPD, --baseline-adapter for the baseline: each decoder runs on the base with
    its own adapter merged (two models), or both share one model when the adapters are the same;
    each decoder's passes are counted once on its own model."""
    from hpd_core.config import ModelConfig
    from hpd_core.models import load_model

    model_dir, hpd_adapter, ar_adapter = lora_model
    ar_adapter = ar_adapter if own_baseline else hpd_adapter
    made = _spy_decoders(monkeypatch)
    out = tmp_path / "out"
    run_bench(capsys, [
        "--synthetic", "--model", model_dir, "--adapter", hpd_adapter,
        *(["--baseline-adapter", ar_adapter] if own_baseline else []),
        "--num-products", "4", "--docs-per-prompt", "2", *SMALL, "--batch-size", "2", "--out", str(out),
        "--dtype", "float32",  # compared below with the adapters merged in float32
    ])  # fmt: skip
    report = json.loads((out / "bench.json").read_text())
    assert (report["model"]["adapter"], report["model"]["baseline_adapter"]) == (hpd_adapter, ar_adapter)
    ids = torch.tensor([[5, 6, 7, 8]])
    (decoders,) = made
    hpd_model, ar_model = decoders["hpd"].runner.model, decoders["ar"].model
    expected = {a: _logits(load_model(ModelConfig(name=model_dir, adapter=a))[0], ids) for a in (hpd_adapter, ar_adapter)}
    torch.testing.assert_close(_logits(hpd_model, ids), expected[hpd_adapter], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(_logits(ar_model, ids), expected[ar_adapter], atol=1e-4, rtol=1e-4)
    assert (hpd_model is ar_model) == (not own_baseline)
    if own_baseline:
        assert not torch.allclose(expected[hpd_adapter], expected[ar_adapter], atol=1e-3)
        assert f"HPD with LoRA adapter `{hpd_adapter}`, the baseline with `{ar_adapter}`" in (out / "bench.md").read_text()
    spec = SyntheticSpec(num_products=4, product_tokens=40, attributes_per_product=3, value_tokens_max=5, docs_per_prompt=2)
    workload = synthetic_workload(spec, build_tokenizer(), 6)
    assert report["ar"]["forward_passes"] == max(workload.exact_new_tokens)
    assert report["hpd"]["forward_passes"] == max(len(s) for slots in workload.forced for s in slots)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--out", "x"], "exactly one input"),
        (["--synthetic", "--records", "r.jsonl", "--out", "x"], "exactly one input"),
        (["--records", "r.jsonl", "--out", "x"], "--attributes"),
        (["--synthetic", "--sweep-docs", "1,2", "--out", "x"], "both --sweep-docs and --sweep-batch"),
        (["--synthetic", "--docs-per-prompt", "0", "--out", "x"], "--docs-per-prompt"),
        (["--synthetic", "--baseline-lengths", "matched", "--out", "x"], "matched"),
        (["--synthetic", "--random-arch", "tiny", "--adapter", "a", "--out", "x"], "--adapter and --baseline-adapter"),
        (["--synthetic", "--random-arch", "tiny", "--baseline-adapter", "a", "--out", "x"], "need a real model"),
        (["--synthetic", "--spans", "--out", "x"], "--spans is for records runs"),
    ],
)
def test_bench_argument_errors(argv, message):
    parser, _ = cli.build_parser()
    with pytest.raises(ValueError, match=message):
        bench_cli.check_args(parser.parse_args(["bench", *argv]))


def test_random_arch_table_matches_published_sizes(tokenizer):
    """Parameter counts of the config-only architectures (meta device: nothing allocated)."""
    from transformers import AutoModelForCausalLM

    published = {"qwen3-8b": 8.19e9, "qwen3-4b": 4.02e9, "qwen3-1.7b": 1.72e9, "phi-4": 14.66e9, "smollm2-135m": 134.5e6}
    for arch, size in published.items():
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(arch_config(arch, tokenizer))
        assert sum(p.numel() for p in model.parameters()) == pytest.approx(size, rel=0.01), arch
    with pytest.raises(ValueError, match="random arch"):
        arch_config("gpt-5", tokenizer)
