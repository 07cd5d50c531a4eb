"""scripts/compile_ab.py: the pieces it compiles are each layer's MLP and RMS norms (the query and
key norms included), attention is left alone, and switching back restores the eager forwards."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from bench.model import RANDOM_ARCHS

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compile_ab.py"
spec = importlib.util.spec_from_file_location("compile_ab", SCRIPT)
compile_ab = sys.modules["compile_ab"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compile_ab)


def test_the_pieces_are_mlps_and_norms_and_switch_back():
    config = {k: v for k, v in RANDOM_ARCHS["tiny"].items() if k != "model_type"}
    model = Qwen3ForCausalLM(Qwen3Config(**dict(config, vocab_size=300)))
    pieces = compile_ab.Pieces(model)
    layer = model.model.layers[0]
    expected = {layer.mlp, layer.input_layernorm, layer.post_attention_layernorm, layer.self_attn.q_norm,
                layer.self_attn.k_norm}  # fmt: skip
    assert expected <= set(pieces.modules)
    assert len(pieces.modules) == len(expected) * len(model.model.layers)
    assert not any(isinstance(m, torch.nn.Linear) or m is layer.self_attn for m in pieces.modules)
    x = torch.randn(1, 3, model.config.hidden_size)
    before = layer.mlp(x)
    pieces.use(True)
    assert layer.mlp.forward is not pieces.eager[0]
    pieces.use(False)
    assert all(m.forward == f for m, f in zip(pieces.modules, pieces.eager))
    assert torch.equal(layer.mlp(x), before)
