"""Value confidence (``DecodeConfig.confidence``): the cached engine's against the no-cache
oracle's, in every step shape, with and without span decoding; against a plain forward where HPD
is plain decoding; and what it must not change (the tokens)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpd_core.config import DecodeConfig
from hpd_core.decoders import make_decoder
from hpd_core.layout import build_layout

from .conftest import random_request
from .test_engine import batches, comparable

SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def without_confidence(result):
    return tuple(tuple(replace(v, confidence=None) for v in row) for row in result.values)


def confidences(result):
    return [v.confidence for row in result.values for v in row]


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen3-swa"])
@pytest.mark.parametrize("step_shape", ["packed", "fixed"])
@pytest.mark.parametrize("spans", ["off", "on"])
@SETTINGS
@given(case=batches())
def test_confidence_equals_the_oracles(models, tokenizer, arch, step_shape, spans, case):
    """The engine's confidences (summed on the device, the LM head in slices or over the span
    rule's tokens) == the oracle's (log-softmax of its full, masked logits), float32; the same
    tokens as without confidence."""
    requests, k_max = case
    config = DecodeConfig(max_value_tokens=k_max, step_shape=step_shape, spans=spans, confidence=True)
    decoder = make_decoder("hpd", models[arch], tokenizer, config)
    fast = decoder.decode(requests)
    plain = make_decoder("hpd", models[arch], tokenizer, replace(config, confidence=False)).decode(requests)
    assert [without_confidence(r) for r in fast] == [r.values for r in plain]
    assert all(c is None for r in plain for c in confidences(r))
    compared = 0
    for a, b in comparable(make_decoder("reference", models[arch], tokenizer, config), requests, fast):
        assert without_confidence(a) == without_confidence(b)
        assert confidences(a) == pytest.approx(confidences(b), rel=1e-4, abs=1e-7)
        compared += 1
    assert compared or not requests
    assert sum(decoder.runner.sessions.values()) and decoder.runner.sessions[step_shape]


def test_confidence_is_the_probability_of_the_slots_tokens(models, tokenizer):
    """One product, one attribute: HPD is plain decoding of prompt + skeleton, so the confidence is
    the product of each generated token's softmax probability in one plain forward of the prompt
    and the tokens (the model's own causal mask: no HPD code involved)."""
    model = models["llama"]
    rng = random.Random(11)
    seen = []
    for _ in range(4):
        request = random_request(rng, 1, 1, 8)
        config = DecodeConfig(max_value_tokens=10, confidence=True)
        (result,) = make_decoder("hpd", model, tokenizer, config).decode([request])
        tokens = result.extra["slot_tokens"][0]
        prompt = list(build_layout(request, tokenizer, 10, config.skeleton).input_ids)
        ids = torch.tensor([prompt + tokens])
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        expected = math.exp(float(torch.log_softmax(logits, -1)[torch.arange(len(tokens)), tokens].sum()))
        (value,) = result.values[0]
        assert value.confidence == pytest.approx(expected, rel=1e-4)
        seen.append(value.confidence)
    assert all(0 < c < 1 for c in seen) and len(set(seen)) == len(seen)  # real probabilities, each its own


@pytest.mark.parametrize("step_shape", ["packed", "fixed"])
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("spans", ["off", "on"])
def test_refilled_rows_start_their_sums_again(models, tokenizer, step_shape, rows, spans):
    """Continuous batching: with fewer rows than prompts each row decodes several prompts one after
    another, and each prompt's confidences are its own (== the oracle's), not added to the last."""
    from .test_session import category_requests

    requests = category_requests(random.Random(8), 5)
    config = DecodeConfig(max_value_tokens=6, max_batch_size=rows, step_shape=step_shape, spans=spans, confidence=True)
    decoder = make_decoder("hpd", models["llama"], tokenizer, config)
    fast = decoder.decode(requests)
    assert decoder.runner.counts["prefill"] > rows  # rows were refilled
    compared = 0
    for a, b in comparable(make_decoder("reference", models["llama"], tokenizer, config), requests, fast):
        assert without_confidence(a) == without_confidence(b)
        assert confidences(a) == pytest.approx(confidences(b), rel=1e-4, abs=1e-7)
        compared += 1
    assert compared >= 3


def test_confidences_differ_from_slot_to_slot(models, tokenizer):
    """Not vacuous: the random model's slots get probabilities of their own, all in (0, 1], free
    and with span decoding."""
    rng = random.Random(5)
    requests = [random_request(rng, 3, 3) for _ in range(3)]
    free = make_decoder("hpd", models["gemma3"], tokenizer, DecodeConfig(max_value_tokens=6, confidence=True))
    spans = make_decoder("hpd", models["gemma3"], tokenizer, DecodeConfig(max_value_tokens=6, confidence=True, spans="on"))
    values = [c for r in free.decode(requests) for c in confidences(r)]
    assert all(0 < c <= 1 for c in values) and len(set(values)) > len(values) * 3 // 4
    assert all(0 < c <= 1 for r in spans.decode(requests) for c in confidences(r))


def test_confidence_is_refused_where_it_is_not_computed(models, tokenizer):
    config = DecodeConfig(max_value_tokens=4, confidence=True)
    with pytest.raises(ValueError, match="baseline gives its values none"):
        make_decoder("ar", models["llama"], tokenizer, config)
    request = random_request(random.Random(1), 1, 2)
    with pytest.raises(ValueError, match="teacher forcing and confidence"):
        make_decoder("hpd", models["llama"], tokenizer, config).decode([request], forced=[[[5], [6]]])
    with pytest.raises(ValueError, match="confidence must be a bool"):
        DecodeConfig(confidence=1)


@pytest.mark.parametrize("chunk", [7, 64, 100_000])
@pytest.mark.parametrize("softcap", [None, 0.5])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_runner_log_probabilities_equal_the_full_log_softmax(models, tokenizer, chunk, softcap, temperature):
    """ModelRunner's log-probabilities (the LM head over vocabulary slices with a running
    log-sum-exp; over the union of allowed tokens) == log-softmax of the whole logits (masked to
    the allowed tokens), temperature 1 whichever picked the tokens; the same tokens as without."""
    from hpd_core.runner import ModelRunner
    from hpd_core.sampling import make_generator

    runner = ModelRunner(models["gemma3"], tokenizer)
    runner.vocab_chunk, runner.softcap = chunk, softcap
    config = DecodeConfig(temperature=temperature, seed=3)
    torch.manual_seed(2)
    hidden = torch.randn(24, runner.head.weight.shape[1]) * 3
    with torch.no_grad():
        full = torch.log_softmax(runner.logits(hidden), -1)
        tokens, logprob = runner.next_tokens(hidden, config, make_generator(config, "cpu"), scores=True)
        assert torch.equal(tokens, runner.next_tokens(hidden, config, make_generator(config, "cpu")))
        assert torch.allclose(logprob, full[torch.arange(24), tokens], atol=1e-5)
        rng = random.Random(4)
        allowed = [sorted(rng.sample(range(runner.vocab_size), 1 if i % 4 == 0 else rng.randint(2, 40))) for i in range(24)]
        tokens, logprob = runner.allowed_tokens(hidden, allowed, config, make_generator(config, "cpu"), scores=True)
        assert torch.equal(tokens, runner.allowed_tokens(hidden, allowed, config, make_generator(config, "cpu")))
        for i, (token, among) in enumerate(zip(tokens.tolist(), allowed)):
            assert token in among
            expected = full[i, token] - full[i, among].logsumexp(0)
            assert float(logprob[i]) == pytest.approx(float(expected), abs=1e-5)
    assert (logprob[[len(a) == 1 for a in allowed]] == 0).all()  # one allowed token (6 queries): probability 1
    assert (logprob[[len(a) > 1 for a in allowed]] < 0).all()
