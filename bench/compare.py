"""`hpd bench` protocol: warm up, then alternating timed repeats of both decoders, and the metrics
each decoder's runs reduce to (median time, products/s, passes per product, ...)."""

from __future__ import annotations

import statistics

from bench.decoders import decode
from bench.measure import PassCounter, TimingConfig, timed
from bench.workload import Workload

DECODER_ORDER = ("ar", "hpd")


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
        "shared_prefix_prefills": counts.get("prefix_prefills", 0),
        "cuda_graphs": f"{counts.get('graphs_captured', 0)} / {counts.get('graphs_failed', 0)}",
        "step_shapes": f"{counts.get('fixed_batches', 0)} / {counts.get('packed_batches', 0)}",
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


def compare(
    decoders: dict,
    workloads: dict[str, Workload],
    device: str,
    counters: dict[str, PassCounter],
    timing: TimingConfig,
    warm: bool = True,
) -> dict:
    """Warm up (AR then HPD), then ``repeats`` alternating timed runs; per-decoder summaries.
    ``workloads[name]`` is what that decoder decodes (the same inputs, or J=1 for a sweep baseline);
    ``counters[name]`` counts the passes of that decoder's model."""
    names = [n for n in DECODER_ORDER if n in workloads]
    if warm and timing.warmup_requests:
        for name in names:
            decode(name, decoders[name], workloads[name].head(timing.warmup_requests))
    runs: dict[str, list] = {name: [] for name in names}
    for repeat in range(timing.repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            runs[name].append(timed(name, decoders[name], workloads[name], device, counters[name], timing))
    out = {name: summarize(name, runs[name]) for name in names}
    if len(names) == 2 and workloads["ar"].exact_new_tokens is None:  # both decoded freely
        out["agreement"] = agreement(runs["ar"][-1]["results"], runs["hpd"][-1]["results"])
    return out


def floor(flops: float, model_info: dict, input_tokens: float, value_tokens: float, summaries: dict) -> dict:
    """The per-product floor: products/s if a product cost only the body matmuls of the tokens no
    sharing removes (its own text, its attribute keys, its generated values) at the matmul speed
    measured in the same run, FLOP/s / (2 x body parameters x floor tokens); and the fraction of it
    each decoder reached."""
    tokens = input_tokens + value_tokens
    limit = flops / (2 * model_info["body_matmul_parameters"] * tokens)
    out = {"matmul_flops_per_s": flops, "input_tokens_per_product": input_tokens,
           "value_tokens_per_product": value_tokens, "tokens_per_product": tokens, "limit_products_per_s": limit}  # fmt: skip
    return out | {name: {"fraction": s["products_per_s"] / limit} for name, s in summaries.items()}
