"""`hpd bench --sweep-docs ... --sweep-batch ...`: HPD at every (J, batch size) against the
baseline at J = 1 and every batch size (the shape of the paper's figure 5)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from bench.compare import compare, floor
from bench.measure import PassCounter, TimingConfig
from bench.report import write_json
from bench.workload import Workload


def run_sweep(
    docs: list[int],
    batch_sizes: list[int],
    workloads: dict[int, Workload],
    decoders_at: Callable[[int], dict],
    device: str,
    counters: dict[str, PassCounter],
    timing: TimingConfig,
    report: dict,
    out: Path,
    input_tokens: Callable[[Workload], float],
    matmul_flops: Callable[[], float],
) -> dict:
    """Time the grid, write sweep.json, sweep.md and sweep.png, return the stdout summary.
    ``workloads[J]`` holds every J in ``docs`` and 1; ``decoders_at(B)`` gives decoders with at
    most B prompts per batch. The headline speedup of a cell is over the best baseline (the
    paper's AR uses its best batch). Every cell and baseline also gets its share of the
    per-product floor (``compare.floor``: ``input_tokens`` of a workload's products, the first
    HPD cell's value tokens per product, the same at every J on a synthetic workload's forced
    lengths, and ``matmul_flops`` measured after the timed runs)."""
    from bench.plot import plot_sweep, sweep_markdown

    baseline, cells = {}, {}
    first = True
    for B in batch_sizes:
        decoders = decoders_at(B)
        baseline[B] = compare(decoders, {"ar": workloads[1]}, device, counters, timing, warm=first)["ar"]
        for J in docs:
            cells[(J, B)] = compare(decoders, {"hpd": workloads[J]}, device, counters, timing, warm=first)["hpd"]
            first = False
    best_b = max(baseline, key=lambda b: baseline[b]["products_per_s"])
    best_ar = baseline[best_b]["products_per_s"]
    flops = matmul_flops()
    first_cell = next(iter(cells.values()))
    values = first_cell["generated_tokens"] / first_cell["products"]  # HPD's value tokens per product

    def floor_fraction(summary: dict, workload: Workload) -> float:
        return floor(flops, report["model"], input_tokens(workload), values, {"run": summary})["run"]["fraction"]

    grid = [
        {
            "docs_per_prompt": J,
            "batch_size": B,
            "hpd_products_per_s": cell["products_per_s"],
            "speedup": cell["products_per_s"] / best_ar,
            "speedup_same_batch": cell["products_per_s"] / baseline[B]["products_per_s"],
            "floor_fraction": floor_fraction(cell, workloads[J]),
            "hpd": cell,
        }
        for (J, B), cell in cells.items()
    ]
    report.update(
        workload={"kind": workloads[1].kind, "fixed_lengths": workloads[1].fixed_lengths, **workloads[1].info},
        baseline={str(b): s for b, s in baseline.items()},
        baseline_floor_fraction={str(b): floor_fraction(s, workloads[1]) for b, s in baseline.items()},
        baseline_best_batch=best_b,
        floor={"matmul_flops_per_s": flops, "value_tokens_per_product": values},
        grid=grid,
    )
    write_json(out / "sweep.json", report)
    (out / "sweep.md").write_text(sweep_markdown(report))
    plot_sweep(report, out / "sweep.png")
    print(f"wrote {out / 'sweep.json'}, {out / 'sweep.md'} and {out / 'sweep.png'}", file=sys.stderr)
    top = max(grid, key=lambda g: g["hpd_products_per_s"])
    return {
        "ar": {"products_per_s": best_ar, "batch_size": best_b},
        "hpd": {"products_per_s": top["hpd_products_per_s"], "docs_per_prompt": top["docs_per_prompt"], "batch_size": top["batch_size"]},
        "speedup": top["speedup"],
        "floor_fraction": {"ar": report["baseline_floor_fraction"][str(best_b)], "hpd": top["floor_fraction"]},
    }
