"""A LoRA adapter from a fully fine-tuned model: the truncated SVD of each linear layer's change.

A full fine-tune of the body (``hpd finetune --full``) changes every weight, and the project ships
adapters of tens of MB, not bodies (Gemma 3 270M's is 200 MB in float16). For every linear
projection LoRA covers (``LORA_TARGETS``), ``W_tuned - W_base = U S V^T`` and the adapter keeps the
top ``rank`` singular directions: ``lora_B = U_r sqrt(S_r)``, ``lora_A = sqrt(S_r) V_r^T`` and
``lora_alpha = rank`` (scale 1), so ``W_base + B A`` is the best rank-r approximation of the tuned
weight (Eckart-Young). Every other changed weight (the norms) is saved whole (PEFT's
``modules_to_save``). With ``rank`` at least each change's rank the adapter gives the tuned model
exactly (tested); below it, ``kept`` says which share of the change's squared Frobenius norm is
left, and what that costs must be measured on validation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hpd_core.finetune import LORA_TARGETS


@dataclass(frozen=True)
class Extraction:
    model: object  # the PEFT model holding the adapter (``save_pretrained`` writes it)
    kept: float  # share of the linear layers' change (squared Frobenius norm) the adapter keeps
    layers: int  # linear layers approximated
    whole: tuple[str, ...]  # other modules saved whole (their weights changed)


def _low_rank(delta: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """``B (out, rank)``, ``A (rank, in)`` with ``B @ A`` the best rank-``rank`` approximation of
    ``delta`` (zero-padded past its own rank), the squared norm kept and the whole squared norm."""
    u, s, vh = torch.linalg.svd(delta.double(), full_matrices=False)
    r = min(rank, s.numel())
    root = s[:r].sqrt()
    b = torch.zeros(delta.shape[0], rank, dtype=torch.float64)
    a = torch.zeros(rank, delta.shape[1], dtype=torch.float64)
    b[:, :r] = u[:, :r] * root
    a[:r] = root[:, None] * vh[:r]
    return b, a, float((s[:r] ** 2).sum()), float((s**2).sum())


def lora_from_full(base, tuned, rank: int) -> Extraction:
    """The adapter on ``base`` (a loaded model, float32; it is wrapped in place) that approximates
    ``tuned`` (the same architecture after ``--full``) at ``rank``."""
    from peft import LoraConfig, get_peft_model

    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    base_weights = {name: p.detach() for name, p in base.named_parameters()}
    tuned_weights = {name: p.detach() for name, p in tuned.named_parameters()}
    if base_weights.keys() != tuned_weights.keys():
        missing = sorted(base_weights.keys() ^ tuned_weights.keys())[:3]
        raise ValueError(f"the tuned model's weights are not the base's (e.g. {missing}): another architecture?")
    changed = {name for name in base_weights if not torch.equal(base_weights[name], tuned_weights[name])}
    frozen = {n for n, p in base.named_parameters()
              if p is base.get_input_embeddings().weight or p is base.get_output_embeddings().weight}
    if changed & frozen:
        raise ValueError("the token embeddings changed (--train-embeddings): an adapter cannot carry them")
    linear = {name for name, module in base.named_modules() if isinstance(module, torch.nn.Linear)}
    linear -= {name.rsplit(".", 1)[0] for name in frozen}  # the LM head is never a LoRA target
    whole = sorted({name.rsplit(".", 1)[0] for name in changed} - linear)
    if any(name.endswith(".bias") and name.rsplit(".", 1)[0] in linear for name in changed):
        raise ValueError("a linear layer's bias changed: LoRA carries weights only")

    config = LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=LORA_TARGETS,
                        modules_to_save=whole or None, task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    kept = total = 0.0
    layers = 0
    for name, module in model.named_modules():
        if not hasattr(module, "lora_A") or "default" not in module.lora_A:
            continue
        plain = name.removeprefix("base_model.model.")
        delta = tuned_weights[plain + ".weight"].double() - base_weights[plain + ".weight"].double()
        b, a, k, t = _low_rank(delta, rank)
        module.lora_B["default"].weight.data.copy_(b)
        module.lora_A["default"].weight.data.copy_(a)
        kept, total, layers = kept + k, total + t, layers + 1
    tuned_modules = dict(tuned.named_modules())
    for name, module in model.named_modules():
        if hasattr(module, "modules_to_save") and "default" in module.modules_to_save:
            plain = name.removeprefix("base_model.model.")
            module.modules_to_save["default"].load_state_dict(tuned_modules[plain].state_dict())
    return Extraction(model, kept / total if total else 1.0, layers, tuple(whole))
