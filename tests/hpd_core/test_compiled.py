"""hpd_core/compiled.py: which pieces are compiled, that they are compiled only within the engine's
forwards, that compiled decoding equals eager decoding (float32, CPU), and the fallback to eager
when compiling fails. (On CUDA, with ``compile_layers="on"``, the GPU tests of
test_session.py and test_graphs.py run compiled.)"""

from __future__ import annotations

import logging
import random

import pytest
import torch

from hpd_core.autoregressive import AutoregressiveDecoder
from hpd_core.compiled import CPU_MIN_TOKENS, CompiledLayers, gelu_tanh_mlp, gelu_tanh_product, layer_pieces, rotary_home
from hpd_core.config import DecodeConfig
from hpd_core.decoders import make_decoder
from hpd_core.reference import AutoregressiveReference, ReferenceDecoder

from .conftest import parts_at_a_tie, random_request, slots_part_at_a_tie


def test_the_pieces_are_each_layers_mlp_and_norms(models):
    model = models["qwen3"]
    body = model.get_decoder()
    pieces = layer_pieces(body)
    layer = body.layers[0]
    expected = {layer.mlp, layer.input_layernorm, layer.post_attention_layernorm, layer.self_attn.q_norm,
                layer.self_attn.k_norm}  # fmt: skip
    assert expected <= set(pieces)
    assert len(pieces) == len(expected) * len(body.layers)
    assert not any(isinstance(m, torch.nn.Linear) or m is layer.self_attn for m in pieces)
    gemma = models["gemma3"].get_decoder().layers[0]  # four norms around attention and MLP, plus q/k norms
    assert {gemma.pre_feedforward_layernorm, gemma.post_feedforward_layernorm} <= set(layer_pieces(models["gemma3"].get_decoder()))


def test_compiled_forwards_only_within_active(models):
    body = models["llama"].get_decoder()
    compiled = CompiledLayers(body)
    mlp = body.layers[0].mlp
    home = rotary_home(body)
    eager_rotary = home.apply_rotary_pos_emb
    assert home.__name__.endswith("modeling_llama") and "forward" not in mlp.__dict__
    with compiled.active():
        assert mlp.forward is compiled.forwards[0]
        assert home.apply_rotary_pos_emb is compiled.rotary
    assert "forward" not in mlp.__dict__  # the class's forward again, nothing left on the module
    assert home.apply_rotary_pos_emb is eager_rotary


@pytest.mark.parametrize("rows, queries", [(1, 5), (3, 1), (2, 4)])
def test_the_compiled_rotary_embedding_is_the_eager_one(models, rows, queries):
    """The rotary function given (tokens, heads, head_dim) views computes what the model's own does
    on (rows, heads, queries, head_dim), in the layout the projections wrote (float32, CPU)."""
    body = models["qwen3"].get_decoder()
    compiled = CompiledLayers(body)
    torch.manual_seed(3)
    heads, kv_heads, dim = 4, 2, 16
    q = torch.randn(rows, queries, heads, dim).transpose(1, 2)  # as the attention makes them
    k = torch.randn(rows, queries, kv_heads, dim).transpose(1, 2)
    cos, sin = torch.randn(rows, queries, dim), torch.randn(rows, queries, dim)
    expected = compiled.rotary_eager(q, k, cos, sin)
    got = compiled.rotary(q, k, cos, sin)
    for e, g in zip(expected, got):
        assert g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)


