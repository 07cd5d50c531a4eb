"""Scores by confidence: what keeping only the values the model is sure of buys.

An output written with ``hpd extract --confidence`` carries each value's probability under the model
(``hpd_core.types.Value.confidence``). At a threshold t every value with a confidence below t is read
as null and both metrics are computed again, so a user can choose t for the precision a catalog
needs and see what it costs in recall (a value set to null is a miss where the gold has one, and
no longer a wrong value). The column is float32, so each threshold is compared as a float32 (a
value of 0.9 is kept at "at least 0.9"); a confidence that is not a number (NaN) counts as below
every threshold but 0. Values without a confidence (in an output with the column, those the text
check wrote as null and a parse error's nulls) are never dropped; a table is made only when some value has one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from datafiles.dataset import GoldExample
from datafiles.predictions import stored_threshold
from evaluation.metrics import Scores, extractgpt_metric, is_null_prediction, strict_metric

THRESHOLDS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)


@dataclass(frozen=True)
class AtThreshold:
    threshold: float
    values: int  # non-null predicted values kept (every predicted attribute, annotated or not)
    share: float  # of the non-null predicted values at threshold 0, in percent
    micro: Scores  # the ExtractGPT metric with the dropped values read as null
    strict: Scores

    def to_dict(self) -> dict:
        return {"threshold": self.threshold, "values": self.values, "share": self.share,
                "micro": self.micro.to_dict(), "strict": self.strict.to_dict()}  # fmt: skip


def kept(
    predictions: Mapping[str, Mapping[str, object]], confidence: Mapping[str, Mapping[str, float]], threshold: float
) -> dict[str, dict[str, object]]:
    """The predictions with every value whose confidence is below ``threshold`` read as null."""
    at_least = stored_threshold(threshold)

    def keep(product_id: str, attribute: str, value: object) -> object:
        sure = confidence.get(product_id, {}).get(attribute)
        return None if threshold > 0 and sure is not None and not sure >= at_least else value

    return {pid: {name: keep(pid, name, value) for name, value in values.items()} for pid, values in predictions.items()}


def by_confidence(
    gold: Sequence[GoldExample],
    predictions: Mapping[str, Mapping[str, object]],
    confidence: Mapping[str, Mapping[str, float]],
    attributes: Mapping[str, Sequence[str]] | None = None,
    thresholds: Sequence[float] = THRESHOLDS,
) -> list[AtThreshold]:
    """Both metrics at each threshold; [] when no value has a confidence."""
    if not any(confidence.values()):
        return []
    gold_ids = {ex.product_id for ex in gold}

    def count(at: Mapping[str, Mapping[str, object]]) -> int:
        return sum(1 for pid, row in at.items() if pid in gold_ids for v in row.values() if not is_null_prediction(v))

    rows, everything = [], count(predictions)
    for threshold in thresholds:
        at = kept(predictions, confidence, threshold)
        values = count(at)
        share = round(100.0 * values / everything, 2) if everything else 0.0
        micro = extractgpt_metric(gold, at, attributes).micro
        rows.append(AtThreshold(threshold, values, share, micro, strict_metric(gold, at, attributes).micro))
    return rows
