"""One benchmark comparison at the command line's J (``hpd bench`` without a sweep): the workload
built from the command line, the baseline's workload (its own J, or HPD's lengths matched), both
decoders timed, and ``bench.json`` + ``bench.md`` written."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.compare import DECODER_ORDER, compare, floor
from bench.decoders import decode
from bench.measure import PassCounter, TimingConfig, matmul_flops
from bench.report import load_average, write_json
from bench.workload import (
    SyntheticSpec, Workload, answer_value_tokens, floor_input_tokens, matched_baseline, records_workload, synthetic_workload,
)  # fmt: skip
from hpd_core.config import DecodeConfig


def build_workload(args: argparse.Namespace, tokenizer, decode_cfg: DecodeConfig, docs_per_prompt: int) -> Workload:
    """The command line's workload (records or synthetic) stacked at ``docs_per_prompt``."""
    if args.synthetic:
        spec = SyntheticSpec(
            num_products=args.num_products,
            product_tokens=args.product_tokens,
            attributes_per_product=args.attributes_per_product,
            value_tokens_max=args.value_tokens_max,
            value_length_dist=args.value_length_dist,
            value_length_mean=args.value_length_mean,
            docs_per_prompt=docs_per_prompt,
            seed=args.seed,
        )
        return synthetic_workload(spec, tokenizer, decode_cfg.max_value_tokens)
    return records_workload(args.records, args.attributes, docs_per_prompt, args.limit, args.limit_per_category)


def run_single(
    args: argparse.Namespace,
    tokenizer,
    decoders: dict,
    decode_cfg: DecodeConfig,
    counters: dict[str, PassCounter],
    timing: TimingConfig,
    report: dict,
    out: Path,
) -> dict:
    """One comparison at the command line's J: writes bench.json and bench.md, returns the stdout summary."""
    from bench.plot import bench_markdown

    workload = build_workload(args, tokenizer, decode_cfg, args.docs_per_prompt)
    base_J = args.baseline_docs_per_prompt or args.docs_per_prompt
    baseline = workload if base_J == args.docs_per_prompt else build_workload(args, tokenizer, decode_cfg, base_J)
    if args.baseline_lengths == "matched":
        lengths = {
            (p.product_id, a.name): answer_value_tokens(tokenizer, tokens)
            for r in decode("hpd", decoders["hpd"], workload)
            for (p, a, _), tokens in zip(r.items(), r.extra["slot_tokens"])
        }
        baseline = matched_baseline(baseline, lengths, tokenizer, decode_cfg.max_value_tokens)
        # HPD has just decoded its whole workload untimed: its kernels, graphs and caches are warm for
        # every shape it meets. The baseline gets the same untimed pass, so neither starts colder.
        decode("ar", decoders["ar"], baseline)
    result = compare(decoders, {"ar": baseline, "hpd": workload}, args.device, counters, timing)
    flops = matmul_flops(args.device, args.dtype, timing.matmul_size)
    speedup = result["hpd"]["products_per_s"] / result["ar"]["products_per_s"]
    speedup_cpu = result["hpd"]["products_per_cpu_s"] / result["ar"]["products_per_cpu_s"]
    from_baseline = {k: baseline.info[k] for k in ("baseline_lengths", "answer_tokens_mean_per_product") if k in baseline.info}
    report.update(
        workload={"kind": workload.kind, "fixed_lengths": workload.fixed_lengths, "requests": len(workload.requests),
                  **workload.info, **from_baseline},  # fmt: skip
        baseline_docs_per_prompt=base_J,
        baseline_lengths=args.baseline_lengths,
        ar=result["ar"],
        hpd=result["hpd"],
        speedup=speedup,
        speedup_cpu_time=speedup_cpu,
        agreement=result.get("agreement"),
        floor=floor(
            flops, report["model"], floor_input_tokens(workload.requests, tokenizer),
            result["hpd"]["generated_tokens"] / result["hpd"]["products"], {n: result[n] for n in DECODER_ORDER},
        ),  # fmt: skip
    )
    report["machine"]["load_average_end"] = load_average()
    write_json(out / "bench.json", report)
    (out / "bench.md").write_text(bench_markdown(report))
    print(f"wrote {out / 'bench.json'} and {out / 'bench.md'}", file=sys.stderr)
    return {n: {"products_per_s": result[n]["products_per_s"]} for n in DECODER_ORDER} | {
        "speedup": speedup,
        "speedup_cpu_time": speedup_cpu,
        "floor_fraction": {n: report["floor"][n]["fraction"] for n in DECODER_ORDER},
    }
