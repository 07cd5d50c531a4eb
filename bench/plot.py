"""Rendering of `hpd bench` results: the Markdown summaries and the sweep plot (speedup vs J, one
line per batch size: the shape of the paper's figure 5). Pure functions of the report dicts."""

from __future__ import annotations

from pathlib import Path

from hpd_core.config import DecodeConfig

ROWS = (  # (label, key, format)
    ("products/s", "products_per_s", "{:.3f}"),
    ("generated tokens/s", "generated_tokens_per_s", "{:.1f}"),
    ("seconds (median)", "seconds", "{:.2f}"),
    ("process CPU seconds (median)", "cpu_seconds", "{:.1f}"),
    ("products per CPU-second", "products_per_cpu_s", "{:.4f}"),
    ("products", "products", "{}"),
    ("requests (prompts)", "requests", "{}"),
    ("prefill forwards", "batches", "{}"),
    ("shared prefixes prefilled", "shared_prefix_prefills", "{}"),
    ("CUDA graphs captured / failed", "cuda_graphs", "{}"),
    ("batches with fixed / packed steps", "step_shapes", "{}"),
    ("mean rows per prefill", "mean_batch_rows", "{:.1f}"),
    ("prompt tokens per product", "prompt_tokens_per_product", "{:.1f}"),
    ("generated tokens", "generated_tokens", "{}"),
    ("forward passes", "forward_passes", "{}"),
    ("forward passes per product", "forward_passes_per_product", "{:.2f}"),
    ("generated tokens per forward pass", "generated_tokens_per_forward_pass", "{:.2f}"),
    ("null / truncated / parse-error values", None, None),
    ("peak host RSS (MiB)", "peak_host_rss_mb", "{:.0f}"),
    ("peak device memory (MiB)", "peak_device_mb", "{:.0f}"),
)


def _budget(decode: dict) -> str:
    """The batch token budget as run: a number, or "auto" (with the number it came to, if known)."""
    if decode["batch_token_budget"]:
        return str(decode["batch_token_budget"])
    return f"auto ({decode['token_budget']})" if "token_budget" in decode else "auto"


def _prefill(decode: dict) -> str:
    """The prefill forward size as run ("" for reports from before it existed)."""
    limit = decode.get("prefill_limit")
    if limit is None:
        return ""
    how = "auto: " if not decode.get("prefill_tokens") else ""
    return f"prefill forwards {how}{f'at most {limit} new tokens' if limit else 'unlimited'}, "


def _fmt(fmt: str, value) -> str:
    return "n/a" if value is None else fmt.format(value)


