"""What kind of error each wrong value of an `hpd extract` run is, against its gold:

    python scripts/error_kinds.py RUN GOLD_DIR [--train-gold FILE] [--examples N]

RUN is an `hpd extract` output and GOLD_DIR an `hpd convert` folder (gold.jsonl). Every value the
ExtractGPT metric counts wrong (`evaluation.metrics.classify`: ``vw``, a value other than the
gold's, or ``vn``, null where the gold has a value) is put in one kind, comparing the decoded value
with the gold's first value without regard to case:

- ``case``: the same words in other letter case ("zed" for "Zed");
- ``too short``: the decoded value lies inside the gold value ("Kimbo" for "Kimbo Espresso");
- ``too long``: the gold value lies inside the decoded one ("Nestle Cerelac" for "Nestle");
- ``overlapping``: they share a word, neither inside the other;
- ``another span``: they share no word;
- ``null``: the run wrote null.

With ``--train-gold`` (the gold of the products the model was trained on; products of GOLD_DIR in
it are left out), it also counts, per kind, how often the decoded value, and how often the gold
value, is a gold value of the same category and attribute among the training products: a decoded
value that training labels that way is the training's convention, not an invention.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

from datafiles.dataset import GOLD_FILE, read_gold
from datafiles.predictions import read_predictions
from evaluation.metrics import classify, gold_values, is_null_prediction

KINDS = ("case", "too short", "too long", "overlapping", "another span", "null")


def kind_of(gold: str, decoded: str) -> str:
    """The kind of a wrong value (both non-null), case aside."""
    g, d = gold.lower(), decoded.lower()
    if d == g:
        return "case"
    if d in g:
        return "too short"
    if g in d:
        return "too long"
    return "overlapping" if set(g.split()) & set(d.split()) else "another span"


def training_values(path: Path, leave_out: set[str]) -> dict[tuple[str, str], set[str]]:
    """(category, attribute) -> the lower-cased gold values of the training products."""
    seen: dict[tuple[str, str], set[str]] = defaultdict(set)
    for example in read_gold(str(path)):
        if example.product_id in leave_out:
            continue
        for attribute, target in example.target_scores.items():
            seen[(example.category, attribute)].update(v.lower() for v in gold_values(target) if v is not None)
    return seen


def error_kinds(run: str, gold_dir: Path, train_gold: Path | None = None, examples: int = 0) -> dict:
    gold = read_gold(str(gold_dir / GOLD_FILE))
    predictions = read_predictions(run, only={g.product_id for g in gold}).values
    seen = training_values(train_gold, {g.product_id for g in gold}) if train_gold else None
    kinds, decoded_in_training, gold_in_training = Counter(), Counter(), Counter()
    shown: dict[str, list] = defaultdict(list)
    scored = 0
    for example in gold:
        values = predictions.get(example.product_id, {})
        for attribute, target in example.target_scores.items():
            golds = gold_values(target)
            decoded = values.get(attribute)
            outcome = classify(golds, decoded)
            if outcome not in ("vc", "vw", "vn"):
                continue  # the gold is null: the metric does not count the value
            scored += 1
            if outcome == "vc":
                continue
            kind = "null" if is_null_prediction(decoded) else kind_of(golds[0], str(decoded))
            kinds[kind] += 1
            if seen is not None and kind != "null":
                known = seen.get((example.category, attribute), set())
                decoded_in_training[kind] += str(decoded).lower() in known
                gold_in_training[kind] += golds[0].lower() in known
            if len(shown[kind]) < examples:
                shown[kind].append({"attribute": attribute, "gold": golds[0], "decoded": decoded})
    out = {"run": run, "scored_values": scored, "wrong": sum(kinds.values()),
           "kinds": {k: kinds[k] for k in KINDS}}
    if seen is not None:
        out["decoded_is_a_training_value"] = {k: decoded_in_training[k] for k in KINDS[:-1]}
        out["gold_is_a_training_value"] = {k: gold_in_training[k] for k in KINDS[:-1]}
    if examples:
        out["examples"] = dict(shown)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("gold_dir", type=Path)
    parser.add_argument("--train-gold", type=Path, help="gold.jsonl of the products the model was trained on")
    parser.add_argument("--examples", type=int, default=0, help="show this many values of each kind")
    args = parser.parse_args()
    print(json.dumps(error_kinds(args.run, args.gold_dir, args.train_gold, args.examples), indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
