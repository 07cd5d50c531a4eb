"""Search errors or model errors: for each wrong value of an `hpd extract` run at J = 1, is the
gold value more likely under the model than the value decoding chose?

    python scripts/search_errors.py RUN GOLD_DIR [--model default] [--adapter DIR] [--out FILE.jsonl]

RUN is the output of `hpd extract --docs-per-prompt 1` on GOLD_DIR's records (an `hpd convert`
folder: records.jsonl, attributes.json, gold.jsonl), with the run's model and the interleaved
skeleton (the defaults). Each product is scored as one prompt in the training view (the engine's
attention, teacher forcing, float32, the full vocabulary; hpd_core.collate / finetune): once with
the run's values, and once per wrong value with that one slot set to the gold value (its first
gold key). A value is a *search error* when the gold answer's log-probability for that slot is
higher: a better search (beam search, reranking) could have found it. Otherwise the model prefers
its own wrong answer, and only a better model helps. Values are tokenized as the trainer tokenizes
them (on their own), which may differ from the tokens span decoding produced.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import pyarrow.dataset as ds
import torch

from datafiles.dataset import GOLD_FILE, read_gold
from evaluation.metrics import classify, gold_values
from hpd_core.collate import Example, hpd_features, value_tokens
from hpd_core.config import ModelConfig
from hpd_core.finetune import collate_for, token_losses
from hpd_core.models import load_model
from hpd_core.types import Request
from training.data import load_gold, resolve_sources

K_MAX, SKELETON = 30, "interleaved"  # the job's defaults


def slot_logprobs(model, tokenizer, example: Example) -> list[float]:
    """Log-probability of each slot's value tokens (product-major slot order)."""
    losses = token_losses(model, collate_for(model, tokenizer, [hpd_features(tokenizer, example, K_MAX, SKELETON)]))
    lengths = [min(len(t), K_MAX) for t in value_tokens(tokenizer, example)]
    if sum(lengths) != losses.numel():
        raise RuntimeError(f"{sum(lengths)} value tokens against {losses.numel()} labels")
    sums = torch.split(losses.double(), lengths)
    return [-float(s.sum()) for s in sums]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("gold_dir", type=Path)
    parser.add_argument("--model", default="default")
    parser.add_argument("--adapter")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    data = load_gold(resolve_sources(args.gold_dir))
    gold = {g.product_id: {k: gold_values(v) for k, v in g.target_scores.items()} for g in read_gold(str(args.gold_dir / GOLD_FILE))}
    table = ds.dataset(args.run / "attributes", format="parquet").to_table(columns=["product_id", "attribute", "value"])
    predicted = {(r["product_id"], r["attribute"]): r["value"] for r in table.to_pylist()}
    model, tokenizer = load_model(ModelConfig(name=args.model, adapter=args.adapter, dtype="float32"))
    torch.set_grad_enabled(False)

    rows, kinds = [], Counter()
    for item in data.products:
        pid, attrs = item.product.product_id, data.attributes[item.category]
        request = Request(item.category, attrs, (item.product,))
        values = [predicted[(pid, a.name)] for a in attrs]
        base = None
        for s, attribute in enumerate(attrs):
            gold_slot = gold[pid].get(attribute.name)
            kind = classify(gold_slot, values[s]) if gold_slot else "unlabelled"
            if kind in ("nn", "vc", "unlabelled"):
                continue
            base = base or slot_logprobs(model, tokenizer, Example(request, (tuple(values),)))
            swapped = tuple(gold_slot[0] if i == s else v for i, v in enumerate(values))
            alt = slot_logprobs(model, tokenizer, Example(request, (swapped,)))
            gain = alt[s] - base[s]
            kinds[(kind, "search error" if gain > 0 else "model error")] += 1
            rows.append(dict(product_id=pid, attribute=attribute.name, kind=kind, predicted=values[s], gold=gold_slot[0],
                             logprob_predicted=base[s], logprob_gold=alt[s], gold_minus_predicted=gain,
                             whole_answer_gain=sum(alt) - sum(base)))
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    gains = sorted(r["gold_minus_predicted"] for r in rows)
    summary = {
        "wrong_values": len(rows),
        "search_errors": sum(g > 0 for g in gains),
        "model_errors": sum(g <= 0 for g in gains),
        "by_kind": {f"{k} {e}": n for (k, e), n in sorted(kinds.items())},
        "median_gold_minus_predicted": gains[len(gains) // 2] if gains else None,
        "within_one_nat": sum(-1 < g <= 0 for g in gains),
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