def test_the_engines_forwards_go_through_the_compiler(models, tokenizer):
    """With a backend that records what it is given, decoding hands the compiler the MLP, the norms
    and the rotary embedding and no attention; after one request of each decoder (a job's first batch, `hpd bench`'s
    warm-up), batches of other shapes (more rows, fixed and packed steps) compile nothing new: the
    compiler sees every input as (tokens, features), so neither the rank nor a dimension of size 1
    makes it compile again inside a timed run."""
    graphs = []

    def recording_backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    torch._dynamo.reset()
    decoders = {}
    for name in ("ar", "hpd"):
        for step_shape in ("fixed", "packed"):
            config = DecodeConfig(max_value_tokens=6, step_shape=step_shape)
            decoder = make_decoder(name, models["qwen3"], tokenizer, config)
            decoder.runner.compiled = CompiledLayers(decoder.runner.body, backend=recording_backend)
            decoders[name, step_shape] = decoder
    for (name, step_shape), decoder in decoders.items():  # one request each
        decoder.decode([random_request(random.Random(50), 3, 3)])
    first = len(graphs)
    for (name, step_shape), decoder in decoders.items():
        decoder.decode([random_request(random.Random(60 + i), 1 + i, 2 + i) for i in range(4)])
    assert len(graphs) == first, f"{len(graphs) - first} graphs compiled after the first requests"
    # the MLP, the norms (over the hidden size and over a head) and the rotary embedding, each
    # perhaps also for a single token
    assert 3 <= first <= 8, first
    ops = {str(node.target) for g in graphs for node in g.graph.nodes if node.op == "call_function"}
    assert any("silu" in op for op in ops) and any("rsqrt" in op for op in ops)
    assert any("cat" in op for op in ops) and any("neg" in op for op in ops)  # rotate_half
    assert not any("scaled_dot_product_attention" in op for op in ops)


def test_config_compiles_large_models_on_cuda_and_bfloat16_on_a_cpu_by_default():
    from hpd_core.config import COMPILE_MIN_BODY_PARAMETERS as large

    auto = DecodeConfig()
    assert auto.compiles("cuda:0", large) and not auto.compiles("cuda", large - 1) and not auto.compiles("cpu", 10 * large)
    assert auto.compiles("cpu", 1, torch.bfloat16) and auto.compiles("cpu", 1, "bfloat16")  # a report's dtype
    assert not auto.compiles("cpu", large, torch.float32) and not auto.compiles("cuda", 1, torch.bfloat16)
    assert DecodeConfig(compile_layers="on").compiles("cpu", 0)
    assert not DecodeConfig(compile_layers="off").compiles("cuda", 10 * large)
    with pytest.raises(ValueError, match="compile_layers"):
        DecodeConfig(compile_layers=True)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_compiled_decoding_equals_the_oracle(models, tokenizer, arch):
    """compile_layers="on" on the CPU, float32: HPD (packed and fixed steps) and the baseline ==
    their oracles, token for token or parting at a float32 tie. On a CPU that is for_cpu's pieces,
    which compile calls of CPU_MIN_TOKENS tokens or more: the prefills here; the decode steps run
    eagerly (compiled decode steps: test_cpu_pieces_decode_as_the_oracle)."""
    model = models[arch]
    requests = [random_request(random.Random(40 + i), 3, 3) for i in range(3)]
    for step_shape in ("packed", "fixed"):
        config = DecodeConfig(max_value_tokens=6, max_batch_size=2, compile_layers="on", step_shape=step_shape)
        hpd = make_decoder("hpd", model, tokenizer, config)
        assert hpd.runner.compiled is not None
        reference = ReferenceDecoder(model, tokenizer, config)
        for request, a, b in zip(requests, hpd.decode(requests), reference.decode(requests)):
            slots_part_at_a_tie(reference, request, a.extra["slot_tokens"], b.extra["slot_tokens"])
        assert not hpd.runner.compiled.failed and hpd.layers_compiled()
        assert not reference.layers_compiled()  # the oracle runs the model's own forward
    ar = AutoregressiveDecoder(model, tokenizer, config)
    assert ar.layers_compiled()
    ar_reference = AutoregressiveReference(model, tokenizer, config)
    for request, a, b in zip(requests, ar.decode(requests), ar_reference.decode(requests)):
        parts_at_a_tie(model, ar_reference.prompt_ids(request), a.extra["tokens"], b.extra["tokens"])


