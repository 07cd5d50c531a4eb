"""The extract stage: a Ray Data actor that loads a decoder once and turns chunks into output rows.

Per chunk: prepared rows -> engine requests (one per stack) -> ``decoder.decode`` -> one output row
per (product, attribute), and rejected rows for validation failures (passed through) and for
requests the engine could not decode (``Result.error``). torch and the engine are imported inside
the constructor only, so the driver and the CPU stages never load them.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa

from hpd_core.config import DECODERS, DEFAULT_MODEL, DecodeConfig, ModelConfig
from hpd_core.types import Product
from pipelines import io
from pipelines.artifacts import resolve_model_path
from pipelines.commit import ATTRIBUTES_SCHEMA, REJECTED_SCHEMA
from pipelines.dryrun import DRY_RUN, DryRunConfig, DryRunDecoder
from pipelines.prepare import OK, REJECTED, SKIPPED
from pipelines.report import COUNTERS
from pipelines.schema import AttributeSchema
from pipelines.stacking import build_requests

EXTRACT_DECODERS = (*DECODERS, DRY_RUN)

RESULT_SCHEMA = pa.schema(
    [
        ("chunk", pa.string()),
        ("shard", pa.string()),
        ("index", pa.int64()),
        ("attributes", pa.binary()),  # Arrow IPC, ATTRIBUTES_SCHEMA
        ("rejected", pa.binary()),  # Arrow IPC, REJECTED_SCHEMA
        ("categories", pa.list_(pa.string())),  # every category a partition file may exist for
        ("owned_ids", pa.list_(pa.string())),  # product ids this chunk owns (dedup)
        ("rejected_ids", pa.list_(pa.string())),
        ("stats", pa.string()),  # JSON counters, see report.COUNTERS
    ]
)


@dataclass(frozen=True)
class ExtractConfig:
    """The engine part of the job: which decoder and model, and the attributes per category.

    model_uri / adapter_uri may be ``s3://`` prefixes: each node copies them once into its cache
    before the engine's ModelConfig (which refuses S3 names) is built.
    """

    decoder: str
    schema: AttributeSchema
    run_id: str
    model_uri: str = DEFAULT_MODEL
    adapter_uri: str | None = None
    dtype: str = "float32"
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    dry_run: DryRunConfig = field(default_factory=DryRunConfig)

    def __post_init__(self) -> None:
        if self.decoder not in EXTRACT_DECODERS:
            raise ValueError(f"decoder must be one of {EXTRACT_DECODERS}, got {self.decoder!r}")
        self.model_config("cpu", resolve=False)  # validates dtype and names once, at job start

    def model_config(self, device: str, resolve: bool = True) -> ModelConfig:
        def local(uri: str | None) -> str | None:
            if uri is None or not uri.startswith("s3://"):
                return uri
            return resolve_model_path(uri) if resolve else "/s3-artifact-resolved-on-each-node"

        return ModelConfig(name=local(self.model_uri), adapter=local(self.adapter_uri), dtype=self.dtype, device=device)


def load(config: ExtractConfig):
    """The decoder for this actor (dry-run, or the engine's, on CUDA when Ray gave us a GPU)."""
    if config.decoder == DRY_RUN:
        return DryRunDecoder(config.dry_run)
    import ray

    from hpd_core.decoders import load_decoder  # torch + transformers: once per actor

    device = "cuda" if ray.get_gpu_ids() else "cpu"
    return load_decoder(config.decoder, config.model_config(device), config.decode)


class ExtractStage:
    """Ray Data callable class: constructed once per actor, called once per chunk row."""

    def __init__(self, config: ExtractConfig, threads: int | None = None) -> None:
        if threads is not None and config.decoder != DRY_RUN:
            import torch

            torch.set_num_threads(threads)  # CPU actors: see build.size_actors
        self.config = config
        self.actor = f"{socket.gethostname()}:{os.getpid()}"
        self.decoder = load(config)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return pa.Table.from_pylist([self._chunk(row) for row in batch.to_pylist()], schema=RESULT_SCHEMA)

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
        started = time.perf_counter()
        results = self.decoder.decode([request for request, _ in requests]) if requests else []
        decode_seconds = time.perf_counter() - started
        if len(results) != len(requests):
            raise RuntimeError(f"decoder {self.decoder.name} returned {len(results)} results for {len(requests)} requests")

        attributes, failed = [], {}
        for (request, positions), result in zip(requests, results):
            stats.update(prompts=1, prompt_tokens=result.prompt_tokens, generated_tokens=result.generated_tokens)
            stats.update(forward_passes=result.forward_passes)
            if result.error is not None:
                failed.update({p: f"extract error: {result.error}" for p in positions})
                continue
            for position, values in zip(positions, result.values):
                row = rows[position]
                stats.update(products_out=1, inputs_truncated=int(row["input_truncated"]))
                for attribute, value in zip(request.attributes, values):
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
                        }
                    )

        rejected, by_stage = [], Counter()
        for position, row in enumerate(rows):
            reason, stage = (failed[position], "extract") if position in failed else (row["reason"], row["stage"])
            if row["status"] == REJECTED or position in failed:
                rejected.append({"record": row["record"], "reason": reason, "stage": stage, "run_id": self.config.run_id})
                by_stage[stage] += 1
        stats.update(rejected=len(rejected), skipped=sum(row["status"] == SKIPPED for row in rows))
        summary = dict(stats, decode_seconds=decode_seconds, rejected_by_stage=dict(by_stage), actor=self.actor)
        return {
            "chunk": chunk["chunk"],
            "shard": chunk["shard"],
            "index": chunk["index"],
            "attributes": io.table_to_bytes(pa.Table.from_pylist(attributes, schema=ATTRIBUTES_SCHEMA)),
            "rejected": io.table_to_bytes(pa.Table.from_pylist(rejected, schema=REJECTED_SCHEMA)),
            "categories": sorted({row["category"] for row in rows if row["category"] is not None}),
            "owned_ids": [row["product_id"] for row in rows if row["status"] == OK],
            "rejected_ids": [
                row["product_id"] for row in rows if row["status"] == REJECTED and row["product_id"] is not None
            ],
            "stats": json.dumps(summary),
        }
