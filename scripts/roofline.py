"""The fastest either decoder could possibly run a workload on a device: a roofline bound.

Each forward pass costs at least the larger of its matrix-product time (FLOPs at the measured
matmul speed) and its memory time (the weights once, plus the K/V entries its tokens read, at the
device's memory bandwidth). Summed over a run's prefill and steps, that is the time no
implementation of that decoder beats on that device; the ratio of the two decoders' bounds is the
largest speedup HPD can show against a baseline that runs at its own bound.

    python scripts/roofline.py            # the two H200 workloads of benchmarks/gpu-h200-qwen3-8b-*

Counted: every linear layer (2 FLOPs per weight per token), the LM head for the tokens whose next
token is chosen, attention's two products (QK^T and PV: 4 x heads x head_dim FLOPs per token per
key, half the square for a causal prefill), weights and K/V entries in bf16. Left out (they only
add time): norms, activations, sampling, kernel launches, host work. The workload figures are the
ones `hpd bench` measured (its bench.md); docs/roofline.md walks through the result.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.model import RANDOM_ARCHS  # noqa: E402

BYTES = 2  # bf16


@dataclass(frozen=True)
class Arch:
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def named(cls, name: str, vocab: int | None = None) -> "Arch":
        """One of `hpd bench --random-arch`'s architectures (``vocab`` for one that takes its tokenizer's)."""
        a = RANDOM_ARCHS[name]
        return cls(a["num_hidden_layers"], a["hidden_size"], a["num_attention_heads"], a["num_key_value_heads"],
                   a["head_dim"], a["intermediate_size"], a["vocab_size"] or vocab)

    @property
    def body(self) -> int:  # weights of the linear layers (attention projections and MLP), all layers
        attn = self.hidden * self.head_dim * (2 * self.q_heads + 2 * self.kv_heads)
        return self.layers * (attn + 3 * self.hidden * self.intermediate)

    @property
    def head(self) -> int:
        return self.vocab * self.hidden

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * BYTES

    def attention_flops(self, queries: float, keys: float) -> float:
        return 4 * self.layers * self.q_heads * self.head_dim * queries * keys


@dataclass(frozen=True)
class Device:
    flops: float  # matmul FLOP/s, measured in the run
    bandwidth: float  # memory bytes/s


def prefill_seconds(arch: Arch, dev: Device, prompts: int, prompt_len: float, logit_tokens: float) -> float:
    tokens = prompts * prompt_len
    flops = 2 * arch.body * tokens + 2 * arch.head * logit_tokens + arch.attention_flops(prompts * prompt_len, prompt_len / 2)
    memory = BYTES * (arch.body + arch.head) + arch.kv_bytes_per_token * tokens  # weights once, K/V written
    return max(flops / dev.flops, memory / dev.bandwidth)


def step_seconds(arch: Arch, dev: Device, tokens: float, context: float, rows_context: float) -> float:
    """One step: ``tokens`` new tokens, each attending to ``context`` keys; ``rows_context`` K/V entries
    read in all (every row's cache once)."""
    flops = 2 * (arch.body + arch.head) * tokens + arch.attention_flops(tokens, context)
    memory = BYTES * (arch.body + arch.head) + arch.kv_bytes_per_token * rows_context
    return max(flops / dev.flops, memory / dev.bandwidth)


def baseline_bound(arch: Arch, dev: Device, products: int, prompt_len: float, answer_len: float, steps: int) -> float:
    """J = 1, every product its own row, all rows in one batch; ``steps`` decode steps (the longest
    answer), the rows' answers ``answer_len`` tokens on average (a row leaves when it is done)."""
    total = prefill_seconds(arch, dev, products, prompt_len, products)
    shortest = 2 * answer_len - steps  # answer lengths taken as uniform in shortest..steps
    for k in range(steps):
        rows = products * (1.0 if k < shortest else (steps - k) / (steps - shortest))
        context = prompt_len + k
        total += step_seconds(arch, dev, rows, context, rows * context)
    return total


def hpd_bound(arch: Arch, dev: Device, prompts: int, prompt_len: float, slots_per_prompt: int, value_max: int) -> float:
    """HPD: ``prompts`` prompts of ``prompt_len`` tokens, one prefill; value lengths uniform in
    1..value_max, so at step k (1-based) a slot is still open with probability (value_max - k + 1) / value_max."""
    slots = prompts * slots_per_prompt
    total = prefill_seconds(arch, dev, prompts, prompt_len, slots)
    written = 0.0  # value tokens per prompt in the cache so far
    for k in range(1, value_max + 1):
        open_share = (value_max - k + 1) / value_max
        tokens = slots * open_share
        context = prompt_len + written
        total += step_seconds(arch, dev, tokens, context, prompts * context)
        written += slots_per_prompt * open_share
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bandwidth-tbs", type=float, default=4.3, help="memory bandwidth (H200: a copy moved 4.3 TB/s)")
    args = p.parse_args(argv)
    arch = Arch.named("qwen3-8b")  # the architecture the workload figures below were measured on
    print(f"qwen3-8b: body {arch.body / 1e9:.3f}B, LM head {arch.head / 1e9:.3f}B weights; "
          f"memory {args.bandwidth_tbs} TB/s; matmul speed as measured in each run")
    # (name, matmul TFLOP/s measured in the run, products, baseline prompt tokens per product, answer
    #  tokens per product, baseline steps (forward passes - 1), HPD J, HPD prompt tokens per product,
    #  attributes, longest value, measured products/s of the baseline and HPD): from the bench.md files
    workloads = [
        ("long (gpu-h200-qwen3-8b-long-budget)", 677.1, 64, 749.9, 330.9, 408, 4, 659.6, 16, 30, 4.203, 18.201),
        ("titles (gpu-h200-qwen3-8b-titles)", 667.9, 64, 230.9, 85.4, 104, 6, 121.0, 8, 10, 19.600, 83.552),
        # session 28, CUDA graphs; at 512 products the long baseline ran in waves (10 prefills), so its
        # steps are the longest answer estimated (mean 331.9 + 3 standard deviations of a sum of 16
        # values uniform in 1..30: 436), where the 64-product runs measured it
        ("long, graphs (gpu-h200-s28-qwen3-8b-long-graphs)", 655.3, 64, 749.9, 330.9, 408, 4, 659.6, 16, 30, 7.672, 19.609),
        ("titles, graphs (gpu-h200-s28-qwen3-8b-titles-graphs)", 664.2, 64, 230.9, 85.4, 104, 6, 121.0, 8, 10, 35.613, 81.452),
        ("long, 512 products (gpu-h200-s28-qwen3-8b-long-512)", 663.6, 512, 749.9, 331.9, 436, 4, 659.7, 16, 30, 12.764, 14.647),
        ("titles, 512 products (gpu-h200-s28-qwen3-8b-titles-512)", 660.8, 512, 230.9, 85.3, 108, 6, 120.1, 8, 10, 83.707, 111.483),
    ]
    print("| workload | baseline bound (products/s) | HPD bound | bound on the speedup | measured: baseline, HPD "
          "(share of their bound) | measured speedup |")
    print("|---|---:|---:|---:|---|---:|")
    for name, tflops, n, ar_prompt, answer, ar_steps, j, hpd_prompt, attrs, vmax, ar_meas, hpd_meas in workloads:
        dev = Device(tflops * 1e12, args.bandwidth_tbs * 1e12)
        ar = n / baseline_bound(arch, dev, n, ar_prompt, answer, ar_steps)
        prompts = -(-n // j)
        hpd = n / hpd_bound(arch, dev, prompts, hpd_prompt * n / prompts, attrs * j, vmax)
        print(f"| {name} | {ar:.1f} | {hpd:.1f} | {hpd / ar:.2f}x | {ar_meas} ({ar_meas / ar:.0%}), "
              f"{hpd_meas} ({hpd_meas / hpd:.0%}) | {hpd_meas / ar_meas:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
