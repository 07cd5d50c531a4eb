"""Sessions (hpd_core/session.py): a prompt decoded with a shared prefix and in a refilled row
equals the same prompt decoded alone without sharing, token for token (float32), for HPD and the
baseline on every tiny architecture; fixed-shape steps equal the oracle too; the cache and the
packed attention against their plain definitions."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from hpd_core import reach
from hpd_core.attention import engine_sdpa, fold_mask
from hpd_core.autoregressive import AutoregressiveDecoder
from hpd_core.config import DecodeConfig
from hpd_core.decoders import make_decoder
from hpd_core.engine import HPDDecoder
from hpd_core.layout import build_layout, shared_prefix_length
from hpd_core.prompts import shared_prefix_text
from hpd_core.reference import AutoregressiveReference
from hpd_core.types import Attribute, Product, Request

from .conftest import ARCHITECTURES, random_request, random_text


def category_requests(rng: random.Random, n: int) -> list[Request]:
    """``n`` prompts of one category and attribute list (one shared prefix), 1..3 products each,
    plus two prompts of another category."""
    attributes = tuple(Attribute(f"attr {i} {random_text(rng, 1)}") for i in range(rng.randint(1, 3)))
    shared = [
        Request("Shoes", attributes, tuple(Product(f"p{i}{j}", random_text(rng, rng.randint(1, 8))) for j in range(rng.randint(1, 3))))
        for i in range(n)
    ]
    return shared + [random_request(rng, rng.randint(1, 3), rng.randint(1, 3)) for _ in range(2)]


def assert_same_decoding(fast, slow, requests: list[Request], rng: random.Random) -> None:
    """Two decoders of one kind agree on ``requests``: HPD under teacher forcing (random tokens,
    so every slot runs several steps) with its step logits within 2e-5, the baseline decoding
    freely; the tokens and values the same."""
    if fast.name == "hpd":
        layouts = fast.prepare(requests)
        forced = [[[rng.randrange(3, 200) for _ in range(rng.randint(1, 5))] for _ in range(lay.num_slots)]
                  for lay in layouts]  # fmt: skip
        got, expected = fast.decode_batch(requests, layouts, None, forced), slow.decode_batch(requests, layouts, None, forced)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a.extra["step_logits"], b.extra["step_logits"], atol=2e-5, rtol=0)
    else:
        got, expected = fast.decode(requests), slow.decode(requests)
    assert [r.extra.get("slot_tokens", r.extra.get("tokens")) for r in got] == \
           [r.extra.get("slot_tokens", r.extra.get("tokens")) for r in expected]
    assert [r.values for r in got] == [r.values for r in expected]


def alone(config: DecodeConfig) -> DecodeConfig:
    """One prompt at a time, no shared prefix: the plainest way the engine can decode."""
    return DecodeConfig(max_value_tokens=config.max_value_tokens, prefix_cache=0, max_batch_size=1,
                        step_shape=config.step_shape)  # fmt: skip


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("step_shape", ["packed", "fixed"])
def test_hpd_prefix_reuse_and_row_refill_equal_decoding_alone(models, tokenizer, arch, step_shape):
    rng = random.Random(ARCHITECTURES.index(arch))
    requests = category_requests(rng, 5)
    config = DecodeConfig(max_value_tokens=6, max_batch_size=2, step_shape=step_shape)  # 2 rows, 7 prompts
    decoder = make_decoder("hpd", models[arch], tokenizer, config)
    batched = decoder.decode(requests)
    assert decoder.prefixes.hits >= 4  # the shared prefix was prefilled once, then reused
    assert decoder.runner.counts["prefill"] > 1  # rows were refilled
    single = make_decoder("hpd", models[arch], tokenizer, alone(config))
    for request, result in zip(requests, batched):
        expected = single.decode([request])[0]
        assert result.extra["slot_tokens"] == expected.extra["slot_tokens"]
        assert (result.values, result.forward_passes) == (expected.values, expected.forward_passes)
    assert single.prefixes.hits == 0


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("step_shape", ["packed", "fixed"])
def test_baseline_prefix_reuse_and_row_refill_equal_decoding_alone(models, tokenizer, arch, step_shape):
    rng = random.Random(10 + ARCHITECTURES.index(arch))
    requests = category_requests(rng, 5)
    config = DecodeConfig(max_value_tokens=2, max_batch_size=2, step_shape=step_shape, check_every=3)
    decoder = AutoregressiveDecoder(models[arch], tokenizer, config)
    batched = decoder.decode(requests)
    assert decoder.prefixes.hits >= 4
    assert decoder.runner.counts["prefill"] > 1
    single = AutoregressiveDecoder(models[arch], tokenizer, alone(config))
    oracle = AutoregressiveReference(models[arch], tokenizer, config)
    for request, result in zip(requests, batched):
        expected = single.decode([request])[0]
        assert result.extra["text"] == expected.extra["text"] == oracle.decode([request])[0].extra["text"]
        assert (result.values, result.forward_passes) == (expected.values, expected.forward_passes)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_fixed_steps_equal_the_oracle(models, tokenizer, arch):
    """Fixed-shape steps (every slot fed, finished ones absent, host read every few steps) give
    the oracle's tokens and pass counts."""
    rng = random.Random(20 + ARCHITECTURES.index(arch))
    requests = [random_request(rng, rng.randint(1, 4), rng.randint(1, 4), rng.randint(1, 12)) for _ in range(4)]
    config = DecodeConfig(max_value_tokens=7, step_shape="fixed", check_every=3)
    fast = make_decoder("hpd", models[arch], tokenizer, config).decode(requests)
    slow = make_decoder("reference", models[arch], tokenizer, config).decode(requests)
    assert [r.extra["slot_tokens"] for r in fast] == [r.extra["slot_tokens"] for r in slow]
    assert [r.forward_passes for r in fast] == [r.forward_passes for r in slow]


