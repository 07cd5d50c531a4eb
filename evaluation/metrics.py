"""The ExtractGPT attribute-value metric (exact reproduction) and a strict variant.

Pure Python, no dependencies. The ExtractGPT metric (``extractgpt_metric``), as ExtractGPT's
``pieutils/evaluation.py`` computes it and as ``shared/data/README.md`` defines it:

- Scored per (category, attribute) over the products of that category whose ``target_scores``
  contain the attribute. Unannotated attributes are skipped, never penalised.
- Gold values: the keys of ``target_scores[attribute]`` in file order; a key exactly ``"n/a"``
  becomes null, every other key is stripped (so ``" n/a"`` is the non-null value ``"n/a"``). The
  FIRST key decides whether gold is null.
- Prediction null: ``None`` (JSON null), the string ``"n/a"`` or the string ``"None"``; nothing else
  is normalised (no strip, no case folding). A non-string value (number, list, ...) is never
  equal to a gold string, so it counts as wrong.
- NN gold null & pred null; NV gold null & pred value; VN gold value & pred null; VC pred equals
  one of the gold values exactly; VW otherwise.
- P = round(VC / (NV + VC + VW) * 100, 2), R = round(VC / (VN + VC + VW) * 100, 2), 0 when the
  denominator is 0; F1 = round(2PR / (P + R), 2) from the ROUNDED P and R, 0 when P + R = 0.
  Python float ``round`` (binary value, ties to even), in exactly that operation order.
- A combo whose only pairs are NN (NV + VN + VC + VW = 0) has no score and is left out of the
  macro average and of the counts, as in ExtractGPT.
- Micro: the same formula on counts summed over the scored combos (the headline number).
  Macro: mean of the per-combo rounded P, R and F1, rounded to 2 decimals. ExtractGPT sums in
  ``set()`` iteration order, which makes ties such as 67.745 order-dependent; we sum with
  ``math.fsum`` (exact, order-free). This reproduces all 10 stored ExtractGPT runs.

Strict variant (``strict_metric``): every (product, attribute) with the attribute in the schema of
the product's category is scored; an attribute the product's ``target_scores`` leave out counts as
gold null, so any non-null prediction for it is an NV (a hallucinated value lowers precision).
The schema of a category is the given attribute list plus every attribute annotated for that
category in the gold (so strict never scores fewer pairs than the ExtractGPT metric). Otherwise
identical rules.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from datafiles.dataset import GoldExample

NULL_PREDICTIONS = ("n/a", "None")  # string predictions that mean "no value"
GOLD_NULL = "n/a"  # gold key that means "no value"
OUTCOMES = ("nn", "nv", "vn", "vc", "vw")


@dataclass(frozen=True)
class Counts:
    """Outcome counts of (product, attribute) pairs."""

    nn: int = 0
    nv: int = 0
    vn: int = 0
    vc: int = 0
    vw: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(*(getattr(self, k) + getattr(other, k) for k in OUTCOMES))

    @property
    def scored(self) -> bool:
        """False when every pair is NN: such a combo has no score."""
        return self.nv + self.vn + self.vc + self.vw > 0

    def to_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in OUTCOMES}


@dataclass(frozen=True)
class Scores:
    """Precision, recall and F1 in percent, rounded to 2 decimals."""

    precision: float
    recall: float
    f1: float

    def to_dict(self) -> dict[str, float]:
        return {"precision": self.precision, "recall": self.recall, "f1": self.f1}


@dataclass(frozen=True)
class ComboResult:
    """Counts and scores of one (category, attribute) combo."""

    category: str
    attribute: str
    counts: Counts
    scores: Scores


@dataclass(frozen=True)
class MetricReport:
    """Micro and macro scores, summed counts and the per-combo table (scored combos only)."""

    micro: Scores
    macro: Scores
    counts: Counts
    combos: tuple[ComboResult, ...] = field(default=())

    def to_dict(self, with_combos: bool = True) -> dict:
        out = {"micro": self.micro.to_dict(), "macro": self.macro.to_dict(), "counts": self.counts.to_dict()}
        if with_combos:
            out["combos"] = [
                {"category": c.category, "attribute": c.attribute, **c.counts.to_dict(), **c.scores.to_dict()}
                for c in self.combos
            ]
        return out


def gold_values(target: Mapping[str, object]) -> list[str | None]:
    """Gold keys in order: exactly ``"n/a"`` -> None, others stripped."""
    values = [None if key == GOLD_NULL else key.strip() for key in target]
    if not values:
        raise ValueError("gold target_scores entry has no values (expected e.g. {'n/a': 1})")
    return values


def is_null_prediction(value: object) -> bool:
    """None, ``"n/a"`` and ``"None"`` mean no value; anything else is a value."""
    return value is None or (isinstance(value, str) and value in NULL_PREDICTIONS)


def classify(gold: Sequence[str | None], prediction: object) -> str:
    """One of nn / nv / vn / vc / vw; ``gold[0]`` decides whether gold is null."""
    pred_null = is_null_prediction(prediction)
    if gold[0] is None:
        return "nn" if pred_null else "nv"
    if pred_null:
        return "vn"
    return "vc" if isinstance(prediction, str) and prediction in gold else "vw"


def score_counts(counts: Counts) -> Scores:
    """P, R, F1 from counts with ExtractGPT's exact float operations and rounding."""
    p_den = counts.nv + counts.vc + counts.vw
    r_den = counts.vn + counts.vc + counts.vw
    precision = round((counts.vc / p_den) * 100, 2) if p_den > 0 else 0.0
    recall = round((counts.vc / r_den) * 100, 2) if r_den > 0 else 0.0
    f1 = round(2 * precision * recall / (precision + recall), 2) if precision + recall > 0 else 0.0
    return Scores(precision, recall, f1)


