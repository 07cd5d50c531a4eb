"""Layout (positions, anchors) and the attention rule, checked against brute-force definitions."""

from __future__ import annotations

import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpd_core import masks
from hpd_core.layout import build_layout, check_token_boundary, encode
from hpd_core.prompts import skeleton_segments

from .conftest import random_request


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), j=st.integers(1, 16), n=st.integers(1, 6), k_max=st.integers(1, 40))
def test_layout_positions_leave_k_max_gap_after_each_anchor(tokenizer, seed, j, n, k_max):
    request = random_request(random.Random(seed), j, n)
    layout = build_layout(request, tokenizer, k_max)
    assert layout.num_slots == j * n == len(skeleton_segments(request))
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


def _brute_inference(key_pos, key_valid, query_pos, offset):
    B, Q = query_pos.shape
    K = key_pos.shape[1]
    out = torch.zeros(B, Q, K, dtype=torch.bool)
    for b in range(B):
        for q in range(Q):
            for k in range(K):
                out[b, q, k] = (bool(key_valid[b, k]) and key_pos[b, k] <= query_pos[b, q]) or k == offset + q
    return out


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_inference_mask_matches_definition(data):
    B, C, Q = data.draw(st.integers(1, 3)), data.draw(st.integers(0, 8)), data.draw(st.integers(1, 5))
    ints = st.integers(0, 30)
    key_pos = torch.tensor(data.draw(st.lists(st.lists(ints, min_size=C + Q, max_size=C + Q), min_size=B, max_size=B)))
    key_valid = torch.tensor(data.draw(st.lists(st.lists(st.booleans(), min_size=C + Q, max_size=C + Q), min_size=B, max_size=B)))
    query_pos = key_pos[:, C:]
    got = masks.allowed(key_pos, key_valid, query_pos, C)
    assert torch.equal(got, _brute_inference(key_pos, key_valid, query_pos, C))
    assert got.any(-1).all()  # no query is fully masked


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


def test_step_masks_reproduce_training_mask(tokenizer):
    """Simulate the cache: keys appended in feeding order; each query's allowed set, mapped to the
    logical order, equals the training-view row of the same token."""
    rng = random.Random(3)
    layout = build_layout(random_request(rng, 2, 2), tokenizer, 4)
    fed = [[rng.randrange(100) for _ in range(rng.randint(0, 3))] for _ in range(layout.num_slots)]
    from hpd_core.reference import logical_sequence

    _, pos, gen, _ = logical_sequence(layout, fed)
    T = len(pos)
    train = masks.training_allowed(torch.tensor([pos]), torch.tensor([gen]), torch.ones(1, T, dtype=torch.bool))[0]
    order = sorted(range(T), key=lambda i: (gen[i], pos[i]))  # memory order: prompt, then step by step
    mem_pos = torch.tensor([[pos[i] for i in order]])
    for step in range(max(gen) + 1):
        idx = [m for m, i in enumerate(order) if gen[i] == step]
        C = idx[0]
        keys = slice(0, C + len(idx))
        got = masks.allowed(mem_pos[:, keys], torch.ones(1, C + len(idx), dtype=torch.bool), mem_pos[:, idx], C)[0]
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
