"""Layout (positions, anchors) and the attention rule, checked against brute-force definitions."""

from __future__ import annotations

import json
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpd_core import masks
from hpd_core.config import SKELETONS
from hpd_core.layout import beyond_window, build_layout, check_token_boundary, encode, encode_prompt
from hpd_core.prompts import _product_fields, render_prompt, skeleton_segments, special_texts

from .conftest import random_request


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), j=st.integers(1, 16), n=st.integers(1, 6), k_max=st.integers(1, 40),
       skeleton=st.sampled_from(SKELETONS))
def test_layout_positions_leave_k_max_gap_after_each_anchor(tokenizer, seed, j, n, k_max, skeleton):
    request = random_request(random.Random(seed), j, n)
    layout = build_layout(request, tokenizer, k_max, skeleton)
    assert layout.num_slots == j * n == len(skeleton_segments(request, skeleton))
    pos = layout.position_ids
    anchors = set(layout.anchor_index)
    for i in range(1, len(pos)):
        gap = pos[i] - pos[i - 1]
        assert gap == (1 + k_max if (i - 1) in anchors else 1)
    assert layout.anchor_index[-1] == len(layout.input_ids) - 1  # the skeleton ends at the last key
    for s, a in enumerate(layout.anchor_index):  # an anchor is the last token of its key
        assert tokenizer.decode(layout.input_ids[a]).endswith(":")
        assert layout.value_position(s, 1) == pos[a] + 1
        assert layout.value_position(s, k_max) < (pos[a + 1] if a + 1 < len(pos) else float("inf"))


def test_layout_tokens_are_prompt_and_skeleton(tokenizer):
    request = random_request(random.Random(1), 3, 2)
    layout = build_layout(request, tokenizer, 5)
    text = tokenizer.decode(layout.input_ids)
    assert text.endswith("".join(skeleton_segments(request)))
    assert check_token_boundary(tokenizer, request)


def _brute(key_pos, key_gen, key_valid, query_pos, query_gen, offset, window):
    """DESIGN.md's rule spelled out one (query, key) pair at a time."""
    B, Q = query_pos.shape
    K = key_pos.shape[1]
    out = torch.zeros(B, Q, K, dtype=torch.bool)
    for b in range(B):
        for q in range(Q):
            for k in range(K):
                in_window = window is None or int(query_pos[b, q]) - int(key_pos[b, k]) < window
                out[b, q, k] = (
                    bool(key_valid[b, k])
                    and key_pos[b, k] <= query_pos[b, q]
                    and key_gen[b, k] <= query_gen[b, q]
                    and in_window
                ) or k == offset + q
    return out


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_rule_matches_definition(data):
    B, C, Q = data.draw(st.integers(1, 3)), data.draw(st.integers(0, 8)), data.draw(st.integers(1, 5))
    grid = lambda values: torch.tensor(data.draw(st.lists(st.lists(values, min_size=C + Q, max_size=C + Q), min_size=B, max_size=B)))
    key_pos, key_gen, key_valid = grid(st.integers(0, 30)), grid(st.integers(0, 3)), grid(st.booleans())
    window = data.draw(st.one_of(st.none(), st.integers(1, 12)))
    query_pos, query_gen = key_pos[:, C:], key_gen[:, C:]
    got = masks.allowed(key_pos, key_gen, key_valid, query_pos, query_gen, C, window)
    assert torch.equal(got, _brute(key_pos, key_gen, key_valid, query_pos, query_gen, C, window))
    assert got.any(-1).all()  # no query is fully masked
    own = (torch.arange(Q) + C).expand(B, Q)  # the same queries' places given one by one
    assert torch.equal(masks.allowed(key_pos, key_gen, key_valid, query_pos, query_gen, own, window), got)


