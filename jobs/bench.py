"""`hpd bench`: the baseline and HPD side by side, same model, inputs, machine and process.

    hpd bench --records records.jsonl --attributes attributes.json --docs-per-prompt 6 --out DIR
    hpd bench --synthetic --random-arch qwen3-8b --dtype bfloat16 --device cuda --out DIR
    hpd bench --synthetic --random-arch tiny --sweep-docs 1,2,4 --sweep-batch 1,4 --out DIR

Protocol: the model is loaded once and shared. Each decoder first decodes a short warm-up (the
first requests; AR, then HPD), then the whole workload ``--repeats`` times, alternating which
decoder goes first; a decoder's time is the median of its repeats, each taken with
``time.perf_counter`` around the whole ``decode`` call (tokenization and batching included, device
synchronised). Forward passes are counted by a hook on the transformer body, so both decoders are
counted by the same code. Peak device memory is reset before each decoder; peak host memory is the
process RSS sampled during each decoder's runs (it includes the model weights).

Records mode decodes for real (greedy, real stopping), or with ``--baseline-lengths matched`` makes
the baseline generate exactly the answer that has HPD's value lengths (same output size, so only
the decoding cost differs). Synthetic mode fixes every value's length for both decoders alike
(jobs/workload.py): HPD is teacher-forced, the baseline generates exactly the answer's token count.
``--baseline-docs-per-prompt 1`` gives the paper's baseline (AR, one product per prompt) next to
HPD at J > 1. Output: ``DIR/bench.json`` and ``DIR/bench.md`` (a sweep: ``sweep.json``,
``sweep.md``, ``sweep.png``); the last stdout line is one JSON object with both decoders'
products/s and the speedup.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shlex
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from hpd_core.config import ATTENTION, DTYPES, DecodeConfig, ModelConfig
from jobs.workload import (
    VALUE_LENGTH_DISTS,
    SyntheticSpec,
    Workload,
    matched_baseline,
    records_workload,
    synthetic_workload,
)

DECODER_ORDER = ("ar", "hpd")
# Published architecture hyper-parameters (config.json of each model); weights are random.
RANDOM_ARCHS: dict[str, dict] = {
    "qwen3-8b": dict(model_type="qwen3", hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, intermediate_size=12288, vocab_size=151936, head_dim=128,
                     rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=False),
    "qwen3-4b": dict(model_type="qwen3", hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, intermediate_size=9728, vocab_size=151936, head_dim=128,
                     rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=True),
    "qwen3-1.7b": dict(model_type="qwen3", hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, intermediate_size=6144, vocab_size=151936, head_dim=128,
                       rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=True),
    "phi-4": dict(model_type="phi3", hidden_size=5120, num_hidden_layers=40, num_attention_heads=40,
                  num_key_value_heads=10, intermediate_size=17920, vocab_size=100352, head_dim=128,
                  rope_theta=250_000.0, rms_norm_eps=1e-5, max_position_embeddings=16384, tie_word_embeddings=False),
    "smollm2-135m": dict(model_type="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, intermediate_size=1536, vocab_size=49152, head_dim=64,
                         rope_theta=100_000.0, rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=True),
    # tests and smoke runs: vocab_size None = the tokenizer's
    "tiny": dict(model_type="qwen3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, vocab_size=None, head_dim=16,
                 rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=False),
}  # fmt: skip


@dataclass(frozen=True)
class TimingConfig:
    """How each decoder is timed."""

    warmup_requests: int = 1
    repeats: int = 1
    memory_sample_s: float = 0.01  # host RSS sampling interval
    matmul_size: int = 0  # prefill compute limit: square matmul size; 0 = 8192 on CUDA, 1024 on CPU

    def __post_init__(self) -> None:
        if self.warmup_requests < 0:
            raise ValueError(f"warmup_requests must be >= 0, got {self.warmup_requests}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.matmul_size < 0:
            raise ValueError(f"matmul_size must be >= 0, got {self.matmul_size}")


# --- model -----------------------------------------------------------------------------------


def arch_config(arch: str, tokenizer):
    """The transformers config of a published architecture (table above), with the tokenizer's ids."""
    from transformers import AutoConfig

    if arch not in RANDOM_ARCHS:
        raise ValueError(f"random arch must be one of {sorted(RANDOM_ARCHS)}, got {arch!r}")
    params = dict(RANDOM_ARCHS[arch])
    model_type = params.pop("model_type")
    params["vocab_size"] = params["vocab_size"] or len(tokenizer)
    if params["vocab_size"] < len(tokenizer):
        raise ValueError(f"{arch}: vocab {params['vocab_size']} is smaller than the tokenizer's {len(tokenizer)}")
    ids = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    return AutoConfig.for_model(model_type, **params, **ids, sliding_window=None)


