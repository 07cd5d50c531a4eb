"""Scoring with both metrics (ExtractGPT + strict): job predictions joined to gold by product_id,
or a stored ExtractGPT run recomputed and checked against its stored ``results``.

Scoring always uses the GOLD category of a product. Predicted categories only feed the
``category_mismatch`` count. Gold products without any prediction row count as predicting null
for every attribute.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from datafiles.dataset import GoldExample, validate_target_scores
from datafiles.predictions import Predictions
from datafiles.storage import read_text
from evaluation.confidence import AtThreshold, by_confidence
from evaluation.metrics import MetricReport, extractgpt_metric, parse_extractgpt_prediction, strict_metric


@dataclass(frozen=True)
class EvaluationResult:
    """Both metric reports and the join statistics."""

    lenient: MetricReport
    strict: MetricReport
    products: dict[str, int] = field(default_factory=dict)
    by_confidence: tuple[AtThreshold, ...] = ()  # outputs with confidences (evaluation/confidence.py)

    def summary(self) -> dict:
        summary = {
            **self.lenient.to_dict(with_combos=False),
            "strict": self.strict.to_dict(with_combos=False),
            "combos": len(self.lenient.combos),
            "products": self.products,
        }
        if self.by_confidence:
            summary["by_confidence"] = [row.to_dict() for row in self.by_confidence]
        return summary


def evaluate(
    predictions: Predictions,
    gold: list[GoldExample],
    attributes: Mapping[str, list[str]] | None = None,
) -> EvaluationResult:
    """Join by product_id and compute both metrics; missing products predict null."""
    gold_ids = {ex.product_id for ex in gold}
    predicted = sum(1 for pid in predictions.values if pid in gold_ids)
    products = {
        "gold": len(gold),
        "predicted": predicted,
        "missing": sum(1 for ex in gold if ex.product_id not in predictions.values),
        # of the whole output: ``values`` may hold only the gold's products (read_predictions(only=...))
        "extra": predictions.products - predicted,
        "category_mismatch": sum(
            1 for ex in gold if predictions.categories.get(ex.product_id, ex.category) not in (None, ex.category)
        ),
        "rows": predictions.rows,
        "truncated": predictions.truncated,
    }
    return EvaluationResult(
        extractgpt_metric(gold, predictions.values, attributes),
        strict_metric(gold, predictions.values, attributes),
        products,
        tuple(by_confidence(gold, predictions.values, predictions.confidence, attributes)),
    )


def evaluate_extractgpt_run(uri: str) -> dict:
    """Recompute a stored ExtractGPT run (gzip JSON) and compare with its stored ``results``."""
    try:
        run = json.loads(read_text(uri))
    except json.JSONDecodeError as err:
        raise ValueError(f"{uri}: not valid JSON ({err.msg})") from err
    if not isinstance(run, dict) or not isinstance(run.get("examples"), list):
        raise ValueError(f"{uri}: not an ExtractGPT run (expected an object with 'examples')")
    gold, predictions = [], {}
    for i, example in enumerate(run["examples"]):
        product_id = f"example-{i:05d}"
        if not isinstance(example, dict) or not isinstance(example.get("category"), str):
            raise ValueError(f"{uri} example {i}: expected an object with a string 'category'")
        target_scores = validate_target_scores(example.get("target_scores"), f"{uri} example {i}")
        gold.append(GoldExample(product_id, example["category"], target_scores))
        predictions[product_id] = parse_extractgpt_prediction(example.get("pred"))
    attributes = run.get("known_attributes")
    lenient = extractgpt_metric(gold, predictions, attributes)
    strict = strict_metric(gold, predictions, attributes)
    stored = run.get("results") or {}
    mine = lenient.to_dict(with_combos=False)
    matches = {
        kind: {f"{kind}_{k}": v for k, v in mine[kind].items()} == stored.get(kind) for kind in ("micro", "macro")
    }
    stored_combos = {k: v for k, v in stored.items() if k not in ("micro", "macro")}
    matches["combos"] = stored_combos == {f"{c.attribute}_{c.category}": c.scores.to_dict() for c in lenient.combos}
    return {
        "run": uri,
        "model": run.get("model"),
        "dataset": run.get("dataset_name"),
        "examples": len(gold),
        **mine,
        "strict": strict.to_dict(with_combos=False),
        "combos": len(lenient.combos),
        "stored": {"micro": stored.get("micro"), "macro": stored.get("macro")},
        "matches_stored": matches,
    }