def test_training_mask_is_the_design_rule():
    """Spell out DESIGN.md's training view on a small layout: prompt P, keys K1 K2 with gaps,
    value tokens a1 a2 (slot 1) and b1 b2 (slot 2), in logical order."""
    #            P  K1 a1 a2 K2 b1 b2
    pos = [0, 1, 2, 3, 12, 13, 14]  # K_max = 10 gap after each anchor
    gen = [0, 0, 1, 2, 0, 1, 2]
    names = ["P", "K1", "a1", "a2", "K2", "b1", "b2"]
    allowed = masks.training_allowed(torch.tensor([pos]), torch.tensor([gen]), torch.ones(1, 7, dtype=torch.bool))[0]
    sees = {names[q]: {names[k] for k in range(7) if allowed[q, k]} for q in range(7)}
    assert sees["K2"] == {"P", "K1", "K2"}  # skeleton sees no value token
    assert sees["a1"] == {"P", "K1", "a1"}
    assert sees["b1"] == {"P", "K1", "a1", "K2", "b1"}  # token k' of an earlier slot iff k' <= k
    assert sees["b2"] == {"P", "K1", "a1", "a2", "K2", "b1", "b2"}
    windowed = masks.training_allowed(torch.tensor([pos]), torch.tensor([gen]), torch.ones(1, 7, dtype=torch.bool), 12)[0]
    assert {names[k] for k in range(7) if windowed[6, k]} == {"a2", "K2", "b1", "b2"}  # 14 - p < 12


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), j=st.integers(1, 4), n=st.integers(1, 4), k_max=st.integers(1, 6),
       window=st.one_of(st.none(), st.integers(1, 60)))
def test_step_masks_reproduce_training_mask(tokenizer, seed, j, n, k_max, window):
    """The two views of the one rule agree on random layouts: simulate the cache (keys appended in
    feeding order: prompt, then step by step); each step query's allowed set, mapped to the logical
    order, equals the training-view row of the same token, with and without a window."""
    rng = random.Random(seed)
    layout = build_layout(random_request(rng, j, n), tokenizer, k_max)
    fed = [[rng.randrange(100) for _ in range(rng.randint(0, k_max - 1))] for _ in range(layout.num_slots)]
    from hpd_core.reference import logical_sequence

    _, pos, gen, _ = logical_sequence(layout, fed)
    T = len(pos)
    train = masks.training_allowed(torch.tensor([pos]), torch.tensor([gen]), torch.ones(1, T, dtype=torch.bool), window)[0]
    order = sorted(range(T), key=lambda i: (gen[i], pos[i]))  # memory order: prompt, then step by step
    mem_pos = torch.tensor([[pos[i] for i in order]])
    mem_gen = torch.tensor([[gen[i] for i in order]])
    for step in range(max(gen) + 1):
        idx = [m for m, i in enumerate(order) if gen[i] == step]
        C = idx[0]
        keys = slice(0, C + len(idx))
        present = torch.ones(1, C + len(idx), dtype=torch.bool)
        got = masks.allowed(mem_pos[:, keys], mem_gen[:, keys], present, mem_pos[:, idx], mem_gen[:, idx], C, window)[0]
        for q, m in enumerate(idx):
            logical_q = order[m]
            expected = {order[k] for k in range(C + len(idx)) if got[q, k]}
            assert expected == {k for k in range(T) if train[logical_q, k]}


def test_additive_mask_values():
    mask = torch.tensor([[[True, False]]])
    add = masks.additive(mask, torch.float32)
    assert add.shape == (1, 1, 1, 2)
    assert add[0, 0, 0, 0] == 0 and add[0, 0, 0, 1] == torch.finfo(torch.float32).min


def test_encode_has_no_special_tokens(tokenizer):
    assert encode(tokenizer, "abc") == tokenizer("abc", add_special_tokens=False)["input_ids"]


def _with_bos(tokenizer):
    """The fixture tokenizer, but its own encoding starts every sequence with <eos> as a BOS (as
    Gemma's does with <bos>), while its ``add_bos_token`` flag says nothing about it."""
    import copy

    from tokenizers import processors

    tok = copy.deepcopy(tokenizer)
    bos = tok.convert_tokens_to_ids("<eos>")
    tok._tokenizer.post_processor = processors.TemplateProcessing(single="<eos> $A", special_tokens=[("<eos>", bos)])
    return tok, bos


def test_prompt_starts_as_the_tokenizers_own_encoding(tokenizer):
    from hpd_core.layout import encode_prompt, start_ids

    request = random_request(random.Random(4), 2, 2)
    assert start_ids(tokenizer) == []
    assert build_layout(request, tokenizer, 4).input_ids[0] != tokenizer.convert_tokens_to_ids("<eos>")
    tok, bos = _with_bos(tokenizer)
    assert tok("a")["input_ids"][0] == bos and start_ids(tok) == [bos]
    layout = build_layout(request, tok, 4)
    assert layout.input_ids[0] == bos and layout.input_ids[1] != bos
    assert list(layout.input_ids[1:]) == list(build_layout(request, tokenizer, 4).input_ids)
    assert encode_prompt(tok, "<eos>abc") == encode(tok, "<eos>abc")  # already there: not doubled


