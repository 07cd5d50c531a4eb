"""Which sliding window fits HPD's gapped positions? Teacher-forced gold-value loss of a model with
sliding-window layers (Gemma 3 270M, zero-shot) under three rules for its sliding layers:

- positions: a key is in the window iff pos(query) - pos(key) < W (what the model's rotary
  distances saw in pretraining; the rule hpd_core.masks applies),
- present:   the W most recent keys *present* for the query, counted in position order (gaps and
  absent value tokens do not use up the window),
- none:      no window at all (what a 4D mask without windows silently did before).

Data: OA-Mine *train* products (never test), the first PER_CATEGORY of each category, stacked J per
prompt, both skeletons. Lower mean loss per gold value token = the rule the model reads better.

    python benchmarks/window-rule/measure.py [--per-category 6] [--docs 1 6] [--model gemma3-270m]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hpd_core import masks
from hpd_core.collate import IGNORE, stack_examples
from hpd_core.config import ModelConfig, TrainConfig
from hpd_core.finetune import to_features
from hpd_core.models import load_model
from training.data import load_gold, resolve_sources


def present_window(allowed: torch.Tensor, pos: torch.Tensor, window: int) -> torch.Tensor:
    """(T, T) allowed -> keep, per query, only the ``window`` allowed keys of highest position."""
    order = torch.argsort(pos)
    a = allowed[:, order]
    rank = torch.flip(torch.cumsum(torch.flip(a.int(), [1]), 1), [1])  # allowed keys at >= this pos
    keep = a & (rank <= window)
    out = torch.zeros_like(allowed)
    out[:, order] = keep
    return out


def rule_mask(rule: str, pos, gen, valid, window, dtype):
    full = masks.training_allowed(pos, gen, valid)  # (1, T, T)
    if rule == "positions":
        sliding = masks.training_allowed(pos, gen, valid, window)
    elif rule == "present":
        sliding = present_window(full[0], pos[0], window)[None]
    else:
        sliding = full
    return {masks.FULL: masks.additive(full, dtype), masks.SLIDING: masks.additive(sliding, dtype)}


@torch.no_grad()
def mean_loss(model, feats, rule: str, window: int) -> float:
    total, count = 0.0, 0
    for f in feats:
        ids, pos = torch.tensor([f.input_ids]), torch.tensor([f.position_ids])
        gen, labels = torch.tensor([f.gen]), torch.tensor([f.labels])
        mask = rule_mask(rule, pos, gen, torch.ones_like(ids, dtype=torch.bool), window, torch.float32)
        hidden = model.get_decoder()(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=False).last_hidden_state
        keep = labels != IGNORE
        logits = model.get_output_embeddings()(hidden[keep]).float()
        losses = F.cross_entropy(logits, labels[keep], reduction="none")
        total += float(losses.sum())
        count += losses.numel()
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--train", default="work/oa-train")
    parser.add_argument("--per-category", type=int, default=6)
    parser.add_argument("--docs", type=int, nargs="+", default=[1, 6], help="J values to measure")
    parser.add_argument("--out", default=str(Path(__file__).with_name("results.json")))
    args = parser.parse_args()
    model, tokenizer = load_model(ModelConfig(name=args.model))
    windows = masks.layer_windows(model.config)
    window = windows[masks.SLIDING]
    data = load_gold(resolve_sources(Path(args.train), None, None))
    taken: dict[str, int] = {}
    products = []
    for p in data.products:
        if taken.get(p.category, 0) < args.per_category:
            taken[p.category] = taken.get(p.category, 0) + 1
            products.append(p)
    rows = []
    for skeleton in ("after-products", "interleaved"):
        for docs in args.docs:
            config = TrainConfig(max_docs_per_prompt=None, docs_per_prompt=docs, skeleton=skeleton)
            examples = stack_examples(products, data.attributes, docs, random.Random(0))
            feats = to_features(tokenizer, examples, config)
            longest = max(max(f.position_ids) for f in feats)
            for rule in ("positions", "present", "none"):
                start = time.perf_counter()
                loss = mean_loss(model, feats, rule, window)
                rows.append({"skeleton": skeleton, "J": docs, "rule": rule, "mean_value_token_loss": round(loss, 4),
                             "prompts": len(feats), "max_position": longest, "seconds": round(time.perf_counter() - start, 1)})
                print(json.dumps(rows[-1]), flush=True)
    result = {"model": args.model, "window": window, "products": len(products), "data": args.train, "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
