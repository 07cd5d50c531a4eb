"""Global product-id deduplication while streaming: a hash-partitioned registry of Ray actors.

The first row to claim a product_id owns it; a later row with the same id is rejected as a
duplicate. A claim is keyed by the row's identity (chunk key and row index), so a retried task or a
re-read chunk claims its own ids again and still owns them. Ids are pre-claimed at start for
chunks an earlier attempt already committed (a resumed run then rejects the same later rows) and,
with ``--skip-existing``, for the products of an earlier output (their rows are skipped).

Memory: one dict entry per distinct product_id (about 150 bytes), spread over ``shards`` actors.
The registry lives as long as the driver; a resumed run rebuilds it from the commit manifests.
"""

from __future__ import annotations

import zlib
from enum import IntEnum

import ray

COMMITTED = "\x00committed"  # owner of ids committed by an earlier attempt of this run
EXISTING = "\x00existing"  # owner of ids found in an earlier output (--skip-existing)


class Claim(IntEnum):
    OWN = 0  # this row owns the id: process it
    DUPLICATE = 1  # another row owns it: reject as duplicate
    SKIP = 2  # an earlier output already has it: skip


@ray.remote(num_cpus=0)
class _RegistryShard:
    def __init__(self) -> None:
        self._owners: dict[str, str] = {}

    def claim(self, ids: list[str], owners: list[str]) -> list[int]:
        claims = []
        for product_id, owner in zip(ids, owners):
            current = self._owners.setdefault(product_id, owner)
            if current == owner:
                claims.append(Claim.OWN)
            elif current == EXISTING:
                claims.append(Claim.SKIP)
            else:
                claims.append(Claim.DUPLICATE)
        return claims

    def seed(self, ids: list[str], owner: str) -> None:
        for product_id in ids:
            self._owners.setdefault(product_id, owner)

    def size(self) -> int:
        return len(self._owners)


def _shard_of(product_id: str, shards: int) -> int:
    return zlib.crc32(product_id.encode("utf-8")) % shards  # stable across processes, unlike hash()


class IdRegistry:
    """Client side: picklable (it holds actor handles), so Ray tasks can take it as an argument."""

    def __init__(self, shards: int) -> None:
        if shards < 1:
            raise ValueError(f"registry shards must be >= 1, got {shards}")
        self._actors = [_RegistryShard.remote() for _ in range(shards)]

    def _split(self, ids: list[str]) -> list[list[int]]:
        positions: list[list[int]] = [[] for _ in self._actors]
        for position, product_id in enumerate(ids):
            positions[_shard_of(product_id, len(self._actors))].append(position)
        return positions

    def claim(self, ids: list[str], owners: list[str]) -> list[Claim]:
        """One claim per id, in order; ``owners[i]`` identifies the row claiming ``ids[i]``."""
        positions = self._split(ids)
        refs = [
            actor.claim.remote([ids[p] for p in part], [owners[p] for p in part])
            for actor, part in zip(self._actors, positions)
            if part
        ]
        answers = iter(ray.get(refs))
        claims: list[Claim] = [Claim.OWN] * len(ids)
        for part in positions:
            if part:
                for position, claim in zip(part, next(answers)):
                    claims[position] = Claim(claim)
        return claims

    def seed(self, ids: list[str], owner: str) -> None:
        positions = self._split(ids)
        ray.get(
            [actor.seed.remote([ids[p] for p in part], owner) for actor, part in zip(self._actors, positions) if part]
        )

    def size(self) -> int:
        return sum(ray.get([actor.size.remote() for actor in self._actors]))