@pytest.mark.parametrize("decoder_name", ["hpd", "ar"])
def test_fixed_steps_prefill_packed_and_unmasked(models, tokenizer, decoder_name):
    """With fixed-shape steps the prefills are packed as with packed steps (the linear layers see
    the prompts' own tokens only, and causal prefills run without a mask: on a GPU SDPA's flash
    kernel instead of the math kernel a mask with grouped-query K/V gets); the tokens agree."""
    requests = [random_request(random.Random(7), 2, 3, n) for n in (2, 9, 5)]
    runs = {}
    for step_shape in ("packed", "fixed"):
        decoder = make_decoder(decoder_name, models["qwen3"], tokenizer, DecodeConfig(max_value_tokens=4, step_shape=step_shape))
        results = decoder.decode(requests)
        key = "slot_tokens" if decoder_name == "hpd" else "text"
        runs[step_shape] = ([r.extra[key] for r in results], decoder.runner.tokens["prefill"], decoder.runner.tokens["prefix"])
    assert runs["fixed"] == runs["packed"]


def test_shared_prefix_is_the_prompts_own_tokens(tokenizer):
    """The shared prefix is a token prefix of every prompt of the category, ends before the first
    product's text, and is the same for prompts of one category and attribute list."""
    rng = random.Random(3)
    requests = category_requests(rng, 4)[:4]
    lengths = []
    for skeleton in ("after-products", "interleaved"):
        for request in requests:
            layout = build_layout(request, tokenizer, 4, skeleton)
            text = shared_prefix_text(request, tokenizer, skeleton)
            n = shared_prefix_length(tokenizer, text, layout.input_ids, min(layout.anchor_index))
            assert 0 < n <= min(layout.anchor_index)
            assert request.products[0].title not in tokenizer.decode(layout.input_ids[:n])
            lengths.append((skeleton, tuple(layout.input_ids[:n])))
    assert len(set(lengths)) == 2  # one prefix per skeleton for the whole category


@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 4), (6, 2)])
def test_packed_grouped_attention_equals_repeated_kv(heads, kv_heads):
    """engine_sdpa on packed queries, K/V not repeated == plain SDPA per row with repeated K/V."""
    torch.manual_seed(0)
    rows, A, C, D = 3, 4, 9, 8
    counts = [4, 1, 3]
    place = torch.tensor([r * A + c for r, n in enumerate(counts) for c in range(n)])
    query = torch.randn(1, heads, len(place), D)
    key, value = torch.randn(rows, kv_heads, C, D), torch.randn(rows, kv_heads, C, D)
    allowed = torch.rand(rows, 1, A, C) > 0.4
    allowed[..., 0] = True
    mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
    out, _ = engine_sdpa(None, query, key, value, mask, scaling=0.3, unpack=(place // A, place % A))
    rep = heads // kv_heads
    for i, p in enumerate(place.tolist()):
        r, c = divmod(p, A)
        q = query[0, :, i : i + 1]  # (H, 1, D)
        k, v = key[r].repeat_interleave(rep, 0), value[r].repeat_interleave(rep, 0)
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[r, :, c : c + 1], scale=0.3)
        torch.testing.assert_close(out[0, i], expected[:, 0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 4)])
