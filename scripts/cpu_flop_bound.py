"""The matrix work per product of each decoder in a records `hpd bench` run, and so the largest
speedup a compute-bound device (a CPU) can show between them.

    python scripts/cpu_flop_bound.py benchmarks/cpu-gemma3-5ep-oa-mine-96-j6-ar-j1

It reads the run's bench.json (its records, J of each decoder, model parameters and generated token
counts), rebuilds the same prompts with the run's tokenizer, and counts per product the tokens each
decoder must compute beyond the shared prefixes (prefilled once per category and attribute list):
the baseline's own prompt tokens and its whole answer, HPD's own prompt tokens (the product's text
and keys) and its values. Matrix work: 2 x body parameters per token, plus 2 x LM-head parameters
per generated token (and per prompt for the baseline's first token). Attention is left out (small
at title lengths). A memory-bound device (a GPU decoding) pays per forward pass instead: see
scripts/roofline.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transformers import AutoTokenizer

from bench.workload import records_workload
from hpd_core.layout import build_layout, encode_prompt, shared_prefix_length
from hpd_core.prompts import answer_prefix, render_prompt, shared_prefix_text


def own_prompt_tokens(run: dict, tokenizer) -> tuple[float, float, dict[str, int]]:
    """Per product: the baseline's and HPD's prompt tokens beyond the shared prefixes."""
    args = run["args"]
    k_max = run["decode"]["max_value_tokens"]
    skeleton = run["decode"]["skeleton"]
    load = lambda j: records_workload(args["records"], args["attributes"], j, args["limit"], args["limit_per_category"])
    baseline, hpd = load(run["baseline_docs_per_prompt"]), load(args["docs_per_prompt"])
    ar_own, prefixes = 0, {}
    for r in baseline.requests:
        ids = encode_prompt(tokenizer, render_prompt(r, tokenizer) + answer_prefix())
        prefix = shared_prefix_length(tokenizer, shared_prefix_text(r, tokenizer, hpd=False), ids, len(ids) - 1)
        ar_own += len(ids) - prefix
        prefixes[r.category] = prefix
    hpd_own = 0
    for r in hpd.requests:
        layout = build_layout(r, tokenizer, k_max, skeleton)
        text = shared_prefix_text(r, tokenizer, skeleton)
        hpd_own += len(layout.input_ids) - shared_prefix_length(tokenizer, text, layout.input_ids, min(layout.anchor_index))
    n = hpd.num_products
    return ar_own / n, hpd_own / n, prefixes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="an hpd bench output folder (records workload)")
    args = parser.parse_args(argv)
    run = json.loads((Path(args.run) / "bench.json").read_text())
    if run["workload"]["kind"] != "records":
        raise SystemExit(f"{args.run}: a records run is needed (this one is {run['workload']['kind']!r})")
    tokenizer = AutoTokenizer.from_pretrained(run["model"]["tokenizer"])
    ar_own, hpd_own, prefixes = own_prompt_tokens(run, tokenizer)
    n = run["workload"]["products"]
    body, head = run["model"]["body_matmul_parameters"], run["model"]["lm_head_parameters"]
    ar_gen, hpd_gen = run["ar"]["generated_tokens"] / n, run["hpd"]["generated_tokens"] / n
    prompts_per_product = run["ar"]["requests"] / n
    ar = 2 * body * (ar_own + ar_gen) + 2 * head * (ar_gen + prompts_per_product)
    hpd_head = 2 * head * hpd_gen
    hpd = 2 * body * (hpd_own + hpd_gen) + hpd_head
    print(f"shared prefixes (tokens, prefilled once): {prefixes}")
    print(f"baseline: {ar_own:.1f} own prompt + {ar_gen:.1f} generated tokens per product: {ar / 1e9:.1f} GFLOP")
    print(f"HPD:      {hpd_own:.1f} own prompt + {hpd_gen:.1f} value tokens per product: {hpd / 1e9:.1f} GFLOP")
    print(f"ratio of matrix work (the most a compute-bound device can show): {ar / hpd:.2f}x; "
          f"with no LM head for HPD's values: {ar / (hpd - hpd_head):.2f}x")
    print(f"measured in the run: {run['speedup']:.2f}x")


if __name__ == "__main__":
    main()