def test_a_failed_compile_falls_back_to_eager(models, tokenizer, caplog):
    """A backend that fails: logged once, the pieces run eagerly, the tokens are the eager ones."""

    def failing_backend(graph, example_inputs):
        raise RuntimeError("no compiler here")

    model = models["llama"]
    requests = [random_request(random.Random(50), 3, 3)]
    eager = make_decoder("hpd", model, tokenizer, DecodeConfig(max_value_tokens=6)).decode(requests)
    decoder = make_decoder("hpd", model, tokenizer, DecodeConfig(max_value_tokens=6))
    assert not decoder.layers_compiled()  # float32 on a CPU: eager by default
    decoder.runner.compiled = CompiledLayers(decoder.runner.body, backend=failing_backend)
    assert decoder.layers_compiled()
    with caplog.at_level(logging.WARNING, logger="hpd_core.compiled"):
        results = decoder.decode(requests)
    assert decoder.runner.compiled.failed and not decoder.layers_compiled()  # what ran: eager
    assert sum("run eagerly" in r.getMessage() for r in caplog.records) == 1
    assert [r.extra["slot_tokens"] for r in results] == [r.extra["slot_tokens"] for r in eager]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gelu_product_through_sigmoid_is_the_tanh_gelus(dtype):
    """gelu_tanh_product (x * sigmoid(2u)) == F.gelu(x, approximate="tanh") * up: within float32's
    rounding in float32; in bfloat16, where both round the activation before the product, at most
    one unit in the last place of the activation apart, and seldom that."""
    torch.manual_seed(5)
    gate = (torch.randn(300, 64, dtype=torch.float64) * 2).to(dtype)  # about the default model's spread
    gate[0, :6] = torch.tensor([0.0, -0.0, 30.0, -30.0, 1e-3, -12.0])
    up = torch.randn(300, 64, dtype=torch.float64).to(dtype)
    expected = torch.nn.functional.gelu(gate, approximate="tanh") * up
    got = gelu_tanh_product(gate, up)
    assert got.dtype == dtype
    if dtype == torch.float32:  # eager's 1 + tanh(u) cancels for large negative x: an absolute floor
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        x = gate.double()
        exact = x * torch.sigmoid(2 * 0.7978845608028654 * (x + 0.044715 * x**3)) * up.double()
        torch.testing.assert_close(got.double(), exact, rtol=2e-5, atol=1e-9)  # the function, even where eager cancels
        return
    act, g, u = torch.nn.functional.gelu(gate, approximate="tanh").float(), gate.float(), up.float()
    # an activation one bf16 unit (2^-8 relative, at most 2^-7) apart, the product's own rounding,
    # and eager's cancellation in 1 + tanh(u) for negative x (float32's unit near 1, times |x|)
    bound = 2.0**-7 * (act.abs() * u.abs() + expected.float().abs()) + 6e-8 * g.abs() * u.abs()
    assert ((got.float() - expected.float()).abs() <= bound).all()
    assert (got != expected).float().mean() < 0.05


def test_cpu_pieces_compile_the_element_wise_work_alone(models, tokenizer):
    """CompiledLayers.for_cpu: a tanh-GELU MLP (Gemma's) compiles its activation and product alone,
    through sigmoid, and its projections stay eager; a SiLU MLP compiles whole; calls over fewer
    than CPU_MIN_TOKENS tokens compile nothing."""
    graphs = []

    def recording_backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    def ops(gs):
        return {str(node.target) for g in gs for node in g.graph.nodes if node.op == "call_function"}

    gemma = models["gemma3"].get_decoder()
    assert gelu_tanh_mlp(gemma.layers[0].mlp) and not gelu_tanh_mlp(models["qwen3"].get_decoder().layers[0].mlp)
    torch._dynamo.reset()
    decoder = make_decoder("hpd", models["gemma3"], tokenizer, DecodeConfig(max_value_tokens=6))
    assert decoder.runner.compiled is None  # float32 on a CPU: eager unless asked
    compiled = decoder.runner.compiled = CompiledLayers.for_cpu(decoder.runner.body, backend=recording_backend)
    layer, hidden = gemma.layers[0], gemma.config.hidden_size
    with torch.no_grad(), compiled.active():
        for rows, tokens in ((1, CPU_MIN_TOKENS - 1), (CPU_MIN_TOKENS - 1, 1), (3, (CPU_MIN_TOKENS - 1) // 3)):
            x = torch.randn(rows, tokens, hidden)
            mlp = layer.mlp
            torch.testing.assert_close(mlp(x), mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)))
            layer.input_layernorm(x)
        assert graphs == []  # fewer than CPU_MIN_TOKENS tokens a call: eager
        layer.mlp(torch.randn(1, CPU_MIN_TOKENS, hidden))
        assert len(graphs) == 1
    graphs.clear()
    many = [random_request(random.Random(71 + i), 3, 4, title_words=12) for i in range(3)]
    decoder.decode(many)
    assert graphs, "nothing compiled"
    found = ops(graphs)
    assert any("sigmoid" in op for op in found) and any("rsqrt" in op for op in found)
    assert not any("tanh" in op or "gelu" in op or "linear" in op or "mm" in op.split(".")[-1] for op in found)
    first = len(graphs)  # batches of other shapes (rows, products, title lengths) compile nothing new
    decoder.decode([random_request(random.Random(75 + i), 2 + i, 3, title_words=20) for i in range(4)])
    assert len(graphs) == first, f"{len(graphs) - first} graphs compiled after the first requests"
    graphs.clear()
    torch._dynamo.reset()
    qwen = make_decoder("hpd", models["qwen3"], tokenizer, DecodeConfig(max_value_tokens=6))
    qwen.runner.compiled = CompiledLayers.for_cpu(qwen.runner.body, backend=recording_backend)
    qwen.decode(many)
    assert any("silu" in op for op in ops(graphs)) and any("linear" in op for op in ops(graphs))


