"""Would a rule that one value names one attribute raise F1? Measured on an `hpd extract` run:

    python scripts/distinct_values.py RUN GOLD_DIR [--json OUT]

RUN is an `hpd extract` output (with `--confidence` for the rule that keeps the likeliest value)
and GOLD_DIR an `hpd convert` folder (gold.jsonl, attributes.json). Where a product's run gives
the very same value (letter case aside) under two or more attributes ("RAM: 8GB RAM", "Storage:
8GB RAM"), at most one of them can be the gold's unless the gold itself repeats a value, and the
rest could be written as null. A wrong value made null only ever raises the ExtractGPT metric's
precision (``vw`` -> ``vn``, ``nv`` -> ``nn``), a right one lowers its recall. The script counts
such groups in the run and such products in the gold, and scores the run as it is and with one
value of each group kept by each rule:

- ``likeliest``: the value of the highest confidence (the run's `--confidence`);
- ``first`` / ``last``: the attribute first or last in the schema's order;
- ``none``: every value of the group made null;
- ``oracle``: one the gold has, where there is one (an upper bound, not a rule).

Findings: docs/quality.md, "One value, one attribute".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path

from datafiles.dataset import ATTRIBUTES_FILE, GOLD_FILE, read_attributes, read_gold
from datafiles.predictions import read_predictions
from evaluation.metrics import is_null_prediction
from evaluation.scoring import evaluate

Values = Mapping[str, Mapping[str, object]]  # product id -> attribute -> value
Rule = Callable[[str, list[str]], "str | None"]  # (product id, the group's attributes) -> the one kept


def groups(values: Mapping[str, object]) -> list[list[str]]:
    """The attributes of one product that share a value (letter case and surrounding spaces
    aside), two or more, in the product's attribute order; null values share nothing."""
    by_value: dict[str, list[str]] = defaultdict(list)
    for attribute, value in values.items():
        if isinstance(value, str) and not is_null_prediction(value):
            by_value[value.strip().casefold()].append(attribute)
    return [names for names in by_value.values() if len(names) > 1]


def distinct(values: Values, keep: Rule) -> tuple[dict[str, dict[str, object]], int]:
    """``values`` with every value of each group made null but the one ``keep`` names (None: all
    of them), and how many were made null."""
    out, nulled = {}, 0
    for product_id, product in values.items():
        product = dict(product)
        for names in groups(product):
            kept = keep(product_id, names)
            for attribute in names:
                if attribute != kept:
                    product[attribute] = None
                    nulled += 1
        out[product_id] = product
    return out, nulled


def rules(values: Values, confidence: Values, gold: Mapping, schema: Mapping[str, list[str]]) -> dict[str, Rule]:
    """The rules above, for products whose gold (category, values) is ``gold[product id]``."""
    def place(product_id: str, attribute: str) -> int:
        order = schema.get(gold[product_id].category, []) if product_id in gold else []
        return order.index(attribute) if attribute in order else len(order)

    def oracle(product_id: str, names: list[str]) -> str | None:
        target = gold[product_id].target_scores if product_id in gold else {}
        return next((a for a in names if values[product_id][a] in target.get(a, {})), None)

    out: dict[str, Rule] = {}
    if confidence:
        out["likeliest"] = lambda p, names: max(names, key=lambda a: confidence.get(p, {}).get(a, float("-inf")))
    out["first"] = lambda p, names: min(names, key=lambda a: place(p, a))
    out["last"] = lambda p, names: max(names, key=lambda a: place(p, a))
    out["none"] = lambda p, names: None
    out["oracle"] = oracle
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="an `hpd extract` output")
    parser.add_argument("gold_dir", type=Path, help="an `hpd convert` folder: gold.jsonl, attributes.json")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    predictions = read_predictions(args.run)
    gold = read_gold(str(args.gold_dir / GOLD_FILE))
    schema = read_attributes(str(args.gold_dir / ATTRIBUTES_FILE))
    by_id = {example.product_id: example for example in gold}
    found = [names for product in predictions.values.values() for names in groups(product)]
    result = {
        "run": args.run,
        "gold": str(args.gold_dir),
        "products": len(predictions.values),
        "products_with_a_repeated_value": sum(1 for product in predictions.values.values() if groups(product)),
        "groups": len(found),
        "gold_products_with_a_repeated_value": sum(1 for example in gold if _gold_repeats(example.target_scores)),
        "scores": {"as run": dataclasses.asdict(evaluate(predictions, gold, schema).lenient.micro)},
        "nulled": {},
    }
    for name, rule in rules(predictions.values, predictions.confidence, by_id, schema).items():
        values, nulled = distinct(predictions.values, rule)
        scored = evaluate(dataclasses.replace(predictions, values=values), gold, schema).lenient.micro
        result["scores"][name], result["nulled"][name] = dataclasses.asdict(scored), nulled
    print(f"{result['products']} products, {result['products_with_a_repeated_value']} with a value under two or more "
          f"attributes ({result['groups']} groups); in the gold: {result['gold_products_with_a_repeated_value']}")
    for name, scores in result["scores"].items():
        nulled = f"{result['nulled'][name]:4d} made null" if name in result["nulled"] else " " * 14
        print(f"  {name:10s} {nulled}  P {scores['precision']:6.2f}  R {scores['recall']:6.2f}  F1 {scores['f1']:6.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def _gold_repeats(target: Mapping[str, Mapping[str, object]]) -> bool:
    """Whether a gold product gives one value (case aside) under two attributes ("n/a" is none)."""
    seen: dict[str, str] = {}
    for attribute, values in target.items():
        for value in {v.strip().casefold() for v in values if not is_null_prediction(v)}:
            if seen.setdefault(value, attribute) != attribute:
                return True
    return False


if __name__ == "__main__":
    main()