def test_baseline_and_training_prompts_start_with_bos_too(models, tokenizer):
    from hpd_core.autoregressive import AutoregressiveDecoder
    from hpd_core.collate import Example, ar_features, hpd_features
    from hpd_core.config import DecodeConfig

    tok, bos = _with_bos(tokenizer)
    request = random_request(random.Random(5), 2, 2)
    example = Example(request, tuple((None, "red") for _ in request.products))
    assert hpd_features(tok, example, 4).input_ids[0] == bos
    assert ar_features(tok, example).input_ids[0] == bos
    assert AutoregressiveDecoder(models["llama"], tok, DecodeConfig()).prompt_ids(request)[0] == bos


def test_decoders_refuse_a_tokenizer_that_splits_key_and_value_differently(models, tokenizer):
    """A vocabulary whose tokens cross the key/value boundary (here, BPE without a pre-tokenizer
    split, so ``: "`` and ``: null`` merge) fails loudly when an HPD decoder is built; the fixture's
    byte-level BPE passes, and the baseline (no split) accepts either."""
    from tokenizers import Tokenizer, decoders, models as bpe_models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from hpd_core.autoregressive import AutoregressiveDecoder
    from hpd_core.config import DecodeConfig
    from hpd_core.decoders import make_decoder
    from hpd_core.layout import BOUNDARY_SAMPLE, require_token_boundary

    bpe = Tokenizer(bpe_models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = ['{"Brand": "Acme 500", "Size": null, "Item Form": "10"}\n' * 3] * 200
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(corpus, trainer)
    merged = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="<pad>")
    assert not check_token_boundary(merged, BOUNDARY_SAMPLE)
    require_token_boundary(tokenizer)  # the fixture's tokenizer splits where the JSON text does
    for skeleton in ("after-products", "interleaved"):
        with pytest.raises(ValueError, match="does not split a key from its value"):
            make_decoder("hpd", models["llama"], merged, DecodeConfig(skeleton=skeleton))
        with pytest.raises(ValueError, match="does not split a key from its value"):
            make_decoder("reference", models["llama"], merged, DecodeConfig(skeleton=skeleton))
    AutoregressiveDecoder(models["llama"], merged, DecodeConfig())


def test_interleaved_skeleton_puts_each_products_text_before_its_keys(tokenizer):
    request = random_request(random.Random(6), 3, 2)
    text = tokenizer.decode(build_layout(request, tokenizer, 4, "interleaved").input_ids)
    answer = text[text.index("{\n"):]
    for j, product in enumerate(request.products):
        own = answer.index(product.title.replace('"', '\\"')[:8])
        first_key = answer.index(f'"{request.attributes[0].name}":', own)
        assert own < first_key  # the product's text, then its keys
        if j + 1 < len(request.products):
            assert first_key < answer.index(f'"{j + 2}": {{')  # before the next product opens
    prompt = text[: text.index("{\n")]
    assert all(json.dumps(p.title, ensure_ascii=False) not in prompt for p in request.products)  # not in the instructions


def _text_ends(request, tokenizer, layout) -> list[int]:
    """Index in ``layout.input_ids`` of the last token of each product's own fields, read off the
    interleaved skeleton's segments tokenized as build_layout tokenizes them."""
    segments = skeleton_segments(request, "interleaved", special_texts(tokenizer))
    segments[0] = render_prompt(request, tokenizer, "interleaved") + segments[0]
    n, ends = len(request.attributes), []
    for j in range(len(request.products)):
        s = j * n
        fields = _product_fields(request, j)
        head = segments[s][: segments[s].rindex(fields) + len(fields)]
        ids = encode_prompt(tokenizer, head) if s == 0 else encode(tokenizer, head)
        start = 0 if s == 0 else layout.anchor_index[s - 1] + 1
        ends.append(start + len(ids) - 1)
    return ends


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), j=st.integers(1, 3), n=st.integers(1, 6), k_max=st.integers(1, 12),
       window=st.integers(2, 60))