def random_model(arch: str, tokenizer, model_cfg: ModelConfig, seed: int):
    """A randomly initialised model of a published architecture (config only, nothing downloaded)."""
    import torch
    from transformers import AutoModelForCausalLM

    from hpd_core.models import torch_dtype

    config = arch_config(arch, tokenizer)
    torch.manual_seed(seed)
    with torch.device(model_cfg.device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch_dtype(model_cfg.dtype), attn_implementation=model_cfg.attention
        )
    return model.eval()


def load(args) -> tuple[object, object, dict]:
    """(model, tokenizer, info) from the command line."""
    import torch
    from transformers import AutoTokenizer

    from hpd_core.models import load_model, prepare_tokenizer, resolve_model_dir

    model_cfg = ModelConfig(
        name=args.model, dtype=args.dtype, device=args.device, attention=args.attention
    )
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {args.device} requested but CUDA is not available")
    if args.random_arch:
        source = args.tokenizer or resolve_model_dir(ModelConfig())
        tokenizer = AutoTokenizer.from_pretrained(source)
        prepare_tokenizer(tokenizer)
        model = random_model(args.random_arch, tokenizer, model_cfg, args.seed)
        name = f"random:{args.random_arch}"
    else:
        if args.tokenizer:
            raise ValueError("--tokenizer is for --random-arch; a real model brings its own tokenizer")
        model, tokenizer = load_model(model_cfg)
        name = args.model
        source = resolve_model_dir(model_cfg)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    body = sum(p.numel() for p in model.get_decoder().parameters()) - embedding.numel()
    info = {
        "name": name,
        "tokenizer": str(source),
        "architecture": type(model).__name__,
        "dtype": args.dtype,
        "device": args.device,
        "attention": args.attention,
        "parameters": total,
        "body_matmul_parameters": body,  # per prompt token: everything but the embedding table and LM head
        "lm_head_parameters": head.numel(),
        "vocab_size": head.shape[0],
        "tokenizer_vocab": len(tokenizer),
        "random_weights": bool(args.random_arch),
    }
    return model, tokenizer, info


# --- decoders --------------------------------------------------------------------------------


def make_decoders(model, tokenizer, decode_cfg: DecodeConfig, model_name: str) -> dict:
    from hpd_core.decoders import make_decoder

    return {
        "ar": make_decoder("ar", model, tokenizer, decode_cfg, model_name),
        "hpd": forced_hpd_class()(model, tokenizer, decode_cfg, model_name),
    }


