"""hpd_core.lora_merge against peft's own merge (the obviously correct one): the same weights, bit
for bit, for a plain LoRA; anything else is left to peft."""

from __future__ import annotations

import json

import pytest
import torch

from hpd_core.lora_merge import merge_plain_lora, plain_lora


@pytest.fixture
def base_dir(tmp_path, models):
    path = tmp_path / "base"
    models["llama"].save_pretrained(path)
    return path


def make_adapter(base_dir, out, dtype=torch.float32, **lora):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir)
    config = LoraConfig(**{"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"],
                           "init_lora_weights": False, **lora})  # fmt: skip
    model = get_peft_model(base, config)
    model.save_pretrained(out)
    if dtype != torch.float32:  # as the shipped adapters: factors stored in 16 bits
        from safetensors.torch import load_file, save_file

        file = out / "adapter_model.safetensors"
        save_file({k: v.to(dtype) for k, v in load_file(str(file)).items()}, str(file))
    return out


def peft_merged(base_dir, adapter, dtype):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir, dtype=dtype), adapter).merge_and_unload()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("stored", [torch.float32, torch.float16])
def test_a_plain_lora_merges_as_peft_merges_it_bit_for_bit(base_dir, tmp_path, dtype, stored):
    from transformers import AutoModelForCausalLM

    adapter = make_adapter(base_dir, tmp_path / "adapter", stored)
    ours = AutoModelForCausalLM.from_pretrained(base_dir, dtype=dtype)
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    assert merge_plain_lora(ours, adapter)
    theirs = peft_merged(base_dir, adapter, dtype)
    mine, expected = ours.state_dict(), theirs.state_dict()
    assert mine.keys() == expected.keys()
    for key in mine:
        assert mine[key].dtype == expected[key].dtype == before[key].dtype
        assert torch.equal(mine[key], expected[key]), key
    changed = [k for k in mine if not torch.equal(mine[k], before[k])]
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight", "down_proj.weight")) for k in changed)


@pytest.mark.parametrize("lora", [{"use_dora": True}, {"use_rslora": True}, {"rank_pattern": {"q_proj": 2}},
                                  {"bias": "lora_only"}, {"modules_to_save": ["lm_head"]},
                                  {"target_modules": ["q_proj", "embed_tokens"]}])
def test_anything_but_a_plain_lora_is_left_to_peft(base_dir, tmp_path, lora):
    from transformers import AutoModelForCausalLM

    adapter = make_adapter(base_dir, tmp_path / "adapter", **lora)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert not merge_plain_lora(model, adapter)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # nothing changed


def test_an_unknown_option_switched_on_is_left_to_peft(base_dir, tmp_path):
    adapter = make_adapter(base_dir, tmp_path / "adapter")
    assert plain_lora(adapter) is not None
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "some_future_variant": {"on": True}}))
    assert plain_lora(adapter) is None
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "some_future_variant": None}))
    assert plain_lora(adapter) is not None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["default", "smollm2-135m-hpd"])
def test_the_shipped_adapters_merge_as_peft_merges_them(name):
    """Each shipped adapter on its real base model in bf16 (as `--dtype auto` loads it here): the same
    weights as peft's merge."""
    from transformers import AutoModelForCausalLM

    from hpd_core.config import ModelConfig
    from hpd_core.models import resolve_adapter, resolve_model_dir

    config = ModelConfig(name=name)
    base, adapter = resolve_model_dir(config), resolve_adapter(config)
    ours = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    assert merge_plain_lora(ours, adapter)
    theirs = peft_merged(base, adapter, torch.bfloat16)
    expected = theirs.state_dict()
    for key, value in ours.state_dict().items():
        assert torch.equal(value, expected[key]), key
