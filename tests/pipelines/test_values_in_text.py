"""A value that does not occur in its own product's text is written as null and counted, unless
--keep-values-not-in-text. The stage is the real ExtractStage; its decoder answers fixed values
(what a model could answer), so each case is known."""

import json

import pyarrow as pa
import pytest

from hpd_core.types import Product, Result, Value
from pipelines import io
from pipelines.extract_stage import ExtractConfig, ExtractStage, in_text

from .test_accounting import SCHEMA, check, prepared, run_chunk

ATTRIBUTES = SCHEMA.attributes("Shoes")


class FixedAnswers:
    """The decoder interface, answering ``answers[product_id][attribute]`` (None when absent)."""

    name = "fixed"
    model_name = "fixed"

    def __init__(self, answers: dict) -> None:
        self.answers = answers
        self.on_prompt_done = None

    def decode(self, requests):
        results = []
        for request in requests:
            values = tuple(tuple(Value(self.answers.get(p.product_id, {}).get(a.name)) for a in request.attributes)
                           for p in request.products)
            results.append(Result(request, values, prompt_tokens=1, generated_tokens=1, forward_passes=1, decoder="fixed"))
        return results


def stage(answers: dict, values_in_text: bool) -> ExtractStage:
    extract = ExtractStage(ExtractConfig(decoder="dry-run", schema=SCHEMA, run_id="r", values_in_text=values_in_text))
    extract._decoder = FixedAnswers(answers)
    return extract


RECORDS = [
    {"product_id": "a", "category": "Shoes", "title": "Florsheim Men's Milano Slip-On Loafer, Burgundy, 10 D US"},
    {"product_id": "b", "category": "Shoes", "title": "Taddlee Men Swim Briefs"},
]
ANSWERS = {
    "a": {"Brand": "Florsheim", "Gender": "Men's", "Color": "burgundy", "Size": "10 D US", "Material": "Leather"},
    "b": {"Brand": "Taddlee", "Gender": "Men's", "Model name": "Florsheim"},  # "Florsheim": the other product's
}
NOT_IN_TEXT = {("a", "Color"), ("a", "Material"), ("b", "Gender"), ("b", "Model name")}  # exact: case counts


@pytest.mark.parametrize("values_in_text", [True, False])
def test_values_not_in_their_products_text_are_written_as_null_and_counted(values_in_text):
    result = run_chunk(stage(ANSWERS, values_in_text), prepared(RECORDS))
    rows = io.table_from_bytes(result["attributes"]).to_pylist()
    written = {(r["product_id"], r["attribute"]): r["value"] for r in rows}
    assert len(rows) == 2 * len(ATTRIBUTES)
    for (product, attribute), value in written.items():
        answered = ANSWERS[product].get(attribute)
        dropped = values_in_text and (product, attribute) in NOT_IN_TEXT
        assert value == (None if dropped else answered), (product, attribute)
    stats = json.loads(result["stats"])
    assert stats["values_not_in_text"] == (len(NOT_IN_TEXT) if values_in_text else 0)
    assert stats["values_null"] == sum(v is None for v in written.values())
    assert check(result) == []


def test_any_text_field_counts_and_matching_is_exact():
    product = Product("p", "Trail Runner 2", description="Upper: mesh", features=("Vibram sole", "Size 42 EU"))
    assert in_text("Trail Runner", product) and in_text("mesh", product) and in_text("42 EU", product)
    assert not in_text("trail runner", product)  # case counts: the benchmarks' gold values are exact spans
    assert not in_text("mesh Vibram", product)  # a span lies within one field
    assert not in_text("Upper: mesh Vibram sole", product)


def test_the_flag_is_part_of_the_run_and_the_report(tmp_path):
    from jobs.config import from_args

    from .test_config import parse

    checked = from_args(parse("--output", tmp_path / "out"))
    kept = from_args(parse("--output", tmp_path / "out", "--keep-values-not-in-text"))
    assert checked.extract.values_in_text and not kept.extract.values_in_text
    assert checked.output.run_id != kept.output.run_id  # a resumed run never mixes the two


def test_the_report_counts_them_over_chunks():
    from pipelines import attempts
    from pipelines.report import ReportConfig, Stats, build_report, render_markdown

    from .test_report import META

    total = Stats()
    for chunk in ({"products_out": 2, "values_not_in_text": 3}, {"products_out": 1, "values_not_in_text": 4}, {}):
        total.add(chunk)  # the last: a chunk committed before the counter existed
    attempt = attempts.Attempt("a", 0.0, 10.0, "cpu", 2, ReportConfig().price("cpu"))
    report = build_report(META, total, total, [attempt], attempt)
    assert report["values_not_in_text"] == 7
    assert "| values not in text |" in render_markdown(report) and "| 7 |" in render_markdown(report)


def test_a_parse_errors_null_is_written_without_a_confidence():
    """A slot whose text was not valid JSON comes out as null with the probability of that text:
    no confidence of a null, so a teacher (``hpd finetune --min-confidence``) never takes it as a
    sure one. A value cut at K_max (the partial string it wrote) and the others keep theirs."""
    from hpd_core.config import DecodeConfig

    class Scored(FixedAnswers):
        def decode(self, requests):
            results = []
            for result in super().decode(requests):
                values = tuple(tuple(Value(None, parse_error=True, confidence=0.97) if a.name == "Size"
                                     else Value("Flor", truncated=True, parse_error=True, confidence=0.5)
                                     if (p.product_id, a.name) == ("a", "Brand")
                                     else replace(v, confidence=0.93) for a, v in zip(result.request.attributes, values))
                               for p, values in zip(result.request.products, result.values))  # fmt: skip
                results.append(replace(result, values=values))
            return results

        def layers_compiled(self) -> bool:
            return False

    from dataclasses import replace

    extract = ExtractStage(ExtractConfig(decoder="hpd", schema=SCHEMA, run_id="r", decode=DecodeConfig(confidence=True)))
    extract._decoder = Scored(ANSWERS)
    result = run_chunk(extract, prepared(RECORDS))
    rows = io.table_from_bytes(result["attributes"]).to_pylist()
    assert len(rows) == 2 * len(ATTRIBUTES)
    for row in rows:
        if row["attribute"] == "Size" or (row["product_id"], row["attribute"]) in NOT_IN_TEXT:
            assert row["confidence"] is None, row
        elif (row["product_id"], row["attribute"]) == ("a", "Brand"):  # a value cut at K_max: the text it wrote
            assert (row["value"], row["confidence"]) == ("Flor", 0.5), row
        else:
            assert row["confidence"] == pytest.approx(0.93), row
    assert json.loads(result["stats"])["parse_errors"] == 3
    assert check(result) == []
