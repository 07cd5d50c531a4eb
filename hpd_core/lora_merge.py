"""A plain LoRA adapter merged into its base model's linear layers without peft.

Loading an adapter through peft (``PeftModel.from_pretrained`` then ``merge_and_unload``) imports
peft, wraps every target layer and merges them back: about 10 s of each actor's start on the 2-core
CPU for the default model's adapter, for what is, per layer, ``W += (B @ A) * lora_alpha / r``.
``merge_plain_lora`` does exactly that, with peft's arithmetic (B and A in float32, their product
scaled, added in place to the weight in its own dtype; tests/hpd_core/test_lora_merge.py: the
same weights bit for bit as peft's merge), for the adapters ``hpd finetune`` writes: plain LoRA on
linear layers. Anything else (DoRA, rsLoRA, per-module ranks or alphas, biases, modules to save,
embeddings, an unknown option switched on) is left to peft: the function then changes nothing and
returns False.
"""

from __future__ import annotations

import json
from pathlib import Path

# adapter_config.json entries a plain LoRA may hold with any value: what the merge reads (r,
# lora_alpha, target_modules), bookkeeping, training-only settings, and settings of variants that
# are off unless their own switch (also checked) is on
IGNORED = {
    "r", "lora_alpha", "target_modules", "peft_type", "task_type", "base_model_name_or_path", "revision",
    "peft_version", "inference_mode", "lora_dropout", "init_lora_weights", "megatron_core", "qalora_group_size",
    "auto_mapping", "bias", "fan_in_fan_out",
}  # fmt: skip
REQUIRED = {"peft_type": "LORA", "bias": "none", "fan_in_fan_out": False}
PREFIX = "base_model.model."


def plain_lora(adapter_dir: str | Path) -> dict | None:
    """The adapter's config if it is a plain LoRA this module merges exactly, else None."""
    path = Path(adapter_dir)
    try:
        config = json.loads((path / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return None
    if not (path / "adapter_model.safetensors").is_file():
        return None
    if any(config.get(key, value) != value for key, value in REQUIRED.items()):
        return None
    if not isinstance(config.get("r"), int) or config["r"] < 1 or not isinstance(config.get("lora_alpha"), (int, float)):
        return None
    # every other entry off: False, None, empty (an option of a newer peft included)
    if any(value for key, value in config.items() if key not in IGNORED):
        return None
    return config


def merge_plain_lora(model, adapter_dir: str | Path) -> bool:
    """Merge the adapter into ``model`` in place and return True, or return False (nothing changed)
    when it is not a plain LoRA over the model's linear layers (use peft then)."""
    import torch
    from safetensors.torch import load_file

    config = plain_lora(adapter_dir)
    if config is None:
        return False
    tensors = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        for part in ("lora_A", "lora_B"):
            suffix = f".{part}.weight"
            if key.startswith(PREFIX) and key.endswith(suffix):
                pairs.setdefault(key[len(PREFIX) : -len(suffix)], {})[part] = tensor
                break
        else:
            return False  # a tensor that is not a LoRA factor (a bias, a saved module, an embedding)
    r = config["r"]
    layers = []
    for name, factors in sorted(pairs.items()):
        try:
            layer = model.get_submodule(name)
        except AttributeError:
            return False
        A, B = factors.get("lora_A"), factors.get("lora_B")
        if (not isinstance(layer, torch.nn.Linear) or A is None or B is None
                or tuple(A.shape) != (r, layer.in_features) or tuple(B.shape) != (layer.out_features, r)):  # fmt: skip
            return False
        layers.append((layer, A, B))
    if not layers:
        return False
    scaling = config["lora_alpha"] / r
    with torch.no_grad():
        for layer, A, B in layers:  # as peft's Linear.merge: float32 factors, the product scaled, added in place
            layer.weight.data += (B.to(torch.float32) @ A.to(torch.float32)) * scaling
    return True
