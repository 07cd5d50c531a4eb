"""A LoRA adapter extracted from a full fine-tune: exact when its rank covers the change, saved and
loaded like any adapter, and a lower rank loses what the singular values say."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hpd_core.config import ModelConfig, TrainConfig
from hpd_core.finetune import prepare_model, save, train
from hpd_core.lora_from_full import lora_from_full
from hpd_core.models import load_model
from tests.pipelines.helpers import REPO

from .conftest import tiny_model
from .test_finetune import K_MAX, labeled_products

IDS = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


@pytest.fixture(scope="module")
def full_run(tokenizer, tmp_path_factory):
    """A tiny Gemma 3 (norms, q/k norms, sliding layers) saved, then fully fine-tuned and saved."""
    root = tmp_path_factory.mktemp("full")
    tiny_model("gemma3", len(tokenizer)).save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    products, attrs = labeled_products(4)
    config = TrainConfig(docs_per_prompt=2, max_docs_per_prompt=None, max_value_tokens=K_MAX, full=True, lr=1e-2,
                         grad_accum=1, max_steps=3)
    model = prepare_model(load_model(ModelConfig(name=str(root / "base")))[0], config)
    train(model, tokenizer, products, [], attrs, config)
    save(model, tokenizer, root / "tuned", full=True)
    return root


def test_full_rank_adapter_gives_the_tuned_model(full_run, tmp_path):
    base = load_model(ModelConfig(name=str(full_run / "base")))[0]
    tuned = load_model(ModelConfig(name=str(full_run / "tuned")))[0]
    assert (logits(tuned) - logits(base)).abs().max() > 1e-2  # the run changed the model
    extraction = lora_from_full(base, tuned, rank=32)  # the tiny layers' smaller side is 32
    assert extraction.kept == pytest.approx(1.0) and extraction.layers == 2 * 7
    assert any(name.endswith("input_layernorm") for name in extraction.whole)
    assert any(name.endswith("k_norm") for name in extraction.whole)
    extraction.model.save_pretrained(tmp_path / "adapter")
    loaded = load_model(ModelConfig(name=str(full_run / "base"), adapter=str(tmp_path / "adapter")))[0]
    torch.testing.assert_close(logits(loaded), logits(tuned), atol=2e-5, rtol=1e-4)


def test_lower_rank_keeps_the_top_singular_directions(full_run):
    base = load_model(ModelConfig(name=str(full_run / "base")))[0]
    tuned = load_model(ModelConfig(name=str(full_run / "tuned")))[0]
    q = "model.layers.0.self_attn.q_proj"
    delta = (dict(tuned.named_parameters())[q + ".weight"] - dict(base.named_parameters())[q + ".weight"]).detach()
    s = torch.linalg.svdvals(delta.double())
    extraction = lora_from_full(base, tuned, rank=2)
    assert 0 < extraction.kept < 1
    layer = dict(extraction.model.named_modules())["base_model.model." + q]
    approx = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight).double()
    error = torch.linalg.matrix_norm(delta.double() - approx) ** 2
    torch.testing.assert_close(error, (s[2:] ** 2).sum(), rtol=1e-4, atol=1e-9)  # Eckart-Young: exactly the rest


def test_embeddings_changed_are_refused(tokenizer):
    base, tuned = tiny_model("llama", len(tokenizer)), tiny_model("llama", len(tokenizer))
    with torch.no_grad():
        tuned.get_input_embeddings().weight.add_(0.1)
    with pytest.raises(ValueError, match="token embeddings changed"):
        lora_from_full(base, tuned, rank=4)


def test_script_writes_a_float16_adapter(full_run, tmp_path):
    out = tmp_path / "adapter"
    done = subprocess.run([sys.executable, "scripts/lora_from_full.py", "--base", str(full_run / "base"),
                           "--tuned", str(full_run / "tuned"), "--rank", "32", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    from safetensors.torch import load_file

    weights = load_file(out / "adapter_model.safetensors")
    assert weights and all(w.dtype == torch.float16 for w in weights.values())
    assert '"kept": 1.0' in (out / "lora_from_full.json").read_text()
    loaded = load_model(ModelConfig(name=str(full_run / "base"), adapter=str(out)))[0]
    tuned = load_model(ModelConfig(name=str(full_run / "tuned")))[0]
    torch.testing.assert_close(logits(loaded), logits(tuned), atol=2e-2, rtol=1e-2)  # float16 weights
