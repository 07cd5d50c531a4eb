"""The decoders' tokenization of a batch: each text in a call of its own (the references
``layout.build_layout``, ``AutoregressiveDecoder.prompt_ids`` and ``answer_budget``) against every
text of the batch in one call (``build_layouts``, ``AutoregressiveDecoder.prepare``), alternating
in one process, the results checked equal.

Usage:
    python scripts/tokenize_ab.py [--model default] [--repeats 3] [--out DIR]

Workloads: 512 synthetic products as `hpd bench --synthetic` draws them, titles (30 tokens, 8
attributes, HPD J = 6) and long products (500 tokens, 16 attributes, J = 4); the baseline at J = 1.
Prints one line per workload and decoder (best of the repeats, each way) and writes them to
DIR/tokenize-ab.txt when --out is given.
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import replace
from pathlib import Path

from transformers import AutoTokenizer

from bench.workload import SyntheticSpec, synthetic_workload
from hpd_core.autoregressive import AutoregressiveDecoder
from hpd_core.config import DecodeConfig, ModelConfig
from hpd_core.layout import build_layout, build_layouts
from hpd_core.models import prepare_tokenizer, resolve_model_dir

K_MAX = 30
WORKLOADS = {"titles": (30, 8, 6), "long": (500, 16, 4)}  # product tokens, attributes, HPD's J


class TokenizerOnly(AutoregressiveDecoder):
    """The baseline's preparation without a model (its tokenization needs only the tokenizer)."""

    def __init__(self, tokenizer, config: DecodeConfig):
        self.tokenizer, self.config = tokenizer, config


def timed(run) -> tuple[float, object]:
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(ModelConfig(name=args.model)))
    prepare_tokenizer(tokenizer)
    ar = TokenizerOnly(tokenizer, DecodeConfig(max_value_tokens=K_MAX))
    lines = [f"{args.model} tokenizer, {platform.processor() or platform.machine()}, best of {args.repeats}, alternating"]
    for name, (product_tokens, attributes, J) in WORKLOADS.items():
        spec = SyntheticSpec(num_products=512, product_tokens=product_tokens, attributes_per_product=attributes,
                             value_tokens_max=10, docs_per_prompt=J)  # fmt: skip
        requests = list(synthetic_workload(spec, tokenizer, K_MAX).requests)
        alone = list(synthetic_workload(replace(spec, docs_per_prompt=1), tokenizer, K_MAX).requests)
        one = many = one_ar = many_ar = float("inf")
        for _ in range(args.repeats):  # the two ways alternate, so that a slower moment hits both
            t, a = timed(lambda: [build_layout(r, tokenizer, K_MAX, "interleaved") for r in requests])
            u, b = timed(lambda: build_layouts(requests, tokenizer, K_MAX, "interleaved"))
            v, c = timed(lambda: [(ar.prompt_ids(r), ar.answer_budget(r)) for r in alone])
            w, d = timed(lambda: ar.prepare(alone))
            if a != b or c != d:
                raise SystemExit(f"{name}: a batch tokenized in one call differs from its texts tokenized alone")
            one, many, one_ar, many_ar = min(one, t), min(many, u), min(one_ar, v), min(many_ar, w)
        lines.append(f"{name}: HPD layouts of {len(requests)} prompts {one:.3f} s a call per text, {many:.3f} s one call "
                     f"({one / many:.2f}x); the baseline's {len(alone)} prompts and budgets {one_ar:.3f} s against "
                     f"{many_ar:.3f} s ({one_ar / many_ar:.2f}x); equal")  # fmt: skip
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tokenize-ab.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