def test_packed_attention_is_the_padded_call_exactly(heads, kv_heads):
    """Packed queries (placed into the grid, outputs gathered back from the grouped result) give
    bit for bit the padded call's outputs at their places: the packing only moves data."""
    torch.manual_seed(2)
    rows, A, C, D = 3, 4, 9, 8
    counts = [4, 1, 3]
    place = torch.tensor([r * A + c for r, n in enumerate(counts) for c in range(n)])
    padded = torch.randn(rows, heads, A, D)
    query = padded.transpose(1, 2).reshape(rows * A, heads, D)[place].transpose(0, 1)[None]  # (1, H, N, D)
    key, value = torch.randn(rows, kv_heads, C, D), torch.randn(rows, kv_heads, C, D)
    allowed = torch.rand(rows, 1, A, C) > 0.4
    allowed[..., 0] = True
    mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
    packed, _ = engine_sdpa(None, query, key, value, mask, scaling=0.3, unpack=(place // A, place % A))
    full, _ = engine_sdpa(None, padded, key, value, mask, scaling=0.3)  # (rows, A, H, D)
    assert torch.equal(packed[0], full.reshape(rows * A, heads, D)[place])
    if heads > kv_heads:  # the mask folded once (by the runner, for all layers) gives the same bits
        folded = fold_mask(mask, heads // kv_heads)
        again, _ = engine_sdpa(None, query, key, value, folded, scaling=0.3, unpack=(place // A, place % A), folded=True)
        assert torch.equal(again, packed)
        padded_again, _ = engine_sdpa(None, padded, key, value, folded, scaling=0.3, folded=True)
        assert torch.equal(padded_again, full)


def test_causal_attention_is_the_index_rule():
    """engine_sdpa's causal mode (queries at their own index, no mask) == the masked call with the
    mask "entry index <= query index"."""
    torch.manual_seed(1)
    rows, C, heads, kv_heads, D = 3, 10, 4, 2, 8
    index = [torch.arange(3, 10), torch.arange(0, 6), torch.arange(4, 5)]  # a prefix before, or none
    place = torch.cat([r * C + i for r, i in enumerate(index)])
    unpack = (place // C, place % C)
    query = torch.randn(1, heads, len(place), D)
    key, value = torch.randn(rows, kv_heads, C, D), torch.randn(rows, kv_heads, C, D)
    causal, _ = engine_sdpa(None, query, key, value, torch.zeros(rows, 1, 1, 1), scaling=0.3, unpack=unpack,
                            causal_width=C)  # fmt: skip
    allowed = torch.arange(C)[None, :] <= torch.arange(C)[:, None]  # (query index, entry index)
    mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min).expand(rows, 1, C, C)
    masked, _ = engine_sdpa(None, query, key, value, mask, scaling=0.3, unpack=unpack)
    torch.testing.assert_close(causal, masked, atol=1e-6, rtol=0)


def causal_and_masked(decoder_name, model, tokenizer, band_block):
    """Two decoders of the model: one whose prefills take the causal paths (sliding layers in blocks
    of ``band_block`` queries, if given), one whose prefills go through the rule's mask."""
    config = DecodeConfig(max_value_tokens=5, max_batch_size=3)
    fast = make_decoder(decoder_name, model, tokenizer, config)
    slow = make_decoder(decoder_name, model, tokenizer, config)
    slow.runner.causal_ok = False
    if band_block is not None:
        fast.runner.band_block = band_block
    return fast, slow


@pytest.mark.parametrize("arch, band_block", [("llama", None), ("qwen3", None), ("phi3", None), ("gemma3", 8),
                                              ("qwen3-swa", 5), ("mistral-swa", 64)])  # fmt: skip
@pytest.mark.parametrize("decoder_name", ["hpd", "ar"])
def test_causal_prefill_equals_the_masked_prefill(models, tokenizer, arch, band_block, decoder_name):
    """Prefills (and shared prefixes) run as SDPA's causal attention (full layers) and as banded
    blocks of queries (sliding layers, windows far smaller than the prompts) give the same tokens and
    the same logits as through the rule's mask, for both decoders, with shared prefixes and
    refilled rows."""
    rng = random.Random(7)
    requests = category_requests(rng, 4)
    fast, slow = causal_and_masked(decoder_name, models[arch], tokenizer, band_block)
    assert fast.runner.causal_ok
    seen, bands = [], []
    forward = fast.runner.body.forward
    fast.runner.body.forward = lambda *a, **k: seen.append("causal_width" in k) or bands.append(k.get("bands")) or forward(*a, **k)
    assert_same_decoding(fast, slow, requests, rng)
    assert any(seen) and not all(seen)  # prefix and prefill forwards causal, steps masked
    if band_block is not None:  # sliding layers: several blocks, some reading from past the first entry
        blocks = [block for plan in bands if plan for blocks in plan.values() for block in blocks]
        assert len({qs for qs, *_ in blocks}) > 2 and any(ks > 0 for _, _, ks, _ in blocks)


@pytest.mark.parametrize("arch, band_block", [("llama", None), ("qwen3", None), ("gemma3", 8), ("qwen3-swa", 5),
                                              ("mistral-swa", 64)])  # fmt: skip
@pytest.mark.parametrize("decoder_name", ["hpd", "ar"])
def test_matmul_prefill_equals_the_masked_prefill(models, tokenizer, arch, band_block, decoder_name, monkeypatch):
    """The CPU's causal forwards through matrix products (``attention.causal_matmul``: each row's
    packed queries in blocks, no grid; sliding layers over the runner's bands), forced here in
    float32, give the same tokens and logits as the rule's mask, for both decoders, with shared
    prefixes, refilled rows and windows smaller than the prompts; blocks this small split the
    prompts into many."""
    import hpd_core.attention as attention

    monkeypatch.setattr(attention, "MATMUL_DTYPES", (torch.float32,))
    monkeypatch.setattr(attention, "MATMUL_BLOCK", 3)
    calls = []
    plain = attention.causal_matmul
    monkeypatch.setattr(attention, "causal_matmul", lambda *a, **k: calls.append(a[4] is not None) or plain(*a, **k))
    rng = random.Random(5)
    requests = category_requests(rng, 4)
    fast, slow = causal_and_masked(decoder_name, models[arch], tokenizer, band_block)
    assert_same_decoding(fast, slow, requests, rng)
    assert calls and (band_block is None or True in calls)  # every arch's full layers, and sliding ones


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3", "qwen3-swa", "mistral-swa"])
def test_row_by_row_step_attention_equals_the_batched_masked_step(models, tokenizer, arch, monkeypatch):
    """CPU steps whose rows hold several queries attend row by row, each row's real queries in
    groups over one or two ranges of the entries one of them may see (hpd_core/reach.py; padding
    queries and unreachable entries left out, two ranges gathered into one call): the same tokens
    and step logits as the batched, masked call, with rows of different lengths, shared prefixes,
    refilled rows and (swa, gemma3) windows smaller than the prompts. Calls and gathers are priced
    low here so that rows this small are split too."""
    rng = random.Random(11)
    requests = category_requests(rng, 5)
    config = DecodeConfig(max_value_tokens=5, max_batch_size=3)
    fast = make_decoder("hpd", models[arch], tokenizer, config)
    slow = make_decoder("hpd", models[arch], tokenizer, config)
    slow.runner.row_attention = False
    fast.runner.call_pairs = 4
    monkeypatch.setattr(reach, "GATHER_PAIRS", 0)  # gathers priced low too
    assert fast.runner.row_attention
    plans = []
    forward = fast.runner.body.forward
    fast.runner.body.forward = lambda *a, **k: plans.append(k.get("row_plan")) or forward(*a, **k)
    assert_same_decoding(fast, slow, requests, rng)
    rows = [groups for plan in plans if plan for per_row in plan.values() for groups in per_row]
    assert rows and any(len(groups) > 1 for groups in rows)  # rows split into groups
    entries = [e for groups in rows for _, _, e, _ in groups]
    assert any(isinstance(e, torch.Tensor) for e in entries)  # groups over two ranges, gathered
    gathered = [e.tolist() for e in entries if isinstance(e, torch.Tensor)]
    assert all(e == sorted(set(e)) and e[-1] - e[0] + 1 > len(e) for e in gathered)  # two ranges with a gap
    ends = {e[1] if isinstance(e, tuple) else int(e[-1]) + 1 for e in entries}
    assert len(ends) > 1  # groups read parts of their rows


def test_prefix_store_keeps_the_most_recently_used():
    from hpd_core.kvcache import Prefix, PrefixStore

    store = PrefixStore(2)
    entry = Prefix(1, [], [])
    store.put((1,), entry)
    store.put((2,), entry)
    assert store.get((1,)) is entry  # (1,) is now the most recent
    store.put((3,), entry)
    assert store.get((2,)) is None and store.get((1,)) is entry and store.get((3,)) is entry
    assert (store.hits, store.misses) == (3, 1)
    off = PrefixStore(0)
    off.put((1,), entry)
    assert off.get((1,)) is None


def test_auto_step_shape_is_packed_on_cpus_and_for_heavy_steps_on_cuda():
    """step_shape="auto": packed on a CPU whatever the step; on CUDA fixed (graphs) until a fixed
    step's matrix work reaches PACKED_STEP_FLOPS, packed from there; "fixed" and "packed" are kept."""
    from hpd_core.config import PACKED_STEP_FLOPS

    auto = DecodeConfig()
    assert not auto.fixed_steps("cpu") and not auto.fixed_steps("cpu", step_flops=10 * PACKED_STEP_FLOPS)
    assert auto.fixed_steps("cuda") and auto.fixed_steps("cuda:0", step_flops=PACKED_STEP_FLOPS / 2)
    assert not auto.fixed_steps("cuda", step_flops=PACKED_STEP_FLOPS)
    assert DecodeConfig(step_shape="fixed").fixed_steps("cuda", step_flops=10 * PACKED_STEP_FLOPS)
    assert not DecodeConfig(step_shape="packed").fixed_steps("cuda")


def test_body_parameters_leave_out_the_embedding_and_count_4bit_weights_unpacked(models):
    """runner.body_parameters: the decoder's parameters less its embedding table; a bitsandbytes
    4-bit weight (two values a byte, its shape in ``quant_state``) counts at its unpacked size."""
    from types import SimpleNamespace

    from hpd_core.runner import body_parameters

    model = models["llama"]
    decoder = model.get_decoder()
    plain = sum(p.numel() for p in decoder.parameters()) - model.get_input_embeddings().weight.numel()
    assert body_parameters(model) == plain
    weight = decoder.layers[0].mlp.up_proj.weight
    weight.quant_state = SimpleNamespace(shape=torch.Size([weight.shape[0], 2 * weight.shape[1]]))
    try:
        assert body_parameters(model) == plain + weight.numel()
    finally:
        del weight.quant_state


def test_hpd_asks_for_the_step_shape_of_its_batch_matrix_work(models, tokenizer, monkeypatch):
    """An HPD session passes its fixed step's matrix work, 2 x body parameters x rows x slots, to
    DecodeConfig.fixed_steps; body parameters leave out the embedding table (and the LM head)."""
    model = models["llama"]
    decoder = make_decoder("hpd", model, tokenizer, DecodeConfig(max_value_tokens=4, max_batch_size=2))
    embedding = model.get_input_embeddings().weight.numel()
    assert decoder.runner.body_parameters == sum(p.numel() for p in model.get_decoder().parameters()) - embedding
    asked = []
    original = DecodeConfig.fixed_steps

    def fixed_steps(self, device, step_flops=0.0):
        asked.append(step_flops)
        return original(self, device, step_flops)

    monkeypatch.setattr(DecodeConfig, "fixed_steps", fixed_steps)
    requests = category_requests(random.Random(5), 3)
    decoder.decode(requests)
    slots = max(lay.num_slots for lay in decoder.prepare(requests))
    assert asked and max(asked) <= 2.0 * decoder.runner.body_parameters * 2 * slots
    assert 2.0 * decoder.runner.body_parameters * 2 * slots in asked  # the first session: 2 rows


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("step_shape", ["auto", "packed"])
def test_cuda_steps_equal_the_cpu_oracle(tokenizer, arch, step_shape):
    """On CUDA, float32, with fixed steps (auto, for small batches) and packed ones (what auto
    picks for heavy batches), the layers' MLPs, norms and rotary embeddings compiled
    (compile_layers="on"; steps recorded as CUDA graphs keep them eager): HPD and the baseline ==
    their CPU oracles. One prompt of 8 attributes passes the sliding window of the last three
    architectures, so there HPD decodes it as attribute groups (hpd_core/attribute_groups.py), as
    the oracle does."""
    from .conftest import parts_at_a_tie, slots_part_at_a_tie, tiny_model

    rng = random.Random(30)
    requests = category_requests(rng, 3) + [random_request(rng, 2, 8)]
    config = DecodeConfig(max_value_tokens=6, max_batch_size=2, step_shape=step_shape, compile_layers="on")
    cpu_model = tiny_model(arch, len(tokenizer))
    gpu_model = tiny_model(arch, len(tokenizer)).cuda()
    assert config.fixed_steps("cuda") == (step_shape == "auto")
    # each pair the same tokens, or parting at a float32 tie in the oracle's logits (else these fail)
    reference = make_decoder("reference", cpu_model, tokenizer, config)
    hpd = make_decoder("hpd", gpu_model, tokenizer, config)
    gpu = hpd.decode(requests)
    assert hpd.runner.compiled is not None and not hpd.runner.compiled.failed
    assert ("groups" in gpu[-1].extra) == (hpd.window is not None)
    for request, a, b in zip(requests, gpu, reference.decode(requests)):
        slots_part_at_a_tie(reference, request, a.extra["slot_tokens"], b.extra["slot_tokens"])
    ar_reference = AutoregressiveReference(cpu_model, tokenizer, config)
    ar = AutoregressiveDecoder(gpu_model, tokenizer, config)
    ar_gpu = ar.decode(requests)
    assert ar.runner.compiled is not None and not ar.runner.compiled.failed
    for request, a, b in zip(requests, ar_gpu, ar_reference.decode(requests)):
        parts_at_a_tie(cpu_model, ar_reference.prompt_ids(request), a.extra["tokens"], b.extra["tokens"])


def spans_equal_the_cpu_oracle(tokenizer, arch: str, device: str) -> None:
    """HPD and the baseline with span decoding on ``device`` == their CPU oracles under the same
    rule (float32; each pair the same tokens, or parting at a tie in the oracle's logits)."""
    from .conftest import parts_at_a_tie, slots_part_at_a_tie, tiny_model

    requests = category_requests(random.Random(32), 3)
    config = DecodeConfig(max_value_tokens=6, max_batch_size=2, spans="on")
    cpu_model, model = tiny_model(arch, len(tokenizer)), tiny_model(arch, len(tokenizer)).to(device)
    reference = make_decoder("reference", cpu_model, tokenizer, config)
    hpd = make_decoder("hpd", model, tokenizer, config)
    assert hpd.spans is not None
    for request, a, b in zip(requests, hpd.decode(requests), reference.decode(requests)):
        slots_part_at_a_tie(reference, request, a.extra["slot_tokens"], b.extra["slot_tokens"])
    ar_reference = AutoregressiveReference(cpu_model, tokenizer, config)
    ar = AutoregressiveDecoder(model, tokenizer, config)
    for request, a, b in zip(requests, ar.decode(requests), ar_reference.decode(requests)):
        parts_at_a_tie(cpu_model, ar_reference.prompt_ids(request), a.extra["tokens"], b.extra["tokens"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_cuda_span_decoding_equals_the_cpu_oracle(tokenizer, arch):
    """`--spans on` on CUDA (where `auto` leaves it off): fixed steps with the host's span lookups,
    no CUDA graphs; HPD and the baseline == their CPU oracles with the same rule."""
    assert not DecodeConfig(spans="auto").span_decoding("cuda") and DecodeConfig(spans="on").span_decoding("cuda")
    spans_equal_the_cpu_oracle(tokenizer, arch, "cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bfloat16_agrees_with_float32_mostly(tokenizer):
    """bf16 on CUDA against float32: the share of slots with the same tokens (printed; most)."""
    from .conftest import tiny_model

    rng = random.Random(31)
    requests = [random_request(rng, 3, 3) for _ in range(8)]
    config = DecodeConfig(max_value_tokens=6)
    f32 = make_decoder("hpd", tiny_model("llama", len(tokenizer)).cuda(), tokenizer, config).decode(requests)
    bf16 = make_decoder("hpd", tiny_model("llama", len(tokenizer)).cuda().bfloat16(), tokenizer, config).decode(requests)
    pairs = [(a, b) for ra, rb in zip(f32, bf16) for a, b in zip(ra.extra["slot_tokens"], rb.extra["slot_tokens"])]
    agreement = sum(a == b for a, b in pairs) / len(pairs)
    print(f"bf16 vs float32 slot agreement on CUDA: {agreement:.3f}")
    assert agreement >= 0.5


def test_decode_stream_tokenizes_ahead_and_equals_decode(models, tokenizer):
    """decode_stream: batch k + 1 is tokenized on a background thread while batch k decodes; the
    results are decode's, batch by batch, for HPD and the baseline."""
    rng = random.Random(40)
    batches = [category_requests(rng, 2), [random_request(rng, 2, 2)], category_requests(rng, 1)]
    config = DecodeConfig(max_value_tokens=4)
    for decoder in (make_decoder("hpd", models["qwen3"], tokenizer, config), AutoregressiveDecoder(models["qwen3"], tokenizer, config)):
        key = "slot_tokens" if decoder.name == "hpd" else "text"
        streamed = list(decoder.decode_stream(batches))
        assert [[r.extra[key] for r in rs] for rs in streamed] == [[r.extra[key] for r in decoder.decode(b)] for b in batches]


@pytest.mark.parametrize("decoder_name", ["hpd", "ar"])
def test_each_prompt_is_reported_once_as_it_finishes(models, tokenizer, decoder_name):
    """``on_prompt_done`` (the job's progress line) hears of every request exactly once, and of the
    first ones while later prompts are still waiting for a row."""
    requests = category_requests(random.Random(11), 5)
    decoder = make_decoder(decoder_name, models["llama"], tokenizer, DecodeConfig(max_value_tokens=6, max_batch_size=2))
    heard = []
    decoder.on_prompt_done = lambda request: heard.append((request, decoder.runner.counts["prefill"]))
    decoder.decode(requests)
    assert sorted(id(r) for r, _ in heard) == sorted(id(r) for r in requests)
    assert heard[0][1] < decoder.runner.counts["prefill"]  # reported before the last rows were refilled


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("chunk", [7, 64, 100_000])
@pytest.mark.parametrize("softcap", [None, 0.5])
def test_greedy_next_tokens_over_vocabulary_slices_equal_argmax(models, tokenizer, arch, chunk, softcap):
    """ModelRunner.next_tokens (greedy, the LM head over slices of the vocabulary, running maximum)
    == argmax over the whole logits, ties included (the first maximum wins), with and without soft
    capping (a small cap saturates tanh: many ties), NaN logits in a later slice included."""
    from hpd_core.runner import ModelRunner

    runner = ModelRunner(models[arch], tokenizer)
    runner.vocab_chunk, runner.softcap = chunk, softcap
    torch.manual_seed(2)
    hidden = torch.randn(40, runner.head.weight.shape[1]) * 3
    hidden[5:] = hidden[:35].clone()
    with torch.no_grad():
        weight = runner.head.weight.clone()
        try:
            runner.head.weight[300:350] = runner.head.weight[100:150]  # duplicate rows: exact ties across slices
            runner.head.weight[380, 0] = float("inf")  # token 380: +-inf, and NaN (0 x inf) for queries 30+,
            hidden[30:, 0] = 0.0  # which argmax takes as their highest (a model that overflowed)
            logits = runner.logits(hidden)
            expected = logits.argmax(-1)
            got = runner.next_tokens(hidden, DecodeConfig(), None)
        finally:
            runner.head.weight.copy_(weight)
    assert torch.equal(got, expected)
    ties = (logits == logits.max(-1, keepdim=True).values).sum(-1) > 1
    assert ties.any()  # there were ties to break
    assert (got[30:] == 380).all()  # NaN, in a later slice than the first where chunk < 380


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("softcap", [None, 0.5])
def test_allowed_tokens_equal_argmax_of_the_masked_logits(models, tokenizer, arch, softcap):
    """ModelRunner.allowed_tokens (greedy: the head's rows of the allowed tokens only) == argmax of
    the whole logits with every other token masked, ties included (a small cap saturates tanh),
    and with NaN logits (a model that overflowed), which argmax takes as the highest: one query's
    logits all NaN, one with a NaN among finite ones."""
    from hpd_core.runner import ModelRunner

    runner = ModelRunner(models[arch], tokenizer)
    runner.softcap = softcap
    rng = random.Random(4)
    torch.manual_seed(4)
    vocab = runner.head.weight.shape[0]
    hidden = torch.randn(12, runner.head.weight.shape[1]) * 3
    allowed = [sorted(rng.sample(range(vocab), rng.randint(1, 40))) for _ in range(12)]
    with torch.no_grad():
        weight = runner.head.weight.clone()
        try:
            runner.head.weight[allowed[3][-1]] = runner.head.weight[allowed[3][0]]  # a tie
            runner.head.weight[allowed[7]] = float("nan")  # query 7: every allowed logit NaN
            runner.head.weight[allowed[9][len(allowed[9]) // 2]] = float("nan")  # query 9: one NaN
            logits = runner.logits(hidden)
            masked = torch.full_like(logits, float("-inf"))
            for i, a in enumerate(allowed):
                masked[i, a] = logits[i, a]
            expected = masked.argmax(-1)
            got = runner.allowed_tokens(hidden, allowed, DecodeConfig(), None)
        finally:
            runner.head.weight.copy_(weight)
    assert torch.equal(got, expected)
    assert got[7].item() == allowed[7][0] and got[9].item() == allowed[9][len(allowed[9]) // 2]


@pytest.mark.parametrize("decoder_name", ["hpd", "ar"])
def test_a_model_that_overflows_fails_clearly(models, tokenizer, decoder_name):
    """Hidden states with NaN or infinity (Gemma 3 in float16 overflows at once) stop decoding with
    a FloatingPointError that names the dtype and the way out, instead of writing noise as values."""
    model = models["gemma3"]
    norm = model.get_decoder().norm  # the final norm: every hidden state the head reads
    decoder = make_decoder(decoder_name, model, tokenizer, DecodeConfig(max_value_tokens=4))
    requests = [random_request(random.Random(90), 2, 2)]
    decoder.decode(requests)  # finite: decodes
    with torch.no_grad():
        saved = norm.weight.clone()
        try:
            norm.weight[3] = float("inf")
            with pytest.raises(FloatingPointError, match="overflowed in float32.*NaN or infinity.*--dtype"):
                decoder.decode(requests)
        finally:
            norm.weight.copy_(saved)


@pytest.mark.parametrize("step_shape", ["packed", "fixed"])
@pytest.mark.parametrize("decoder_name", ["hpd", "ar"])
def test_a_prompt_whose_steps_overflow_is_an_error_result(models, tokenizer, decoder_name, step_shape):
    """NaN in a decode step's hidden states (after a finite prefill) makes that prompt an error
    result that names the overflow; the prompts beside it decode as without it."""
    model = models["llama"]
    config = DecodeConfig(max_value_tokens=4, max_batch_size=3, step_shape=step_shape)
    decoder = make_decoder(decoder_name, model, tokenizer, config)
    rng = random.Random(91)
    requests = [random_request(rng, 2, 2) for _ in range(3)]
    clean = decoder.decode(requests)
    assert all(r.error is None for r in clean)
    forward = decoder.runner.forward

    def poisoned(cache, rows, *args, kind="step", **kwargs):  # row 1's step queries overflow
        hidden = forward(cache, rows, *args, kind=kind, **kwargs)
        return hidden.masked_fill((rows == 1)[:, None], float("nan")) if kind == "step" else hidden

    decoder.runner.forward = poisoned
    results = decoder.decode(requests)
    failed = [i for i, r in enumerate(results) if r.error is not None]
    assert len(failed) == 1  # the prompt in row 1 (every prompt here takes steps)
    assert "overflowed in float32 while decoding" in results[failed[0]].error
    assert all(v.value is None for row in results[failed[0]].values for v in row)
    for i in set(range(3)) - set(failed):
        assert results[i].values == clean[i].values


def test_the_baseline_ignores_overflow_in_fixed_steps_past_an_answers_end(models, tokenizer):
    """Fixed steps run on past a row's end until the next check (every check_every steps): hidden
    states that overflow only there choose no token of the answer, which stays as it was."""
    from hpd_core.layout import encode

    config = DecodeConfig(max_value_tokens=4, max_batch_size=2, step_shape="fixed", check_every=4, prefix_cache=0)
    decoder = make_decoder("ar", models["llama"], tokenizer, config)
    rng = random.Random(92)
    requests = [random_request(rng, 1, 2) for _ in range(2)]
    prompts = [decoder.prompt_ids(r) for r in requests]
    answer = encode(tokenizer, '  "1": {\n    "a": "x",\n    "b": null\n  }\n}')
    forced = [[tokenizer.eos_token_id], answer]  # the first ends at once, the second takes steps
    clean = decoder.decode_batch(requests, prompts, [40, 40], forced=forced)
    forward, steps = decoder.runner.forward, []

    def late_nan(cache, rows, *args, kind="step", **kwargs):  # row 0 overflows in its steps only
        hidden = forward(cache, rows, *args, kind=kind, **kwargs)
        if kind == "step":
            steps.append(True)
            return hidden.masked_fill((rows == 0)[:, None], float("nan"))
        return hidden

    decoder.runner.forward = late_nan
    results = decoder.decode_batch(requests, prompts, [40, 40], forced=forced)
    assert steps and all(r.error is None for r in results)  # row 0's prompt ended before any step
    assert [r.extra["text"] for r in results] == [r.extra["text"] for r in clean]


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3", "mistral-swa"])
@pytest.mark.parametrize("decoder_name", ["hpd", "ar"])
def test_prefill_in_forwards_of_few_tokens_equals_one_forward(models, tokenizer, arch, decoder_name):
    """A prefill split into forwards of at most ``prefill_tokens`` new tokens (whole prompts: here
    one prompt per forward) gives the same logits and tokens as one forward over all its prompts,
    with shared prefixes and refilled rows."""
    rng = random.Random(8)
    requests = category_requests(rng, 4)
    base = dict(max_value_tokens=5, max_batch_size=3)
    split = make_decoder(decoder_name, models[arch], tokenizer, DecodeConfig(**base, prefill_tokens=1))
    whole = make_decoder(decoder_name, models[arch], tokenizer, DecodeConfig(**base, prefill_tokens=10**6))
    assert (split.runner.prefill_tokens, whole.runner.prefill_tokens) == (1, 10**6)
    assert_same_decoding(split, whole, requests, rng)
    # one forward per prompt against one per admission (the first fills all 3 rows at once)
    assert split.runner.counts["prefill"] == len(requests) > whole.runner.counts["prefill"]


def test_prefill_tokens_default_is_sized_for_the_device():
    from hpd_core.batching import PREFILL_TOKENS_CPU, prefill_tokens

    assert prefill_tokens(0, torch.device("cpu")) == PREFILL_TOKENS_CPU
    assert prefill_tokens(0, torch.device("cuda", 0)) == 0  # no limit
    assert prefill_tokens(512, torch.device("cuda", 0)) == prefill_tokens(512, torch.device("cpu")) == 512
    with pytest.raises(ValueError, match="prefill_tokens"):
        DecodeConfig(prefill_tokens=-1)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
@pytest.mark.parametrize("decoder_name", ["hpd", "ar"])
@pytest.mark.parametrize("step_shape", ["packed", "fixed"])
def test_cache_memory_is_zeroed_before_it_is_read(models, tokenizer, monkeypatch, arch, decoder_name, step_shape):
    """The cache's keys and values are allocated uninitialised and zeroed only as far as forwards
    reach: filled with NaN at allocation instead, the decoding is bit for bit the same (a NaN read
    anywhere, even masked out, would spread), with shared prefixes and refilled rows; and a packed
    session zeroes less than its capacity."""
    from hpd_core.kvcache import RowCache

    rng = random.Random(9)
    requests = category_requests(rng, 4)
    config = DecodeConfig(max_value_tokens=5, max_batch_size=3, step_shape=step_shape)

    def run():
        decoder = make_decoder(decoder_name, models[arch], tokenizer, config)
        caches = []
        new_cache = decoder.runner.new_cache
        decoder.runner.new_cache = lambda rows, capacity: caches.append(new_cache(rows, capacity)) or caches[-1]
        if decoder_name == "hpd":
            layouts = decoder.prepare(requests)
            results = decoder.decode_batch(requests, layouts, None, [[[7] * 3] * lay.num_slots for lay in layouts])
            results = [(r.extra["slot_tokens"], r.extra["step_logits"]) for r in results]
        else:
            results = [(r.extra["tokens"], r.values) for r in decoder.decode(requests)]
        return results, caches

    clean, _ = run()
    nan = lambda *shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device)
    monkeypatch.setattr(RowCache, "uninitialised", staticmethod(nan))
    dirty, caches = run()
    for (tokens, other), (tokens2, other2) in zip(clean, dirty):
        assert tokens == tokens2
        if isinstance(other, torch.Tensor):
            assert torch.equal(other, other2)
        else:
            assert other == other2
    session = max(caches, key=lambda c: c.capacity)  # the session's cache (the others hold one prefix each)
    assert session.lazy and session.ready
    if step_shape == "packed":
        assert max(session.ready.values()) < session.capacity
        assert any(torch.isnan(k).any() for k in session.keys.values())  # memory never read stayed NaN
