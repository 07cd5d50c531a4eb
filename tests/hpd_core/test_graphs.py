"""Fixed steps replayed from CUDA graphs (hpd_core/graphs.py): when they apply, and on CUDA the
same tokens and pass counts as the eager steps, with rows refilled between replays."""

from __future__ import annotations

import functools
import logging
import random
from dataclasses import replace

import pytest
import torch

from hpd_core import session as session_module
from hpd_core.autoregressive import AutoregressiveDecoder, ARSession
from hpd_core.config import DecodeConfig
from hpd_core.decoders import make_decoder
from hpd_core.engine import HPDSession
from hpd_core.graphs import StepGraph, graphs_apply

from .conftest import ARCHITECTURES
from .test_session import category_requests


def test_graphs_apply_only_when_asked_on_cuda_greedy_without_host_steps():
    on = DecodeConfig()  # on by default
    assert graphs_apply(on, "cuda") and graphs_apply(on, "cuda:1")
    assert not graphs_apply(on, "cpu")
    assert not graphs_apply(DecodeConfig(cuda_graphs=False), "cuda")
    assert not graphs_apply(DecodeConfig(cuda_graphs=True, temperature=0.7), "cuda")
    assert not graphs_apply(on, "cuda", host_step=True)


def test_cuda_graphs_must_be_a_bool():
    with pytest.raises(ValueError, match="cuda_graphs"):
        DecodeConfig(cuda_graphs="yes")


def test_cuda_graphs_change_nothing_on_a_cpu(models, tokenizer):
    """Asked for on a CPU, fixed steps run eagerly: the same tokens as without."""
    requests = category_requests(random.Random(50), 3)
    base = DecodeConfig(max_value_tokens=5, max_batch_size=2, step_shape="fixed", cuda_graphs=False)
    with_graphs = DecodeConfig(max_value_tokens=5, max_batch_size=2, step_shape="fixed", cuda_graphs=True)
    for name, key in (("hpd", "slot_tokens"), ("ar", "text")):
        a = make_decoder(name, models["llama"], tokenizer, base).decode(requests)
        b = make_decoder(name, models["llama"], tokenizer, with_graphs).decode(requests)
        assert [r.extra[key] for r in a] == [r.extra[key] for r in b]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_cuda_graph_steps_equal_eager_steps(tokenizer, arch):
    """On CUDA, float32: HPD and the baseline give the same tokens and count the same forward
    passes with their fixed steps replayed from a graph as run eagerly; two rows for five prompts,
    so rows are refilled between replays."""
    from .conftest import tiny_model

    requests = category_requests(random.Random(51), 5)
    model = tiny_model(arch, len(tokenizer)).cuda()
    # pieces eager in both (compile_layers): recorded steps keep eager pieces, and compiled float32
    # kernels may round differently, which would part the tokens at a near-tie
    eager = DecodeConfig(max_value_tokens=6, max_batch_size=2, cuda_graphs=False, compile_layers="off")
    graphed = DecodeConfig(max_value_tokens=6, max_batch_size=2, cuda_graphs=True, compile_layers="off")
    for make, key in ((lambda c: make_decoder("hpd", model, tokenizer, c), "slot_tokens"),
                      (lambda c: AutoregressiveDecoder(model, tokenizer, c), "text")):  # fmt: skip
        a, b = make(eager), make(graphed)
        ra, rb = a.decode(requests), b.decode(requests)
        assert [r.extra[key] for r in rb] == [r.extra[key] for r in ra]
        assert b.runner.counts == a.runner.counts and b.runner.tokens == a.runner.tokens
        assert b.runner.graphs["captured"] >= 1 and b.runner.graphs["failed"] == 0, b.runner.graphs
        assert a.runner.graphs == {"captured": 0, "failed": 0}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_cuda_graph_steps_keep_the_confidence_of_eager_steps(tokenizer, arch):
    """On CUDA, float32: the confidences summed inside a replayed graph (in place, on the device)
    == those of eager fixed steps, rows refilled between replays."""
    from .conftest import tiny_model

    requests = category_requests(random.Random(52), 5)
    model = tiny_model(arch, len(tokenizer)).cuda()
    eager = DecodeConfig(max_value_tokens=6, max_batch_size=2, cuda_graphs=False, compile_layers="off", confidence=True)
    a, b = (make_decoder("hpd", model, tokenizer, c) for c in (eager, replace(eager, cuda_graphs=True)))
    ra, rb = a.decode(requests), b.decode(requests)
    assert [r.extra["slot_tokens"] for r in rb] == [r.extra["slot_tokens"] for r in ra]
    conf = lambda results: [v.confidence for r in results for row in r.values for v in row]
    assert conf(rb) == pytest.approx(conf(ra), rel=1e-5) and all(0 < c <= 1 for c in conf(rb))
    assert b.runner.graphs["captured"] >= 1 and b.runner.graphs["failed"] == 0, b.runner.graphs


