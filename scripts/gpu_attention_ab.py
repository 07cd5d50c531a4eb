"""Packed HPD step attention on a GPU: the engine's masked call against a split one, timed side by side.

In a packed HPD step every value query of a row may see the row's whole prompt text (present,
generation 0, positions below every value's): only the entries after it (the skeleton and the values
written so far) need the rule's mask. The engine's call (``attention.grouped_sdpa``: the query
heads of a K/V head folded into the query axis, the mask folded with them) runs the
memory-efficient kernel over every entry with the mask. The split call runs the prompt part
through the flash kernel with no mask (the same folded queries, equal head counts) and the rest
through the memory-efficient kernel with its slice of the mask, each returning its log-sum-exp, and
merges the two softmax halves exactly: out = (e^(l1 - m) o1 + e^(l2 - m) o2) / (e^(l1 - m) +
e^(l2 - m)), m = max(l1, l2). Session 34's profile of HPD at 512 long products (Qwen3-8B's shape)
put the masked memory-efficient kernel at 2.81 s of the operators' GPU time; this script says
whether the split is worth building into the engine.

Usage: python scripts/gpu_attention_ab.py [--rows 128 --queries 48 --prompt 2400 --rest 400 ...]
It prints each variant's median milliseconds over --repeats calls (CUDA events) and the largest
difference from the engine's output. On a CPU (``--device cpu``) it checks the merge only, with
PyTorch's CPU flash kernel (which takes a mask) for both parts, at small default shapes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpd_core.attention import fold_mask, grouped_sdpa, merge  # noqa: E402


def rest_mask(mask: torch.Tensor, prompt: int, groups: int) -> torch.Tensor:
    """The mask's entries after the prompt, folded (once per forward, as the runner folds the
    engine's), its rows 16-entry aligned as the memory-efficient kernel wants them."""
    rest = fold_mask(mask[..., prompt:], groups)
    pad = -rest.shape[-1] % 16
    return torch.nn.functional.pad(rest, (0, pad), value=torch.finfo(rest.dtype).min)[..., : rest.shape[-1]]


def split_attention(query, key, value, rest: torch.Tensor, prompt: int, scale: float) -> torch.Tensor:
    """The folded queries over entries [0, prompt) without a mask and over the rest with ``rest``."""
    rows, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    folded = query.reshape(rows, kv_heads, groups * queries, dim)
    k1, v1, k2, v2 = key[:, :, :prompt], value[:, :, :prompt], key[:, :, prompt:], value[:, :, prompt:]
    if query.is_cuda:
        o1, l1, *_ = torch.ops.aten._scaled_dot_product_flash_attention(folded, k1, v1, 0.0, False, False, scale=scale)
        o2, l2, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(
            folded, k2, v2, rest.expand(rows, kv_heads, -1, -1), True, 0.0, False, scale=scale
        )
        l2 = l2[..., : folded.shape[2]]  # padded to a multiple of 32 queries
    else:
        o1, l1 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(folded, k1, v1, 0.0, False, scale=scale)
        o2, l2 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            folded, k2, v2, 0.0, False, attn_mask=rest, scale=scale
        )
    return merge(o1, l1, o2, l2).view(rows, kv_heads, groups, queries, -1)


def inputs(args, device):
    g = torch.Generator(device="cpu").manual_seed(0)
    dtype = getattr(torch, args.dtype)
    entries = args.prompt + args.rest
    shape = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    query = shape(args.rows, args.heads, args.queries, args.dim)
    key, value = shape(args.rows, args.kv_heads, entries, args.dim), shape(args.rows, args.kv_heads, entries, args.dim)
    allowed = torch.ones(args.rows, 1, args.queries, entries, dtype=torch.bool)
    allowed[..., args.prompt :] = torch.rand(args.rows, 1, args.queries, args.rest, generator=g) < args.density
    allowed[..., args.prompt] = True  # every query sees at least one entry of the rest (its own)
    mask = torch.where(allowed, 0.0, torch.finfo(dtype).min).to(device=device, dtype=dtype)
    return query, key, value, mask


def timed(fn, repeats: int, device) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rows", type=int)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--queries", type=int)
    p.add_argument("--prompt", type=int, help="entries every query sees (the rows' prompt text)")
    p.add_argument("--rest", type=int, help="entries under the mask (skeleton and values)")
    p.add_argument("--density", type=float, default=0.3, help="share of the rest a query may see")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--dtype", default=None)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    gpu = device.type == "cuda"  # GPU defaults: Qwen3-8B's heads, HPD's packed steps at 512 long products
    for name, on_gpu, on_cpu in (("rows", 128, 3), ("queries", 48, 8), ("prompt", 2400, 40), ("rest", 400, 24)):
        if getattr(args, name) is None:
            setattr(args, name, on_gpu if gpu else on_cpu)
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    if not gpu:
        args.heads, args.kv_heads, args.dim = min(args.heads, 4), min(args.kv_heads, 2), min(args.dim, 16)
    query, key, value, mask = inputs(args, device)
    scale = args.dim**-0.5
    groups = args.heads // args.kv_heads
    folded, rest = fold_mask(mask, groups), rest_mask(mask, args.prompt, groups)  # once per forward
    with torch.no_grad():
        engine = grouped_sdpa(query, key, value, folded, scale=scale, folded=True)
        split = split_attention(query, key, value, rest, args.prompt, scale)
        diff = (engine.float() - split.float()).abs().max().item()
        print(f"shapes: rows {args.rows}, heads {args.heads}/{args.kv_heads}, queries {args.queries}, "
              f"entries {args.prompt} + {args.rest} (mask density {args.density}), dim {args.dim}, {args.dtype}, "
              f"{torch.cuda.get_device_name(device) if gpu else 'cpu'}")  # fmt: skip
        print(f"largest |engine - split|: {diff:.3g}")
        if not gpu:
            return 0 if diff < 1e-5 else 1
        t_engine = timed(lambda: grouped_sdpa(query, key, value, folded, scale=scale, folded=True), args.repeats, device)
        t_split = timed(lambda: split_attention(query, key, value, rest, args.prompt, scale), args.repeats, device)
        t_engine2 = timed(lambda: grouped_sdpa(query, key, value, folded, scale=scale, folded=True), args.repeats, device)
        print(f"engine (masked, memory-efficient): {t_engine:.3f} ms, again {t_engine2:.3f} ms")
        print(f"split (flash on the prompt, masked rest, merged): {t_split:.3f} ms "
              f"({min(t_engine, t_engine2) / t_split:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