def macro_scores(per_combo: Sequence[Scores]) -> Scores:
    """Mean of per-combo scores (exact ``fsum``), rounded to 2 decimals; 0 with no combos."""
    if not per_combo:
        return Scores(0.0, 0.0, 0.0)
    n = len(per_combo)
    return Scores(
        round(math.fsum(s.precision for s in per_combo) / n, 2),
        round(math.fsum(s.recall for s in per_combo) / n, 2),
        round(math.fsum(s.f1 for s in per_combo) / n, 2),
    )


def parse_extractgpt_prediction(pred: object) -> dict[str, object]:
    """ExtractGPT ``pred`` (a JSON object as text) -> attribute -> value.

    As ExtractGPT: text that is not valid JSON, JSON that is not an object, or a non-string
    ``pred`` yields ``{}`` (every attribute predicted null). Values keep their JSON type.
    """
    if not isinstance(pred, str):
        return {}
    try:
        parsed = json.loads(pred)
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _schema(examples: Sequence[GoldExample], attributes: Mapping[str, Sequence[str]] | None) -> dict[str, list[str]]:
    """category -> attributes: categories in gold order; schema attributes first, then gold-only ones."""
    schema: dict[str, list[str]] = {}
    for ex in examples:
        names = schema.get(ex.category)
        if names is None:
            names = schema[ex.category] = list(dict.fromkeys((attributes or {}).get(ex.category, ())))
        for name in ex.target_scores:
            if name not in names:
                names.append(name)
    return schema


def _evaluate(
    examples: Sequence[GoldExample],
    predictions: Mapping[str, Mapping[str, object]],
    attributes: Mapping[str, Sequence[str]] | None,
    strict: bool,
) -> MetricReport:
    schema = _schema(examples, attributes)
    tallies: dict[tuple[str, str], dict[str, int]] = {
        (cat, name): dict.fromkeys(OUTCOMES, 0) for cat, names in schema.items() for name in names
    }
    null_gold: list[str | None] = [None]
    for ex in examples:
        pred = predictions.get(ex.product_id, {})
        names: Iterable[str] = schema[ex.category] if strict else ex.target_scores
        for name in names:
            target = ex.target_scores.get(name)
            gold = null_gold if target is None else gold_values(target)
            tallies[(ex.category, name)][classify(gold, pred.get(name))] += 1
    combos = []
    for (cat, name), tally in tallies.items():
        counts = Counts(**tally)
        if counts.scored:
            combos.append(ComboResult(cat, name, counts, score_counts(counts)))
    total = sum((c.counts for c in combos), Counts())
    return MetricReport(score_counts(total), macro_scores([c.scores for c in combos]), total, tuple(combos))


def extractgpt_metric(
    examples: Sequence[GoldExample],
    predictions: Mapping[str, Mapping[str, object]],
    attributes: Mapping[str, Sequence[str]] | None = None,
) -> MetricReport:
    """The ExtractGPT metric (see module doc). ``predictions``: product_id -> attribute -> value;
    a missing product or attribute is a null prediction. ``attributes`` only orders the table."""
    return _evaluate(examples, predictions, attributes, strict=False)


def strict_metric(
    examples: Sequence[GoldExample],
    predictions: Mapping[str, Mapping[str, object]],
    attributes: Mapping[str, Sequence[str]] | None = None,
) -> MetricReport:
    """Strict variant: unannotated schema attributes count as gold null (see module doc)."""
    return _evaluate(examples, predictions, attributes, strict=True)
