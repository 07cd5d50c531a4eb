"""The extract stage: a Ray Data actor that loads a decoder once and turns chunks into output rows.

Per chunk: prepared rows -> engine requests (one per stack) -> ``decoder.decode`` -> one output row
per (product, attribute), and rejected rows for validation failures (passed through) and for
prompts the decoder could not decode. torch and the engine are imported when the first chunk with
products arrives (a chunk of rejected rows, or an empty input, never loads a model), and never on
the driver or in the CPU stages.

Failures are per prompt: a decoder call that raises is retried with each of its prompts alone
(``decode_attempts`` tries per prompt in all), so one bad prompt costs only its own products, which
become rejected rows (stage ``extract``) with the error as the reason; a prompt the engine itself
reports as failed (``Result.error``, e.g. it does not fit in device memory even alone, after the
engine's own split-and-retry) is rejected at once. When every prompt of a call fails alone the
decoder itself is broken: the chunk fails and the job stops (a resume tries it again) rather than rejecting
the whole catalog; a call whose only prompt fails is told apart from a broken decoder by a probe
(``ExtractStage._probed``).

The requests of a chunk are decoded in calls of ``prompts_per_call`` (longest-first order, so that
a call's prompts have similar lengths, as the engine's own batches do). The decoder reports each
prompt as it finishes (``on_prompt_done``) and the stage tells the driver's progress counter its
products, each request once (also when a failed call is retried prompt by prompt), so progress
moves inside a chunk and inside a call; for a decoder without that hook, after each call. The
counts are summed and sent at most every ``progress_seconds`` (and at the end of the chunk): one
actor call per prompt cost the counter and the stage about half the CPU of a dry run at 1M rows.

Each result row carries the chunk's ledger by row identity (row index in the shard): the rows read
and, for each, where it went (written, rejected, skipped). The writer checks it against the files
before it commits (pipelines/accounting.py).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass, field, replace

import pyarrow as pa

from hpd_core.config import DECODERS, DEFAULT_MODEL, DecodeConfig, ModelConfig
from hpd_core.spans import in_text
from hpd_core.types import Product, Request, Result
from pipelines import io
from pipelines.artifacts import resolve_model_path
from pipelines.commit import REJECTED_SCHEMA, attributes_schema
from pipelines.dryrun import DRY_RUN, DryRunConfig, DryRunDecoder
from pipelines.prepare import OK, REJECTED, SKIPPED, UNHELD_STAGES
from pipelines.report import COUNTERS
from pipelines.schema import AttributeSchema
from pipelines.stacking import build_requests

EXTRACT_DECODERS = (*DECODERS, DRY_RUN)

RESULT_SCHEMA = pa.schema(
    [
        ("chunk", pa.string()),
        ("shard", pa.string()),
        ("index", pa.int64()),
        ("attributes", pa.binary()),  # Arrow IPC, commit.attributes_schema
        ("rejected", pa.binary()),  # Arrow IPC, REJECTED_SCHEMA
        ("categories", pa.list_(pa.string())),  # every category a partition file may exist for
        ("owned_ids", pa.list_(pa.string())),  # product ids this chunk owns (dedup)
        ("rejected_ids", pa.list_(pa.string())),
        ("stats", pa.string()),  # JSON counters, see report.COUNTERS
        # the ledger (pipelines/accounting.py): row indices in the shard
        ("read_rows", pa.list_(pa.int64())),
        ("read_ids", pa.list_(pa.string())),  # product id of each read row (None if it has none)
        ("written_rows", pa.list_(pa.int64())),
        ("rejected_rows", pa.list_(pa.int64())),  # in the order of the rejected table
        ("skipped_rows", pa.list_(pa.int64())),
    ]
)
log = logging.getLogger("hpd.extract")
SPAN_DECODERS = ("hpd", "ar", "reference")  # the decoders with span decoding (DecodeConfig.spans)
CONFIDENCE_DECODERS = ("hpd", "reference")  # the decoders that give values a confidence (DecodeConfig.confidence)
# --compile-layers auto compiles only for jobs of at least this many products an actor: each actor
# compiles once, about 11 s on a CPU with an empty inductor cache (1 s with a warm one), and on the
# 2-core CPU the compiled pieces saved about 2 ms a title (session 45: 491 OA-Mine titles in one
# actor, busy decoding 35.5 s eager, 34.4 s compiled with a warm cache, 46.5 s with an empty one)
COMPILE_MIN_PRODUCTS_PER_ACTOR = 2048
PROBE_ID = "hpd-extract-probe"  # the made-up product that tells a broken decoder from a bad prompt (ExtractStage._probed)


@dataclass(frozen=True)
class ExtractConfig:
    """The engine part of the job: which decoder and model, and the attributes per category.

    model_uri / adapter_uri may be ``s3://`` prefixes: each node copies them once into its cache
    before the engine's ModelConfig (which refuses S3 names) is built.
    prompts_per_call: prompts per decoder call (None: the
        engine's ``max_batch_size``, so a call is about one engine batch and costs no throughput).
    decode_attempts: tries per prompt before its products are rejected (see the module doc).
    progress_seconds: how often at most an actor tells the driver's progress counter the products
        it has decoded (0: after every prompt).
    values_in_text: a value that does not occur in its own product's text (title, description or
        one feature, exactly as the model saw them) is written as null and counted
        (``values_not_in_text``). Attribute values are spans of the product's text; a value that is
        not one was invented, normalised, or copied from another product of the prompt.
    """

    decoder: str
    schema: AttributeSchema
    run_id: str
    model_uri: str = DEFAULT_MODEL
    adapter_uri: str | None = None
    dtype: str = "auto"  # resolved per actor from its device (hpd_core.models.resolve_dtype)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    dry_run: DryRunConfig = field(default_factory=DryRunConfig)
    prompts_per_call: int | None = None
    decode_attempts: int = 2
    progress_seconds: float = 0.5
    values_in_text: bool = True

    def __post_init__(self) -> None:
        if self.decoder not in EXTRACT_DECODERS:
            raise ValueError(f"decoder must be one of {EXTRACT_DECODERS}, got {self.decoder!r}")
        if self.prompts_per_call is not None and (not isinstance(self.prompts_per_call, int) or self.prompts_per_call < 1):
            raise ValueError(f"prompts_per_call must be a positive int, got {self.prompts_per_call!r}")
        if not isinstance(self.decode_attempts, int) or self.decode_attempts < 1:
            raise ValueError(f"decode_attempts must be a positive int, got {self.decode_attempts!r}")
        if self.decode.spans == "on" and self.decoder not in SPAN_DECODERS:  # "auto" leaves the others plain
            raise ValueError(f"spans must go with --decoder {' or '.join(SPAN_DECODERS)}, got {self.decoder}")
        if self.decode.confidence and self.decoder not in CONFIDENCE_DECODERS:
            raise ValueError(f"confidence must go with --decoder {' or '.join(CONFIDENCE_DECODERS)}, got {self.decoder}")
        if not isinstance(self.values_in_text, bool):
            raise ValueError(f"values_in_text must be a bool, got {self.values_in_text!r}")
        if not isinstance(self.progress_seconds, (int, float)) or self.progress_seconds < 0:
            raise ValueError(f"progress_seconds must be a number >= 0, got {self.progress_seconds!r}")
        self.model_config("cpu", resolve=False)  # validates dtype and names once, at job start

    def sized_for(self, products_per_actor: float) -> ExtractConfig:
        """This config for a job of ``products_per_actor``: ``--compile-layers auto`` runs eagerly
        below ``COMPILE_MIN_PRODUCTS_PER_ACTOR``, where compiling costs an actor more than it saves
        (speed only: not part of a run's identity)."""
        if self.decode.compile_layers != "auto" or products_per_actor >= COMPILE_MIN_PRODUCTS_PER_ACTOR:
            return self
        return replace(self, decode=replace(self.decode, compile_layers="off"))

    @property
    def call_size(self) -> int:
        return self.prompts_per_call or self.decode.max_batch_size

    def model_config(self, device: str, resolve: bool = True) -> ModelConfig:
        def local(uri: str | None) -> str | None:
            if uri is None or not uri.startswith("s3://"):
                return uri
            return resolve_model_path(uri) if resolve else "/s3-artifact-resolved-on-each-node"

        return ModelConfig(name=local(self.model_uri), adapter=local(self.adapter_uri), dtype=self.dtype, device=device)


def actor_device() -> str:
    """CUDA when Ray gave this actor a GPU, else CPU."""
    import ray

    return "cuda" if ray.get_gpu_ids() else "cpu"


def load(config: ExtractConfig):
    """The decoder for this actor (dry-run, or the engine's, on ``actor_device()``)."""
    if config.decoder == DRY_RUN:
        return DryRunDecoder(config.dry_run)
    from hpd_core.decoders import load_decoder  # torch + transformers: once per actor

    return load_decoder(config.decoder, config.model_config(actor_device()), config.decode)


def run_spans(config: ExtractConfig) -> bool | None:
    """Whether this actor decodes values as spans (``--spans auto`` resolved), None for the dry run."""
    if config.decoder not in SPAN_DECODERS:
        return None
    return config.decode.span_decoding(actor_device())


def run_dtype(config: ExtractConfig) -> str | None:
    """The dtype this actor's model runs in (``--dtype auto`` resolved), None for the dry run."""
    if config.decoder == DRY_RUN:
        return None
    from hpd_core.models import resolve_dtype

    return resolve_dtype(config.dtype, actor_device())


def _text_length(request: Request) -> int:
    """A cheap stand-in for the prompt's token count (to group prompts of similar length)."""
    return sum(len(p.title) + len(p.description or "") + sum(map(len, p.features)) for p in request.products)


def _reason(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:500]


class ExtractStage:
    """Ray Data callable class: constructed once per actor, called once per chunk row.

    ``progress``: the driver's progress counter (pipelines/progress.py), or None.
    """

    def __init__(self, config: ExtractConfig, threads: int | None = None, progress=None) -> None:
        self.config = config
        self.threads = threads
        self.progress = progress
        self.actor = f"{socket.gethostname()}:{os.getpid()}"
        self._decoder = None
        self.dtype: str | None = None  # known once the model is loaded
        self.spans: bool | None = None  # likewise

    @property
    def decoder(self):
        return self.load_decoder()

    def load_decoder(self):
        """Loaded on first use: chunks without products never load a model."""
        if self._decoder is None:
            if self.threads is not None and self.config.decoder != DRY_RUN:
                import torch

                torch.set_num_threads(self.threads)  # CPU actors: see build.size_actors
            self._decoder = load(self.config)
            self.dtype = run_dtype(self.config)
            self.spans = run_spans(self.config)
        return self._decoder

    def compiled(self) -> bool | None:
        """Whether this actor's forwards run the layers' compiled pieces (``--compile-layers``
        resolved, and still so after any fallback to eager); None before a model is loaded and for
        the dry run."""
        if self._decoder is None or self.config.decoder == DRY_RUN:
            return None
        return self._decoder.layers_compiled()

    def __call__(self, batch: pa.Table) -> pa.Table:
        return pa.Table.from_pylist([self._chunk(row) for row in batch.to_pylist()], schema=RESULT_SCHEMA)

    def _tell(self, method: str, *args) -> None:
        if self.progress is not None:
            getattr(self.progress, method).remote(*args)  # fire and forget

    def _call(self, requests: list[Request]) -> list[Result]:
        results = self.decoder.decode(requests)
        if len(results) != len(requests):
            raise RuntimeError(f"decoder {self.decoder.name} returned {len(results)} results for {len(requests)} requests")
        return results

    def _decode_alone(self, request: Request, tries: int) -> Result | str:
        """One prompt on its own, ``tries`` times at most; the last error's reason if all fail."""
        reason = "not tried"
        for _ in range(tries):
            try:
                return self._call([request])[0]
            except Exception as err:  # a per-prompt failure: the prompt's rows are rejected with it
                reason = _reason(err)
                log.warning("prompt of %d products (%s) failed alone: %s", len(request.products), request.category, reason)
        return reason

    def _decode(self, requests: list[Request]) -> list[Result | str]:
        """Results in request order; a str where the prompt failed (the reason)."""
        try:
            return list(self._call(requests))
        except Exception as err:  # isolate the prompt(s) that fail: retried alone below
            if self.config.decode_attempts == 1:
                return self._probed(requests, [_reason(err)] * len(requests))
            log.warning("decoder call with %d prompts failed (%s); retrying each prompt alone", len(requests), _reason(err))
        outcomes = [self._decode_alone(request, self.config.decode_attempts - 1) for request in requests]
        if len(requests) > 1 and all(isinstance(outcome, str) for outcome in outcomes):
            raise RuntimeError(f"every one of {len(requests)} prompts failed, also alone (the decoder itself is failing): "
                               f"{outcomes[0]}")
        return self._probed(requests, outcomes)

    def _probed(self, requests: list[Request], outcomes: list[Result | str]) -> list[Result | str]:
        """``outcomes``, once a decoder whose every prompt of a call failed has decoded a probe: one
        made-up product of the first prompt's category. A call of one prompt (a chunk's last, or
        with ``decode_attempts`` 1 any call) cannot tell a bad prompt from a broken decoder (a GPU
        after a device-side assert) by itself; committing its products as rejected would lose them
        for good. A probe that fails too fails the chunk, and the job stops (a resume tries it again)."""
        if not all(isinstance(outcome, str) for outcome in outcomes):
            return outcomes
        probe = replace(requests[0], products=(Product(PROBE_ID, "probe", None, ()),))
        hook = getattr(self.decoder, "on_prompt_done", None)
        try:
            if hook is not None:
                self.decoder.on_prompt_done = None  # the probe is no product of the chunk's progress
            self._call([probe])
        except Exception as err:
            raise RuntimeError(f"a prompt failed ({outcomes[0]}), and so did a one-product probe: the decoder itself "
                               f"is failing: {_reason(err)}") from err
        finally:
            if hook is not None:
                self.decoder.on_prompt_done = hook
        return outcomes

    def _decode_chunk(self, chunk: str, requests: list[Request]) -> list[Result | str]:
        """All requests of a chunk, in calls of ``call_size`` prompts of similar length, reporting
        progress (the decoder loaded: loading is not decoding)."""
        self._tell("start", chunk, sum(len(r.products) for r in requests))
        outcomes: list[Result | str | None] = [None] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: -_text_length(requests[i]))
        size = self.config.call_size
        told: set[int] = set()  # requests already counted (a prompt retried alone is not counted twice)
        untold = [0, time.monotonic()]  # products counted but not yet sent; when they were last sent

        def tell(products: int, now: bool = False) -> None:
            untold[0] += products
            if untold[0] and (now or time.monotonic() - untold[1] >= self.config.progress_seconds):
                self._tell("add", chunk, untold[0])
                untold[:] = [0, time.monotonic()]

        def done(request: Request) -> None:  # the engine's sessions call this as each prompt finishes
            if id(request) not in told:
                told.add(id(request))
                tell(len(request.products))

        for start in range(0, len(order), size):
            part = order[start : start + size]
            if hasattr(self.decoder, "on_prompt_done"):
                self.decoder.on_prompt_done = done
            try:
                for i, outcome in zip(part, self._decode([requests[i] for i in part])):
                    outcomes[i] = outcome
            finally:
                if hasattr(self.decoder, "on_prompt_done"):
                    self.decoder.on_prompt_done = None
            rest = [requests[i] for i in part if id(requests[i]) not in told]  # failed, or a decoder without sessions
            told.update(id(r) for r in rest)
            tell(sum(len(r.products) for r in rest))
        tell(0, now=True)  # the chunk's last products
        return outcomes  # type: ignore[return-value]

    def _engine_counts(self) -> Counter:
        """This actor's engine counters so far: CUDA graph captures that failed (hpd_core/graphs.py)
        and batches by step shape; none without an engine (dry run, the reference decoder)."""
        runner = getattr(self._decoder, "runner", None)
        if runner is None:
            return Counter()
        return Counter(cuda_graph_failures=runner.graphs["failed"], batches_fixed_steps=runner.sessions["fixed"],
                       batches_packed_steps=runner.sessions["packed"])

    def _chunk(self, chunk: dict) -> dict:
        rows = io.table_from_bytes(chunk["payload"]).to_pylist()
        stats = Counter(dict.fromkeys(COUNTERS, 0))
        stats.update(rows_in=len(rows))
        ok = [row["status"] == OK for row in rows]
        products = [
            Product(row["product_id"], row["title"], row["description"], tuple(row["features"] or ())) if good else None
            for row, good in zip(rows, ok)
        ]
        requests = build_requests(
            [row["stack"] for row in rows], [row["category"] for row in rows], products, self.config.schema
        )
        if requests:
            self.load_decoder()  # loading is not decoding: the model loads before the clock starts
        started = time.perf_counter()
        engine = self._engine_counts()
        outcomes = self._decode_chunk(chunk["chunk"], [request for request, _ in requests]) if requests else []
        stats.update(self._engine_counts() - engine)
        decode_seconds = time.perf_counter() - started

        attributes, failed, written = [], {}, []
        by_category: dict[str, Counter] = {}  # the report's per-category products and values
        for (request, positions), result in zip(requests, outcomes):
            if isinstance(result, str):  # the decoder raised for this prompt, also alone
                stats.update(prompts=1)
                failed.update({p: f"extract error: {result}" for p in positions})
                continue
            stats.update(prompts=1, prompt_tokens=result.prompt_tokens, generated_tokens=result.generated_tokens)
            stats.update(forward_passes=result.forward_passes)
            if result.error is not None:
                failed.update({p: f"extract error: {result.error}" for p in positions})
                continue
            stats.update(values_beyond_window=result.extra.get("beyond_window", 0),
                         prompts_in_groups=int(result.extra.get("groups", 1) > 1))
            for position, values in zip(positions, result.values, strict=True):  # a decoder's wrong shape raises
                row = rows[position]
                written.append(position)
                stats.update(products_out=1, inputs_truncated=int(row["input_truncated"]))
                category = by_category.setdefault(row["category"], Counter())
                category.update(products=1)
                product = products[position]
                for attribute, value in zip(request.attributes, values, strict=True):
                    if self.config.values_in_text and value.value is not None and not in_text(value.value, product):
                        stats.update(values_not_in_text=1)
                        value = replace(value, value=None, confidence=None)
                    if value.parse_error and value.value is None:  # its confidence was that of text that was no value
                        value = replace(value, confidence=None)
                    category.update(attribute_rows=1, values=int(value.value is not None))
                    stats.update(
                        attribute_rows=1,
                        values_null=int(value.value is None),
                        values_truncated=int(value.truncated),
                        parse_errors=int(value.parse_error),
                    )
                    attributes.append(
                        {
                            "product_id": row["product_id"],
                            "category": row["category"],
                            "attribute": attribute.name,
                            "value": value.value,
                            "truncated": value.truncated or row["input_truncated"],
                            "decoder": result.decoder,
                            "model": self.decoder.model_name,
                            "run_id": self.config.run_id,
                            "confidence": value.confidence,  # dropped by the schema unless asked for
                        }
                    )

        rejected, rejected_at, by_stage = [], [], Counter()
        for position, row in enumerate(rows):
            reason, stage = (failed[position], "extract") if position in failed else (row["reason"], row["stage"])
            if row["status"] == REJECTED or position in failed:
                rejected.append({"record": row["record"], "reason": reason, "stage": stage, "run_id": self.config.run_id})
                rejected_at.append(position)
                by_stage[stage] += 1
        skipped = [position for position, row in enumerate(rows) if row["status"] == SKIPPED]
        stats.update(rejected=len(rejected), skipped=len(skipped))
        summary = dict(stats, decode_seconds=decode_seconds, decode_devices=self.threads or 1,  # a GPU actor: one GPU
                       rejected_by_stage=dict(by_stage), by_category={c: dict(n) for c, n in by_category.items()},
                       actor=self.actor, dtype=self.dtype, spans=self.spans,
                       compiled=self.compiled())
        return {
            "chunk": chunk["chunk"],
            "shard": chunk["shard"],
            "index": chunk["index"],
            "attributes": io.table_to_bytes(pa.Table.from_pylist(attributes, schema=attributes_schema(self.config.decode.confidence))),
            "rejected": io.table_to_bytes(pa.Table.from_pylist(rejected, schema=REJECTED_SCHEMA)),
            "categories": sorted({row["category"] for row in rows if row["category"] is not None}),
            "owned_ids": [row["product_id"] for row in rows if row["status"] == OK],
            "rejected_ids": [  # held by this output (--skip-existing): not those of rows that failed validation
                row["product_id"] for row in rows
                if row["status"] == REJECTED and row["product_id"] is not None and row["stage"] not in UNHELD_STAGES
            ],
            "stats": json.dumps(summary),
            "read_rows": [row["row"] for row in rows],
            "read_ids": [row["product_id"] for row in rows],
            "written_rows": [rows[p]["row"] for p in written],
            "rejected_rows": [rows[p]["row"] for p in rejected_at],
            "skipped_rows": [rows[p]["row"] for p in skipped],
        }
