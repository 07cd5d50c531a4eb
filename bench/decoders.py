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
    """HPDDecoder plus ``decode_forced``: teacher forcing at the cost of free decoding (the engine
    still selects a token from every step's logits, then feeds the forced one; nothing recorded)."""
    from hpd_core.engine import HPDDecoder

    class ForcedHPDDecoder(HPDDecoder):
        def decode_forced(self, requests, forced) -> list:
            return self.decode(requests, forced=forced)

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
