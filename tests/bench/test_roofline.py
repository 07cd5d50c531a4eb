"""scripts/roofline.py: the weights it counts are the model's linear layers, and its time bound is
the larger of compute and memory time, step by step."""

from __future__ import annotations


import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from bench.model import RANDOM_ARCHS
from tests.scripts import load_script

roofline = load_script("roofline")


def test_counted_weights_are_the_linear_layers_of_the_architecture():
    config = {k: v for k, v in RANDOM_ARCHS["tiny"].items() if k != "model_type"}
    model = Qwen3ForCausalLM(Qwen3Config(**dict(config, vocab_size=300)))
    linear = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    arch = roofline.Arch.named("tiny", vocab=300)
    assert arch.body == linear
    assert arch.head == model.lm_head.weight.numel()
    k = model.model.layers[0].self_attn.k_proj.weight
    assert arch.kv_bytes_per_token == len(model.model.layers) * 2 * k.shape[0] * 2  # K and V, bf16


def test_a_step_costs_the_larger_of_compute_and_memory_time():
    arch = roofline.Arch.named("qwen3-8b")
    dev = roofline.Device(flops=1e15, bandwidth=4e12)
    weights_time = 2 * (arch.body + arch.head) / dev.bandwidth
    # one token, no cache: reading the weights dominates
    assert roofline.step_seconds(arch, dev, tokens=1, context=0, rows_context=0) == pytest.approx(weights_time)
    # many tokens: the matrix products dominate
    many = roofline.step_seconds(arch, dev, tokens=10_000, context=0, rows_context=0)
    assert many == pytest.approx(10_000 * 2 * (arch.body + arch.head) / dev.flops)
    # reading a cache adds memory time
    cached = roofline.step_seconds(arch, dev, tokens=1, context=1000, rows_context=64_000)
    assert cached == pytest.approx(weights_time + 64_000 * arch.kv_bytes_per_token / dev.bandwidth)


def test_hpd_needs_one_step_per_value_token_and_the_baseline_one_per_answer_token():
    arch = roofline.Arch.named("qwen3-8b")
    dev = roofline.Device(flops=1e15, bandwidth=4e12)
    one = roofline.hpd_bound(arch, dev, prompts=1, prompt_len=10, slots_per_prompt=1, value_max=1)
    two = roofline.hpd_bound(arch, dev, prompts=1, prompt_len=10, slots_per_prompt=1, value_max=2)
    step = 2 * (arch.body + arch.head) / dev.bandwidth  # memory-bound at one token
    assert two - one == pytest.approx(step, rel=0.01)
    short = roofline.baseline_bound(arch, dev, products=1, prompt_len=10, answer_len=5, steps=5)
    long = roofline.baseline_bound(arch, dev, products=1, prompt_len=10, answer_len=10, steps=10)
    assert long - short == pytest.approx(5 * step, rel=0.01)