def compile_every_call(decoder) -> list[str]:
    """Give ``decoder`` the CPU's compiled pieces with every call compiled (min_tokens 0: the
    decode steps too, which for_cpu's CPU_MIN_TOKENS leaves eager); returns a list that gathers
    the kind of forward ("prefill", "step", ...) of every piece call that ran compiled."""
    runner, kinds, now = decoder.runner, [], ["?"]
    compiled = runner.compiled = CompiledLayers(runner.body, min_tokens=0, gelu_products=True)
    runner.listeners.append(lambda kind, tokens, rows: now.__setitem__(0, kind))  # told before the body runs
    eager_now = compiled._eager_now

    def recording(tokens):
        eager = eager_now(tokens)
        if not eager:
            kinds.append(now[0])
        return eager

    compiled._eager_now = recording
    return kinds


@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
def test_cpu_pieces_decode_as_the_oracle(models, tokenizer, arch):
    """The CPU's compiled pieces (inductor) with every call compiled, decode steps included,
    packed and fixed, float32: HPD == its oracle token for token or parting at a float32 tie, and
    the baseline likewise. (test_compiled_decoding_equals_the_oracle runs for_cpu's pieces, whose
    decode steps, under CPU_MIN_TOKENS tokens, run eagerly.)"""
    model = models[arch]
    requests = [random_request(random.Random(80 + i), 3, 3) for i in range(2)]
    oracle_config = DecodeConfig(max_value_tokens=6)
    reference = ReferenceDecoder(model, tokenizer, oracle_config)
    ar_reference = AutoregressiveReference(model, tokenizer, oracle_config)
    slow, ar_slow = reference.decode(requests), ar_reference.decode(requests)
    for step_shape in ("packed", "fixed"):
        config = DecodeConfig(max_value_tokens=6, max_batch_size=2, step_shape=step_shape)
        hpd = make_decoder("hpd", model, tokenizer, config)
        kinds = compile_every_call(hpd)
        for request, a, b in zip(requests, hpd.decode(requests), slow):
            slots_part_at_a_tie(reference, request, a.extra["slot_tokens"], b.extra["slot_tokens"])
        assert not hpd.runner.compiled.failed and hpd.runner.sessions[step_shape] == 1
        assert "step" in kinds and "prefill" in kinds, (step_shape, set(kinds))  # decode steps ran compiled
        ar = AutoregressiveDecoder(model, tokenizer, config)
        kinds = compile_every_call(ar)
        for request, a, b in zip(requests, ar.decode(requests), ar_slow):
            parts_at_a_tie(model, ar_reference.prompt_ids(request), a.extra["tokens"], b.extra["tokens"])
        assert not ar.runner.compiled.failed and ar.runner.sessions[step_shape] == 1
        assert "step" in kinds and "prefill" in kinds, (step_shape, set(kinds))
