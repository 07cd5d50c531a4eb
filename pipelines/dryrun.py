"""The dry-run decoder: the engine's decoder interface with no model.

It answers ``null`` for every slot and counts tokens roughly (4 characters per token), so the whole
pipeline (read, validate, stack, extract actors, write, report) runs without torch. Used for
pipeline smoke tests (``--decoder dry-run``) and the memory-boundedness test.
``seconds_per_prompt`` simulates decode time, to watch backpressure and to give tests time to kill
a running job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hpd_core.types import Request, Result, Value

DRY_RUN = "dry-run"
CHARS_PER_TOKEN = 4  # the usual rough rate for English text with BPE vocabularies


@dataclass(frozen=True)
class DryRunConfig:
    seconds_per_prompt: float = 0.0

    def __post_init__(self) -> None:
        if self.seconds_per_prompt < 0:
            raise ValueError(f"seconds_per_prompt must be >= 0, got {self.seconds_per_prompt}")


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

    def decode(self, requests: list[Request]) -> list[Result]:
        if self.config.seconds_per_prompt:
            time.sleep(self.config.seconds_per_prompt * len(requests))
        results = []
        for request in requests:
            nulls = tuple(tuple(Value(None) for _ in request.attributes) for _ in request.products)
            results.append(
                Result(
                    request=request,
                    values=nulls,
                    prompt_tokens=len(_prompt_text(request)) // CHARS_PER_TOKEN,
                    generated_tokens=request.num_slots,  # one "null" token per slot
                    forward_passes=1,
                    decoder=self.name,
                )
            )
        return results