def test_a_slot_beyond_the_window_sees_none_of_its_products_text(tokenizer, seed, j, n, k_max, window):
    """``beyond_window`` counts the slots whose first value token may not attend, under the rule in a
    sliding layer of that window, to the last token of their product's text (so to none of it),
    and no other slots; the text's end is found by tokenizing the skeleton up to it."""
    request = random_request(random.Random(seed), j, n)
    layout = build_layout(request, tokenizer, k_max, "interleaved")
    ends = _text_ends(request, tokenizer, layout)
    blind, T = 0, len(layout.input_ids)
    for s in range(layout.num_slots):
        query = torch.tensor([[layout.value_position(s, 1)]])  # as the last key too: a query sees itself
        pos = torch.cat([torch.tensor([layout.position_ids]), query], 1)
        gen = torch.cat([torch.zeros(1, T, dtype=torch.long), torch.ones_like(query)], 1)
        valid = torch.ones_like(pos, dtype=torch.bool)
        sees = masks.allowed(pos, gen, valid, query, torch.ones_like(query), T, window)
        blind += not sees[0, 0, ends[s // n]].item()
    assert beyond_window(layout, window) == blind
    assert beyond_window(layout, None) == 0
    assert layout.last_position == max(layout.anchor_pos) + k_max


def _requests(seed: int, n: int) -> list:
    rng = random.Random(seed)
    return [random_request(rng, rng.randint(1, 6), rng.randint(1, 5)) for _ in range(n)]


@pytest.mark.parametrize("bos", [False, True])
def test_a_batch_is_tokenized_as_each_request_alone(tokenizer, models, bos):
    """The decoders' batched preparation (one tokenizer call for every text of every request) gives
    what tokenizing each text alone gives: the layouts, the baseline's prompts and budgets, and
    the shared prefixes' lengths, with and without a tokenizer that starts sequences with a BOS."""
    from hpd_core.autoregressive import AutoregressiveDecoder
    from hpd_core.config import DecodeConfig
    from hpd_core.engine import HPDDecoder
    from hpd_core.layout import build_layouts, encode_many

    tok = _with_bos(tokenizer)[0] if bos else tokenizer
    requests = _requests(7, 12)
    texts = [render_prompt(r, tok) for r in requests] + ["", "ü café \"x\" <eos> <pad>", "a"]
    assert encode_many(tok, texts) == [encode(tok, t) for t in texts]
    assert encode_many(tok, []) == [] and build_layouts([], tok, 4) == []
    for skeleton in SKELETONS:
        assert build_layouts(requests, tok, 7, skeleton) == [build_layout(r, tok, 7, skeleton) for r in requests]
    for config in (DecodeConfig(max_value_tokens=7), DecodeConfig(max_value_tokens=7, skeleton="interleaved")):
        hpd = HPDDecoder(models["llama"], tok, config)
        layouts = hpd.prepare(requests)
        assert hpd.prompts(requests, layouts) == [hpd.prompt(r, lay) for r, lay in zip(requests, layouts)]
        assert any(p.prefix for p in hpd.prompts(requests, layouts))
    ar = AutoregressiveDecoder(models["llama"], tok, DecodeConfig(max_value_tokens=7))
    items = ar.prepare(requests)
    assert items == [(ar.prompt_ids(r), ar.answer_budget(r)) for r in requests]
    assert ar.prepare(requests, budgets=list(range(12))) == [(ids, n) for n, (ids, _) in enumerate(items)]
    prompts = [ids for ids, _ in items]
    assert ar.prompts(requests, prompts) == [ar.prompt(r, ids) for r, ids in zip(requests, prompts)]
    assert any(p.prefix for p in ar.prompts(requests, prompts))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma3-270m", "smollm2-135m"])
def test_each_shipped_tokenizer_tokenizes_a_batch_as_each_text_alone(name):
    """``encode_many`` and ``build_layouts`` against one call per text with the real tokenizers
    (Gemma's adds a BOS; both have special tokens a product text might contain)."""
    from transformers import AutoTokenizer

    from hpd_core.config import ModelConfig
    from hpd_core.layout import build_layouts, encode_many
    from hpd_core.models import prepare_tokenizer, resolve_model_dir

    tok = AutoTokenizer.from_pretrained(resolve_model_dir(ModelConfig(name=name)))
    prepare_tokenizer(tok)
    requests = _requests(8, 20)
    texts = [render_prompt(r, tok) for r in requests] + ["", "<bos> <eos> <|im_end|> 日本語 🙂", "  two  spaces "]
    assert encode_many(tok, texts) == [encode(tok, t) for t in texts]
    for skeleton in SKELETONS:
        assert build_layouts(requests, tok, 30, skeleton) == [build_layout(r, tok, 30, skeleton) for r in requests]
