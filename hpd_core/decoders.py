"""Pick a decoder by name and load its model: the engine's one entry point for the pipeline."""

from __future__ import annotations

from hpd_core.config import DECODERS, DecodeConfig, ModelConfig


def make_decoder(name: str, model, tokenizer, decode: DecodeConfig, model_name: str = ""):
    """A decoder over an already loaded model: "hpd", "ar" (baseline) or "reference" (oracle)."""
    if name == "hpd":
        from hpd_core.engine import HPDDecoder as cls
    elif name == "ar":
        from hpd_core.autoregressive import AutoregressiveDecoder as cls
    elif name == "reference":
        from hpd_core.reference import ReferenceDecoder as cls
    else:
        raise ValueError(f"decoder must be one of {DECODERS}, got {name!r}")
    return cls(model, tokenizer, decode, model_name)


def load_decoder(name: str, model: ModelConfig, decode: DecodeConfig):
    """Load the model once and return a decoder with ``.decode(requests) -> results``."""
    if name not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {name!r}")
    from hpd_core.models import load_model

    loaded, tokenizer = load_model(model)
    label = model.name if not model.adapter else f"{model.name}+{model.adapter}"
    return make_decoder(name, loaded, tokenizer, decode, model_name=label)
