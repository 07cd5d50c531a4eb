"""The dry-run decoder: the engine's decoder interface with no model.

It answers ``null`` for every slot and counts tokens roughly (4 characters per token), so the whole
pipeline (read, validate, stack, extract actors, write, report) runs without torch. Used for
pipeline smoke tests (``--decoder dry-run``) and the memory-boundedness test.
``seconds_per_prompt`` simulates decode time, to watch backpressure and to give tests time to kill
a running job. ``failures`` makes prompts holding given products fail, the way a real decoder can:
``raise`` (every call raises), ``flaky`` (the first call holding the product raises, later ones
succeed), ``error`` (the engine's own per-prompt error: ``Result.error`` set, as for a prompt
that does not fit in device memory even alone), ``crash`` (the process exits at once, as when
the kernel or Ray's memory monitor kills an actor for memory) or ``broken`` (from the first call
holding the product on, every call raises, whatever it holds: a device-side assert that leaves the
GPU unusable). They exercise the failure paths of
the extract stage and of the actor pool.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from hpd_core.types import Request, Result, Value

DRY_RUN = "dry-run"
CHARS_PER_TOKEN = 4  # the usual rough rate for English text with BPE vocabularies
CRASH_EXIT_CODE = 137  # what a process killed by SIGKILL reports
FAILURE_MODES = ("raise", "flaky", "error", "crash", "broken")


class DryRunFailure(RuntimeError):
    """What the dry-run decoder raises for a prompt told to fail."""


@dataclass(frozen=True)
class DryRunConfig:
    seconds_per_prompt: float = 0.0
    failures: tuple[tuple[str, str], ...] = ()  # (mode, product_id): see the module doc

    def __post_init__(self) -> None:
        if self.seconds_per_prompt < 0:
            raise ValueError(f"seconds_per_prompt must be >= 0, got {self.seconds_per_prompt}")
        for mode, product_id in self.failures:
            if mode not in FAILURE_MODES or not product_id:
                raise ValueError(f"dry-run failure must be MODE:PRODUCT_ID with MODE in {FAILURE_MODES}, "
                                 f"got {mode}:{product_id}")


def parse_failure(text: str) -> tuple[str, str]:
    """``MODE:PRODUCT_ID`` (MODE one of FAILURE_MODES) or a bare ``PRODUCT_ID`` (mode ``raise``)."""
    mode, _, product_id = text.partition(":")
    return (mode, product_id) if mode in FAILURE_MODES else ("raise", text)


def _prompt_text(request: Request) -> str:
    parts = [request.category]
    parts += [a.name + (a.description or "") for a in request.attributes]
    for product in request.products:
        parts += [product.product_id, product.title, product.description or "", *product.features]
    return "\n".join(parts)


class DryRunDecoder:
    """Same interface as ``hpd_core.decoders.load_decoder(...)``: ``decode``, ``name``, ``model_name``."""

    name = DRY_RUN
    model_name = "none"

    def __init__(self, config: DryRunConfig = DryRunConfig()) -> None:
        self.config = config
        self._failed_once: set[str] = set()  # flaky products that already failed in this decoder
        self._broken = False  # a "broken" product arrived: every call fails from then on
        self.on_prompt_done = None  # as the engine's decoders: called with each request as it finishes

    def _mode(self, request: Request) -> tuple[str, str] | None:
        ids = {product.product_id for product in request.products}
        for mode, product_id in self.config.failures:
            if product_id in ids and not (mode == "flaky" and product_id in self._failed_once):
                return mode, product_id
        return None

    def decode(self, requests: list[Request]) -> list[Result]:
        if self.config.seconds_per_prompt:
            time.sleep(self.config.seconds_per_prompt * len(requests))
        failing = [failure for failure in map(self._mode, requests) if failure and failure[0] != "error"]
        self._broken = self._broken or any(mode == "broken" for mode, _ in failing)
        if self._broken:
            raise DryRunFailure("simulated decoder failure: the device is unusable (a product marked broken arrived)")
        if any(mode == "crash" for mode, _ in failing):
            os._exit(CRASH_EXIT_CODE)  # no cleanup, no exception: like a SIGKILL
        results = []
        for request in requests:  # like the engine, prompts before a failing one finish (and are reported)
            failure = self._mode(request)
            if failure and failure[0] != "error":
                self._failed_once.update(product_id for mode, product_id in failing if mode == "flaky")
                raise DryRunFailure(f"simulated decoder failure on a prompt holding {failure[1]!r}")
            nulls = tuple(tuple(Value(None) for _ in request.attributes) for _ in request.products)
            results.append(
                Result(
                    request=request,
                    values=nulls,
                    prompt_tokens=len(_prompt_text(request)) // CHARS_PER_TOKEN,
                    generated_tokens=0 if failure else request.num_slots,  # one "null" token per slot
                    forward_passes=1,
                    decoder=self.name,
                    error=f"simulated engine error on a prompt holding {failure[1]!r}" if failure else None,
                )
            )
            if self.on_prompt_done is not None:
                self.on_prompt_done(request)
        return results
