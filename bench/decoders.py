"""`hpd bench` decoders: the baseline and HPD (with teacher forcing at full cost), and one call
that decodes a workload with either."""

from __future__ import annotations

from hpd_core.config import DecodeConfig
from bench.workload import Workload


def model_label(name: str, adapter: str | None) -> str:
    """The model a decoder runs on, as ``load_decoder`` names it."""
    return f"{name}+{adapter}" if adapter else name


def make_decoders(models: dict, tokenizer, decode_cfg: DecodeConfig, model_info: dict) -> dict:
    """{"ar": baseline, "hpd": forced-capable HPD}, each on its own entry of ``models``."""
    from hpd_core.decoders import make_decoder

    ar_label = model_label(model_info["name"], model_info.get("baseline_adapter"))
    hpd_label = model_label(model_info["name"], model_info.get("adapter"))
    return {
        "ar": make_decoder("ar", models["ar"], tokenizer, decode_cfg, ar_label),
        "hpd": forced_hpd_class()(models["hpd"], tokenizer, decode_cfg, hpd_label),
    }


def forced_hpd_class():
    """HPDDecoder plus ``decode_forced``: teacher forcing at the cost of free decoding.

    The engine's own forcing (``decode_batch(forced=...)``) is a test tool that records every
    step's full logits (slots x K x vocab floats); here nothing is recorded and a token is still
    selected from the logits (then replaced by the forced one), so a forced step does exactly the
    work of a free-running one.
    """
    import torch

    from hpd_core.batching import run_split_on_oom
    from hpd_core.engine import HPDDecoder, error_result
    from hpd_core.sampling import select

    class ForcedHPDDecoder(HPDDecoder):
        def _policy(self, forced, slot_valid, generator):
            if forced is None:
                return super()._policy(forced, slot_valid, generator)
            S, K = slot_valid.shape[1], self.config.max_value_tokens
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
            results = [None] * len(requests)

            def run(indices):
                picked = ([requests[i] for i in indices], [layouts[i] for i in indices])
                return list(zip(indices, self.decode_batch(*picked, None, [forced[i] for i in indices])))

            def fail(i, reason):
                return i, error_result(requests[i], self.name, reason, len(layouts[i].input_ids))

            for batch in self.batch_plan(layouts):
                for i, result in run_split_on_oom(batch, run, fail):
                    results[i] = result
            return results

    return ForcedHPDDecoder


def decode(name: str, decoder, workload: Workload) -> list:
    """Decode a workload: the baseline with its exact token counts (if fixed), HPD forced (if fixed)."""
    requests = list(workload.requests)
    if name == "ar":
        exact = None if workload.exact_new_tokens is None else list(workload.exact_new_tokens)
        return decoder.decode(requests, exact_new_tokens=exact)
    if workload.forced is not None:
        return decoder.decode_forced(requests, [[list(s) for s in slots] for slots in workload.forced])
    return decoder.decode(requests)