def _metric_rows(columns: dict[str, dict], forced: bool = False) -> list[str]:
    """Metric table, one column per decoder. Value counts are left out when lengths were forced."""
    lines = ["| | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for label, key, fmt in ROWS:
        if key is None and forced:
            continue
        if key is None:
            cells = [f"{s['null_values']} / {s['truncated_values']} / {s['parse_errors']}" for s in columns.values()]
        else:
            cells = [_fmt(fmt, s.get(key)) for s in columns.values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _adapters(model: dict) -> str:
    """The model line's LoRA part: one adapter for both decoders, or each decoder's own."""
    hpd, baseline = model.get("adapter"), model.get("baseline_adapter")
    if hpd == baseline:
        return f"; LoRA adapter `{hpd}` merged, for both decoders" if hpd else ""
    own = f"HPD with LoRA adapter `{hpd}`" if hpd else "HPD without an adapter"
    return (
        f"; {own}, the baseline with `{baseline}`: the base loaded twice, each copy with its adapter "
        "merged (same architecture and compute per token, so the comparison stays fair)"
    )


def _header(report: dict, title: str) -> list[str]:
    machine, model = report["machine"], report["model"]
    hardware = machine.get("gpu") or f"CPU only: {machine['cpu']}, {machine['cpu_count']} cores"
    load = machine.get("load_average_start")
    lines = [
        f"# {title}",
        "",
        f"- command: `{report['command'] or 'hpd bench (see args in the JSON)'}`",
        f"- machine: {hardware}; torch {machine['torch']} ({machine['torch_threads']} threads), transformers {machine['transformers']}"
        + (f"; load average at start {load[0]:.2f}" if load else ""),
        f"- model: {model['name']} ({model['architecture']}, {model['parameters'] / 1e6:.1f}M parameters"
        f"{', random weights' if model['random_weights'] else ''}), {model['dtype']} on {model['device']}, attention {model['attention']}"
        + _adapters(model),
        f"- decoding: K_max {report['decode']['max_value_tokens']}, batch token budget {_budget(report['decode'])}, "
        f"max batch size {_batch(report)} (rows, refilled as prompts finish), "
        f"{_prefill(report['decode'])}"
        f"steps {report['decode'].get('step_shape', 'auto')}"
        f"{_graphs(report)}"
        f"{_compiled(report)}"
        ", shared prefixes "
        f"{'on' if report['decode'].get('prefix_cache', 1) else 'off'} (each timed run prefills its own); timing: {report['timing']['warmup_requests']} warm-up request(s), "
        f"{report['timing']['repeats']} repeat(s), median",
    ]
    w = report["workload"]
    if w["kind"] == "synthetic":
        spec = w["spec"]
        lines.append(
            f"- workload: synthetic, {w['products']} products of ~{spec['product_tokens']} tokens, "
            f"{spec['attributes_per_product']} attributes, value lengths {spec['value_length_dist']} in 1..{spec['value_tokens_max']} "
            f"(mean {w['value_tokens_mean']:.1f} tokens); lengths fixed for both decoders (HPD teacher-forced, "
            f"baseline exactly {w['answer_tokens_mean_per_product']:.1f} answer tokens per product)"
        )
    else:
        lines.append(
            f"- workload: records `{w['records']}` ({w['products']} products: "
            + (f"first {w['per_category']} of each category, " if w.get("per_category") else "first in file order, ")
            + f"{w['categories']} categories, {w['slots']} slots), greedy; "
            + (
                f"HPD decodes for real, the baseline generates exactly the answer with HPD's value lengths "
                f"({w['answer_tokens_mean_per_product']:.1f} tokens per product)"
                if w.get("baseline_lengths")
                else "real decoding with real stopping for both"
            )
        )
    return lines


def bench_markdown(report: dict) -> str:
    J = report["workload"].get("docs_per_prompt") or report["workload"].get("spec", {}).get("docs_per_prompt")
    base_J = report.get("baseline_docs_per_prompt", J)
    lines = _header(report, f"hpd bench: baseline (AR, J = {base_J}) vs HPD (J = {J})")
    lines += [
        "",
        f"**Speedup (HPD products/s over the baseline's): {report['speedup']:.2f}x** "
        f"(by process CPU time: {report['speedup_cpu_time']:.2f}x)",
        "",
    ]
    lines += _metric_rows({"baseline (AR)": report["ar"], "HPD": report["hpd"]}, report["workload"]["fixed_lengths"])
    if report.get("agreement") is not None:
        lines += ["", f"Values identical between the two decoders: {100 * report['agreement']:.1f}% of slots."]
    lines += [
        "",
        f"Per-product floor: the matmul speed measured in this run, {report['floor']['matmul_flops_per_s'] / 1e12:.3f} "
        f"TFLOP/s, / (2 x {report['model']['body_matmul_parameters'] / 1e6:.1f}M body parameters x "
        f"{report['floor']['tokens_per_product']:.1f} "
        f"floor tokens per product: its own text and attribute keys, {report['floor']['input_tokens_per_product']:.1f}, "
        f"and its generated values, {report['floor']['value_tokens_per_product']:.1f}) = "
        f"{report['floor']['limit_products_per_s']:.2f} products/s: **AR reached {100 * report['floor']['ar']['fraction']:.1f}%, "
        f"HPD {100 * report['floor']['hpd']['fraction']:.1f}%**.",
        "",
        "Both decoders ran in one process on the same model and inputs, timed the same way; "
        "other load on the machine affects both, so the ratio is the figure to read.",
        "",
    ]
    return "\n".join(lines)


def sweep_markdown(report: dict) -> str:
    lines = _header(report, "hpd bench sweep: HPD speedup over the baseline")
    best_b = report["baseline_best_batch"]
    lines += ["", "Baseline (AR, J = 1) per batch size:", "", "| batch size | products/s |", "|---|---|"]
    lines += [f"| {b} | {s['products_per_s']:.3f} |" for b, s in report["baseline"].items()]
    lines += [
        "",
        f"HPD speedup over the best baseline (batch size {best_b}); in brackets over the baseline at the same batch size:",
        "",
    ]
    batches = sorted({g["batch_size"] for g in report["grid"]})
    docs = sorted({g["docs_per_prompt"] for g in report["grid"]})
    cell = {(g["docs_per_prompt"], g["batch_size"]): g for g in report["grid"]}
    lines += ["| J \\ batch size | " + " | ".join(str(b) for b in batches) + " |", "|---" * (len(batches) + 1) + "|"]
    for J in docs:
        row = [f"{cell[J, b]['speedup']:.2f}x ({cell[J, b]['speedup_same_batch']:.2f}x)" for b in batches]
        lines.append(f"| {J} | " + " | ".join(row) + " |")
    if "floor" in report:  # sweeps from before the floor was added have none
        floor = report["floor"]
        lines += [
            "",
            f"Share of the per-product floor (matmul {floor['matmul_flops_per_s'] / 1e12:.3f} TFLOP/s measured after the "
            "runs, 2 x body parameters x each product's own text, attribute keys and values): HPD per cell; the "
            "baseline per batch size: "
            + ", ".join(f"{b}: {f:.1%}" for b, f in report["baseline_floor_fraction"].items()),
            "",
            "| J \\ batch size | " + " | ".join(str(b) for b in batches) + " |",
            "|---" * (len(batches) + 1) + "|",
        ]
        for J in docs:
            lines.append(f"| {J} | " + " | ".join(f"{cell[J, b]['floor_fraction']:.1%}" for b in batches) + " |")
    lines.append("")
    return "\n".join(lines)


def plot_sweep(report: dict, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for b in sorted({g["batch_size"] for g in report["grid"]}):
        points = sorted((g["docs_per_prompt"], g["speedup"]) for g in report["grid"] if g["batch_size"] == b)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"HPD, batch size {b}")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="baseline (AR, best batch size)")
    ax.set_xlabel("documents per prompt (J)")
    ax.set_ylabel("throughput relative to AR (products/s)")
    model, machine = report["model"], report["machine"]
    ax.set_title(f"{model['name']} {model['dtype']}, {machine.get('gpu') or 'CPU'}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _batch(report: dict) -> str:
    """The most rows per batch: the configured one, or a sweep's batch sizes (its columns)."""
    if "grid" in report:
        return "per column (the sweep's batch sizes)"
    return str(report["decode"]["max_batch_size"])


def _compiled(report: dict) -> str:
    """The decoding line's ", layers' MLPs, norms and rotary embeddings compiled" where
    ``compile_layers`` compiled them (hpd_core/compiled.py), or "" (eager, or a report from before
    the option). Reports before the ``compiled`` entry were written when "auto" compiled on CUDA only."""
    model = report.get("model", {})
    mode, device, body = report["decode"].get("compile_layers"), str(model.get("device", "")), model.get("body_matmul_parameters", 0)
    compiled = report["decode"].get("compiled", mode is not None and DecodeConfig(compile_layers=mode).compiles(device, body))
    if not compiled:
        return ""
    return ", layers' element-wise work compiled" if device == "cpu" else ", layers' MLPs, norms and rotary embeddings compiled"


def _graphs(report: dict) -> str:
    """The decoding line's " (CUDA graphs: N captured, M failed)", summed over the report's decoder
    results (single run: "ar" and "hpd"; sweep: every baseline batch size and grid cell), or ""
    where none was recorded (a CPU, graphs off, sampling, --spans, a report from before the counts)."""
    results = [report.get("ar"), report.get("hpd"), *(report.get("baseline") or {}).values()]
    results += [g.get("hpd") for g in report.get("grid", [])]
    captured = failed = 0
    for result in results:
        if isinstance(result, dict) and isinstance(result.get("cuda_graphs"), str):
            done, _, lost = result["cuda_graphs"].partition(" / ")
            captured, failed = captured + int(done), failed + int(lost or 0)
    return f" (CUDA graphs: {captured} captured, {failed} failed)" if captured or failed else ""
