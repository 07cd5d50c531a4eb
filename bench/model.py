"""`hpd bench` models: a real model (with optional LoRA adapters) or random weights of a published
architecture, and the facts about it that the report records.

Both decoders share one model, unless the baseline has its own adapter (``--baseline-adapter``
differs from ``--adapter``): then the base is loaded twice, each copy with its adapter merged, so
the two models have the same architecture and the same compute per token.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from hpd_core.config import ModelConfig

# Published architecture hyper-parameters (config.json of each model); weights are random.
RANDOM_ARCHS: dict[str, dict] = {
    "qwen3-8b": dict(model_type="qwen3", hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, intermediate_size=12288, vocab_size=151936, head_dim=128,
                     rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=False),
    "qwen3-4b": dict(model_type="qwen3", hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, intermediate_size=9728, vocab_size=151936, head_dim=128,
                     rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=True),
    "qwen3-1.7b": dict(model_type="qwen3", hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, intermediate_size=6144, vocab_size=151936, head_dim=128,
                       rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=True),
    "phi-4": dict(model_type="phi3", hidden_size=5120, num_hidden_layers=40, num_attention_heads=40,
                  num_key_value_heads=10, intermediate_size=17920, vocab_size=100352, head_dim=128,
                  rope_theta=250_000.0, rms_norm_eps=1e-5, max_position_embeddings=16384, tie_word_embeddings=False),
    "smollm2-135m": dict(model_type="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, intermediate_size=1536, vocab_size=49152, head_dim=64,
                         rope_theta=100_000.0, rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=True),
    # tests and smoke runs: vocab_size None = the tokenizer's
    "tiny": dict(model_type="qwen3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, vocab_size=None, head_dim=16,
                 rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=False),
}  # fmt: skip


RANDOM_ARCH_TOKENIZER = "smollm2-135m"  # its 49k ids fit every vocabulary above (Gemma's 262k would not)


def arch_config(arch: str, tokenizer):
    """The transformers config of a published architecture (table above), with the tokenizer's ids."""
    from transformers import AutoConfig

    if arch not in RANDOM_ARCHS:
        raise ValueError(f"random arch must be one of {sorted(RANDOM_ARCHS)}, got {arch!r}")
    params = dict(RANDOM_ARCHS[arch])
    model_type = params.pop("model_type")
    params["vocab_size"] = params["vocab_size"] or len(tokenizer)
    if params["vocab_size"] < len(tokenizer):
        raise ValueError(f"{arch}: vocab {params['vocab_size']} is smaller than the tokenizer's {len(tokenizer)}")
    ids = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    return AutoConfig.for_model(model_type, **params, **ids, sliding_window=None)


def random_model(arch: str, tokenizer, model_cfg: ModelConfig, seed: int):
    """A randomly initialised model of a published architecture (config only, nothing downloaded)."""
    import torch
    from transformers import AutoModelForCausalLM

    from hpd_core.models import torch_dtype

    config = arch_config(arch, tokenizer)
    torch.manual_seed(seed)
    with torch.device(model_cfg.device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch_dtype(model_cfg.dtype), attn_implementation=model_cfg.attention
        )
    return model.eval()


def baseline_adapter(args: argparse.Namespace) -> str | None:
    """The baseline's adapter: ``--baseline-adapter``, by default HPD's ``--adapter``."""
    return args.baseline_adapter or args.adapter


def load(args: argparse.Namespace) -> tuple[dict[str, object], object, dict]:
    """({decoder name: model}, tokenizer, info) from the command line. "ar" and "hpd" map to the
    same model object unless their adapters differ."""
    import torch
    from transformers import AutoTokenizer

    from hpd_core.models import load_model, prepare_tokenizer, resolve_model_dir

    model_cfg = ModelConfig(
        name=args.model, adapter=args.adapter, dtype=args.dtype, device=args.device, attention=args.attention
    )
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {args.device} requested but CUDA is not available")
    if args.random_arch:
        source = args.tokenizer or resolve_model_dir(ModelConfig(name=RANDOM_ARCH_TOKENIZER))
        tokenizer = AutoTokenizer.from_pretrained(source)
        prepare_tokenizer(tokenizer)
        model = random_model(args.random_arch, tokenizer, model_cfg, args.seed)
        name = f"random:{args.random_arch}"
        models = {"ar": model, "hpd": model}
    else:
        if args.tokenizer:
            raise ValueError("--tokenizer is for --random-arch; a real model brings its own tokenizer")
        model, tokenizer = load_model(model_cfg)
        base_adapter = baseline_adapter(args)
        baseline = model if base_adapter == args.adapter else load_model(replace(model_cfg, adapter=base_adapter))[0]
        name = args.model
        source = resolve_model_dir(model_cfg)
        models = {"ar": baseline, "hpd": model}
    return models, tokenizer, model_info(args, model, tokenizer, name, source)


def model_info(args: argparse.Namespace, model, tokenizer, name: str, source) -> dict:
    """What the report says about the model (HPD's; the baseline's differs only in its adapter)."""
    from hpd_core.runner import body_parameters  # torch: not for `hpd --help`, which builds every command's flags

    total = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings().weight
    body = body_parameters(model)
    return {
        "name": name,
        "tokenizer": str(source),
        "architecture": type(model).__name__,
        "dtype": args.dtype,
        "device": args.device,
        "attention": args.attention + (f" (cuDNN kernels {'on' if getattr(args, 'cudnn_attention', False) else 'off'})"
                                       if args.device.startswith("cuda") and args.attention == "sdpa" else ""),
        "parameters": total,
        "body_matmul_parameters": body,  # per prompt token: everything but the embedding table and LM head
        "lm_head_parameters": head.numel(),
        "vocab_size": head.shape[0],
        "tokenizer_vocab": len(tokenizer),
        "random_weights": bool(args.random_arch),
        "adapter": applied_adapter(args, args.adapter),  # HPD's
        "baseline_adapter": applied_adapter(args, baseline_adapter(args)),
    }


def applied_adapter(args: argparse.Namespace, adapter: str | None) -> str | None:
    """The adapter actually merged (``--model default`` carries the shipped one), for the report."""
    if args.random_arch:
        return None
    from hpd_core.models import resolve_adapter

    return resolve_adapter(ModelConfig(name=args.model, adapter=adapter))