def _failing_capture(step):
    raise RuntimeError("CUDA error: operation failed due to a previous error during capture")


def test_a_failed_capture_goes_on_eagerly_with_the_same_tokens(models, tokenizer, monkeypatch, caplog):
    """A capture that fails (here on a CPU, through the capture hook) leaves the session on eager
    steps: the same tokens and pass counts as without graphs, the failure logged and counted."""
    requests = category_requests(random.Random(52), 5)
    config = DecodeConfig(max_value_tokens=5, max_batch_size=2, step_shape="fixed")
    for name, key in (("hpd", "slot_tokens"), ("ar", "text")):
        eager = make_decoder(name, models["llama"], tokenizer, config)
        ra = eager.decode(requests)
        with monkeypatch.context() as m, caplog.at_level(logging.WARNING, logger="hpd_core.graphs"):
            m.setattr(session_module, "graphs_apply", lambda *args, **kwargs: True)
            m.setattr(session_module, "StepGraph", functools.partial(StepGraph, capture=_failing_capture))
            failing = make_decoder(name, models["llama"], tokenizer, config)
            rb = failing.decode(requests)
        assert [r.extra[key] for r in rb] == [r.extra[key] for r in ra]
        assert failing.runner.counts == eager.runner.counts and failing.runner.tokens == eager.runner.tokens
        assert failing.runner.graphs["failed"] >= 1 and failing.runner.graphs["captured"] == 0
        assert "CUDA graph capture failed" in caplog.text
        caplog.clear()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_capture_that_breaks_falls_back_to_eager_steps(tokenizer, monkeypatch):
    """On CUDA, a step that synchronises with the host cannot be captured: the capture really fails
    and the session finishes eagerly with the eager steps' tokens (HPD and the baseline)."""
    from .conftest import tiny_model

    requests = category_requests(random.Random(53), 5)
    model = tiny_model("llama", len(tokenizer)).cuda()
    for cls in (HPDSession, ARSession):
        original = cls.fixed_step
        monkeypatch.setattr(cls, "fixed_step", lambda self, f=original: (torch.cuda.current_stream().synchronize(), f(self))[1])
    for make, key in ((lambda c: make_decoder("hpd", model, tokenizer, c), "slot_tokens"),
                      (lambda c: AutoregressiveDecoder(model, tokenizer, c), "text")):  # fmt: skip
        a = make(DecodeConfig(max_value_tokens=6, max_batch_size=2, cuda_graphs=False, compile_layers="off"))
        b = make(DecodeConfig(max_value_tokens=6, max_batch_size=2, cuda_graphs=True, compile_layers="off"))
        ra, rb = a.decode(requests), b.decode(requests)
        assert b.runner.graphs["failed"] >= 1 and b.runner.graphs["captured"] == 0, b.runner.graphs
        assert [r.extra[key] for r in rb] == [r.extra[key] for r in ra]
        assert b.runner.counts == a.runner.counts and b.runner.tokens == a.runner.tokens