def forced_hpd_class():
    """HPDDecoder plus ``decode_forced``: teacher forcing at the cost of free decoding.

    The engine's own forcing (``decode_batch(forced=...)``) is a test tool that records every
    step's full logits (slots x K x vocab floats); here nothing is recorded and a token is still
    selected from the logits (then replaced by the forced one), so a forced step does exactly the
    work of a free-running one.
    """
    import torch

    from hpd_core.batching import plan_batches, run_split_on_oom
    from hpd_core.engine import HPDDecoder, error_result
    from hpd_core.sampling import select

    class ForcedHPDDecoder(HPDDecoder):
        def _policy(self, forced, slot_valid, generator):
            if forced is None:
                return super()._policy(forced, slot_valid, generator)
            (B, S), K = slot_valid.shape, self.config.max_value_tokens
            rows = [[list(slot) + [self.runner.pad_id] * (K - len(slot)) for slot in r] for r in forced]
            rows = [r + [[self.runner.pad_id] * K] * (S - len(r)) for r in rows]
            force = torch.tensor(rows, dtype=torch.long).to(slot_valid.device)  # (B, S, K)
            lengths = [[len(slot) for slot in r] + [1] * (S - len(r)) for r in forced]
            limit = torch.tensor(lengths, dtype=torch.long).to(slot_valid.device)  # (B, S)

            def choose(logits, rows, slots, k):
                select(logits, self.config, generator)  # the work of a free step; result unused
                return force[rows, slots, k]

            return choose, limit, None

        def decode_forced(self, requests, forced) -> list:
            for r, (request, slots) in enumerate(zip(requests, forced)):
                if len(slots) != request.num_slots:
                    raise ValueError(f"request {r}: {len(slots)} forced slots for {request.num_slots} slots")
                if any(not 1 <= len(s) <= self.config.max_value_tokens for s in slots):
                    raise ValueError(f"request {r}: forced values need 1..{self.config.max_value_tokens} tokens")
            layouts = self.layouts(requests)
            batches = plan_batches(
                [len(lay.input_ids) for lay in layouts],
                [lay.num_slots for lay in layouts],
                self.config.max_value_tokens,
                self.config.batch_token_budget,
                self.config.max_batch_size,
            )
            results = [None] * len(requests)

            def run(indices):
                picked = ([requests[i] for i in indices], [layouts[i] for i in indices])
                return list(zip(indices, self.decode_batch(*picked, None, [forced[i] for i in indices])))

            def fail(i, reason):
                return i, error_result(requests[i], self.name, reason, len(layouts[i].input_ids))

            for batch in batches:
                for i, result in run_split_on_oom(batch, run, fail):
                    results[i] = result
            return results

    return ForcedHPDDecoder


def decode(name: str, decoder, workload: Workload) -> list:
    requests = list(workload.requests)
    if name == "ar":
        exact = None if workload.exact_new_tokens is None else list(workload.exact_new_tokens)
        return decoder.decode(requests, exact_new_tokens=exact)
    if workload.forced is not None:
        return decoder.decode_forced(requests, [[list(s) for s in slots] for slots in workload.forced])
    return decoder.decode(requests)


# --- measurement -----------------------------------------------------------------------------


class PassCounter:
    """Counts calls of the transformer body (one per forward pass), prefills, and rows fed."""

    def __init__(self, body):
        self.handle = body.register_forward_pre_hook(self._hook, with_kwargs=True)
        self.reset()

    def reset(self) -> None:
        self.calls = self.prefills = self.prefill_rows = self.tokens_fed = 0

    def _hook(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("past_key_values")
        self.calls += 1
        if ids is not None:
            self.tokens_fed += ids.numel()
        if cache is None or cache.get_seq_length() == 0:
            self.prefills += 1
            self.prefill_rows += ids.shape[0] if ids is not None else 0

    def close(self) -> None:
        self.handle.remove()


class PeakRSS:
    """Peak resident memory of this process while the block runs (sampled in a thread)."""

    def __init__(self, interval_s: float):
        import psutil

        self.process = psutil.Process()
        self.interval_s = interval_s
        self.peak = 0

    def _sample(self) -> None:
        while not self.stop.wait(self.interval_s):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self):
        self.peak = self.process.memory_info().rss
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def timed(name: str, decoder, workload: Workload, device: str, counter: PassCounter, timing: TimingConfig) -> dict:
    """One full decode: wall seconds, process CPU seconds (all threads; less sensitive than wall
    time to other processes on a shared machine), results, pass counts, peak host/device bytes."""
    import torch

    _free(device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    counter.reset()
    with PeakRSS(timing.memory_sample_s) as rss:
        _sync(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        results = decode(name, decoder, workload)
        _sync(device)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "results": results,
        "counts": dict(calls=counter.calls, prefills=counter.prefills, prefill_rows=counter.prefill_rows, tokens_fed=counter.tokens_fed),
        "host_peak": rss.peak,
        "device_peak": torch.cuda.max_memory_allocated() if device.startswith("cuda") else None,
    }


def summarize(name: str, runs: list) -> dict:
    """Metrics of one decoder from its timed runs (counters from the last; they do not vary)."""
    seconds = [r["seconds"] for r in runs]
    cpu_seconds = [r["cpu_seconds"] for r in runs]
    results, counts = runs[-1]["results"], runs[-1]["counts"]
    median = statistics.median(seconds)
    ok = [r for r in results if r.error is None]
    products = sum(len(r.request.products) for r in ok)
    generated = sum(r.generated_tokens for r in ok)
    values = [v for r in ok for row in r.values for v in row]
    device_peaks = [r["device_peak"] for r in runs if r["device_peak"] is not None]
    return {
        "decoder": name,
        "seconds": median,
        "seconds_all": seconds,
        "cpu_seconds": statistics.median(cpu_seconds),
        "cpu_seconds_all": cpu_seconds,
        "products": products,
        "requests": len(results),
        "errors": [r.error for r in results if r.error is not None],
        "products_per_s": products / median,
        "products_per_cpu_s": products / statistics.median(cpu_seconds),
        "generated_tokens": generated,
        "generated_tokens_per_s": generated / median,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "prompt_tokens_per_product": sum(r.prompt_tokens for r in ok) / max(products, 1),
        "forward_passes": counts["calls"],
        "forward_passes_per_product": counts["calls"] / max(products, 1),
        "generated_tokens_per_forward_pass": generated / max(counts["calls"], 1),
        "batches": counts["prefills"],
        "mean_batch_rows": counts["prefill_rows"] / max(counts["prefills"], 1),
        "tokens_fed": counts["tokens_fed"],
        "values": len(values),
        "null_values": sum(v.value is None for v in values),
        "truncated_values": sum(v.truncated for v in values),
        "parse_errors": sum(v.parse_error for v in values),
        "peak_host_rss_mb": max(r["host_peak"] for r in runs) / 2**20,
        "peak_device_mb": max(device_peaks) / 2**20 if device_peaks else None,
    }


def agreement(ar_results: list, hpd_results: list) -> float | None:
    """Fraction of (product, attribute) slots where both decoders give the same value (matched by
    product id and attribute, so the two may stack products differently)."""

    def values(results):
        return {(p.product_id, a.name): v.value for r in results if r.error is None for p, a, v in r.items()}

    ar, hpd = values(ar_results), values(hpd_results)
    common = ar.keys() & hpd.keys()
    return sum(ar[k] == hpd[k] for k in common) / len(common) if common else None


def compare(decoders: dict, workloads: dict, device: str, counter: PassCounter, timing: TimingConfig, warm: bool = True) -> dict:
    """Warm up (AR then HPD), then ``repeats`` alternating timed runs; per-decoder summaries.
    ``workloads[name]`` is what that decoder decodes (the same inputs, or J=1 for a sweep baseline)."""
    names = [n for n in DECODER_ORDER if n in workloads]
    if warm and timing.warmup_requests:
        for name in names:
            decode(name, decoders[name], workloads[name].head(timing.warmup_requests))
    runs: dict[str, list] = {name: [] for name in names}
    for repeat in range(timing.repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            runs[name].append(timed(name, decoders[name], workloads[name], device, counter, timing))
    out = {name: summarize(name, runs[name]) for name in names}
    if len(names) == 2 and workloads["ar"].exact_new_tokens is None:  # both decoded freely
        out["agreement"] = agreement(runs["ar"][-1]["results"], runs["hpd"][-1]["results"])
    return out


def matmul_flops(device: str, dtype: str, size: int) -> float:
    """Measured dense matmul throughput (FLOP/s) at the run's dtype and device."""
    import torch

    from hpd_core.models import torch_dtype

    n = size or (8192 if device.startswith("cuda") else 1024)
    a = torch.randn(n, n, device=device, dtype=torch_dtype(dtype))
    b = torch.randn(n, n, device=device, dtype=torch_dtype(dtype))
    for _ in range(3):
        a @ b
    _sync(device)
    iters, start = 0, time.perf_counter()
    while iters < 5 or time.perf_counter() - start < 1.0:
        a @ b
        iters += 1
        if iters % 5 == 0:
            _sync(device)
    _sync(device)
    return 2 * n**3 * iters / (time.perf_counter() - start)


def prefill_limit(flops: float, model_info: dict, summary: dict) -> dict:
    """Products/s if a product cost only its prompt's body matmuls at measured matmul speed:
    FLOP/s / (2 x body parameters x prompt tokens per product)."""
    limit = flops / (2 * model_info["body_matmul_parameters"] * summary["prompt_tokens_per_product"])
    return {"limit_products_per_s": limit, "fraction_of_limit": summary["products_per_s"] / limit}


# --- command ---------------------------------------------------------------------------------


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
    m.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), a model directory or a .gguf file")
    m.add_argument("--random-arch", choices=sorted(RANDOM_ARCHS), help="random weights of a published architecture (no download)")
    m.add_argument("--tokenizer", metavar="DIR", help="tokenizer for --random-arch (default: the default model's)")
    m.add_argument("--dtype", default="float32", choices=DTYPES)
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
    d.add_argument("--batch-token-budget", type=int, default=DecodeConfig.batch_token_budget)
    t = parser.add_argument_group("timing")
    t.add_argument("--warmup-requests", type=int, default=TimingConfig.warmup_requests)
    t.add_argument("--repeats", type=int, default=TimingConfig.repeats)
    t.add_argument("--matmul-size", type=int, default=0, help="prefill-limit matmul size (0: 8192 CUDA, 1024 CPU)")
    t.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    s = parser.add_argument_group("sweep (figure 5 shape)")
    s.add_argument("--sweep-docs", type=_ints, metavar="J,J,...", help="docs per prompt to sweep, e.g. 1,2,4,6,8")
    s.add_argument("--sweep-batch", type=_ints, metavar="B,B,...", help="batch sizes (prompts per batch) to sweep")
    parser.add_argument("--out", required=True, metavar="DIR", help="writes bench.json + bench.md (sweep: sweep.*)")


def build_workload(args, tokenizer, decode_cfg: DecodeConfig, docs_per_prompt: int) -> Workload:
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


def check_args(args) -> None:
    if bool(args.synthetic) == bool(args.records):
        raise ValueError("give exactly one input: --synthetic, or --records FILE --attributes FILE")
    if args.records and not args.attributes:
        raise ValueError("--records needs --attributes FILE (attributes.json from `hpd convert`)")
    for name in ("docs_per_prompt", "baseline_docs_per_prompt"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.baseline_lengths == "matched" and (args.synthetic or args.sweep_docs):
        raise ValueError("--baseline-lengths matched is for a single records run (synthetic lengths are always fixed)")
    if bool(args.sweep_docs) != bool(args.sweep_batch):
        raise ValueError("a sweep needs both --sweep-docs and --sweep-batch")


def command_line() -> str | None:
    """The command as typed, when run from the ``hpd`` script (None under a test runner)."""
    if Path(sys.argv[0]).name not in ("hpd", "cli.py"):
        return None
    return "hpd " + shlex.join(sys.argv[1:])


def machine_info(device: str) -> dict:
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").is_file():
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
        cpu = names[0] if names else cpu
    info = {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "load_average_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        info.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return info


def run(args: argparse.Namespace) -> int:
    import torch

    check_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    K = args.max_value_tokens or max(DecodeConfig.max_value_tokens, args.value_tokens_max if args.synthetic else 0)
    decode_cfg = DecodeConfig(max_value_tokens=K, batch_token_budget=args.batch_token_budget, max_batch_size=args.batch_size)
    timing = TimingConfig(warmup_requests=args.warmup_requests, repeats=args.repeats, matmul_size=args.matmul_size)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    model, tokenizer, model_info = load(args)
    counter = PassCounter(model.get_decoder())
    report = {
        "command": command_line(),
        "args": {k: v for k, v in vars(args).items() if k != "command"},
        "machine": machine_info(args.device),
        "model": model_info,
        "decode": asdict(decode_cfg),
        "timing": asdict(timing),
    }
    try:
        if args.sweep_docs:
            summary = run_sweep(args, model, tokenizer, decode_cfg, counter, timing, report, out)
        else:
            decoders = make_decoders(model, tokenizer, decode_cfg, model_info["name"])
            summary = run_single(args, tokenizer, decoders, decode_cfg, counter, timing, report, out)
    finally:
        counter.close()
    print(json.dumps(summary))
    return 0


def run_single(args, tokenizer, decoders, decode_cfg, counter, timing, report, out: Path) -> dict:
    from jobs.plot import bench_markdown

    workload = build_workload(args, tokenizer, decode_cfg, args.docs_per_prompt)
    base_J = args.baseline_docs_per_prompt or args.docs_per_prompt
    baseline = workload if base_J == args.docs_per_prompt else build_workload(args, tokenizer, decode_cfg, base_J)
    if args.baseline_lengths == "matched":
        lengths = {
            (p.product_id, a.name): len(tokens)
            for r in decode("hpd", decoders["hpd"], workload)
            for (p, a, _), tokens in zip(r.items(), r.extra["slot_tokens"])
        }
        baseline = matched_baseline(baseline, lengths, tokenizer, decode_cfg.max_value_tokens)
    result = compare(decoders, {"ar": baseline, "hpd": workload}, args.device, counter, timing)
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
        prefill_limit={"matmul_flops_per_s": flops, **{n: prefill_limit(flops, report["model"], result[n]) for n in DECODER_ORDER}},
    )
    report["machine"]["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    (out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "bench.md").write_text(bench_markdown(report))
    print(f"wrote {out / 'bench.json'} and {out / 'bench.md'}", file=sys.stderr)
    return {n: {"products_per_s": result[n]["products_per_s"]} for n in DECODER_ORDER} | {
        "speedup": speedup, "speedup_cpu_time": speedup_cpu
    }


def run_sweep(args, model, tokenizer, decode_cfg, counter, timing, report, out: Path) -> dict:
    """HPD at every (J, batch size) against the baseline at J = 1 and every batch size; the
    headline speedup of a cell is over the best baseline (the paper's AR uses its best batch)."""
    from jobs.plot import plot_sweep, sweep_markdown

    workloads = {J: build_workload(args, tokenizer, decode_cfg, J) for J in sorted(set(args.sweep_docs) | {1})}
    baseline, cells = {}, {}
    first = True
    for B in args.sweep_batch:
        decoders = make_decoders(model, tokenizer, replace(decode_cfg, max_batch_size=B), report["model"]["name"])
        baseline[B] = compare(decoders, {"ar": workloads[1]}, args.device, counter, timing, warm=first)["ar"]
        for J in args.sweep_docs:
            cells[(J, B)] = compare(decoders, {"hpd": workloads[J]}, args.device, counter, timing, warm=first)["hpd"]
            first = False
    best_b = max(baseline, key=lambda b: baseline[b]["products_per_s"])
    best_ar = baseline[best_b]["products_per_s"]
    grid = [
        {
            "docs_per_prompt": J,
            "batch_size": B,
            "hpd_products_per_s": cell["products_per_s"],
            "speedup": cell["products_per_s"] / best_ar,
            "speedup_same_batch": cell["products_per_s"] / baseline[B]["products_per_s"],
            "hpd": cell,
        }
        for (J, B), cell in cells.items()
    ]
    report.update(
        workload={"kind": workloads[1].kind, "fixed_lengths": workloads[1].fixed_lengths, **workloads[1].info},
        baseline={str(b): s for b, s in baseline.items()},
        baseline_best_batch=best_b,
        grid=grid,
    )
    (out / "sweep.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "sweep.md").write_text(sweep_markdown(report))
    plot_sweep(report, out / "sweep.png")
    print(f"wrote {out / 'sweep.json'}, {out / 'sweep.md'} and {out / 'sweep.png'}", file=sys.stderr)
    top = max(grid, key=lambda g: g["hpd_products_per_s"])
    return {
        "ar": {"products_per_s": best_ar, "batch_size": best_b},
        "hpd": {"products_per_s": top["hpd_products_per_s"], "docs_per_prompt": top["docs_per_prompt"], "batch_size": top["batch_size"]},
        "speedup": top["speedup"],
    }
