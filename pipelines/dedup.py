"""Global product-id deduplication while streaming: a hash-partitioned registry of Ray actors.

The first row to claim a product_id owns it; a later row with the same id is rejected as a
duplicate. A claim is keyed by the row's identity (chunk key and row index), so a retried task or a
re-read chunk claims its own ids again and still owns them. Ids are pre-claimed at start for
chunks an earlier attempt already committed (a resumed run then rejects the same later rows).
Separately, with ``--skip-existing``, the registry holds the product ids of an earlier output;
rows with those ids are skipped before they are validated or claimed.

Memory: one dict entry per distinct product_id (about 150 bytes), spread over ``shards`` actors.
The registry lives as long as the driver; a resumed run rebuilds it from the commit manifests.
"""

from __future__ import annotations

import zlib
from enum import IntEnum

import ray

COMMITTED = "\x00committed"  # owner of ids committed by an earlier attempt of this run


class Claim(IntEnum):
    OWN = 0  # this row owns the id: process it
    DUPLICATE = 1  # another row owns it: reject as duplicate


@ray.remote(num_cpus=0)
class _RegistryShard:
    def __init__(self) -> None:
        self._owners: dict[str, str] = {}
        self._existing: set[str] = set()

    def claim(self, ids: list[str], owners: list[str]) -> list[int]:
        return [
            Claim.OWN if self._owners.setdefault(product_id, owner) == owner else Claim.DUPLICATE
            for product_id, owner in zip(ids, owners)
        ]

    def seed(self, ids: list[str], owner: str) -> None:
        for product_id in ids:
            self._owners.setdefault(product_id, owner)

    def add_existing(self, ids: list[str]) -> None:
        self._existing.update(ids)

    def existing(self, ids: list[str]) -> list[bool]:
        return [product_id in self._existing for product_id in ids]

    def size(self) -> int:
        return len(self._owners) + len(self._existing)


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

    def _call(self, method: str, ids: list[str], owners: list[str] | None = None, *args) -> list:
        """Call ``method`` on each registry shard with its part of ``ids`` (and ``owners``);
        the answers come back in ``ids`` order (None for methods that answer nothing)."""
        positions = self._split(ids)
        parts = [(actor, part) for actor, part in zip(self._actors, positions) if part]
        refs = []
        for actor, part in parts:
            per_row = ([owners[p] for p in part],) if owners is not None else ()
            refs.append(getattr(actor, method).remote([ids[p] for p in part], *per_row, *args))
        answers: list = [None] * len(ids)
        for (_, part), answer in zip(parts, ray.get(refs)):
            for position, value in zip(part, answer if answer is not None else [None] * len(part)):
                answers[position] = value
        return answers

    def claim(self, ids: list[str], owners: list[str]) -> list[Claim]:
        """One claim per id, in order; ``owners[i]`` identifies the row claiming ``ids[i]``."""
        return [Claim(claim) for claim in self._call("claim", ids, owners)]

    def seed(self, ids: list[str], owner: str) -> None:
        """Pre-claim ``ids`` for ``owner`` (ids committed by an earlier attempt)."""
        self._call("seed", ids, None, owner)

    def add_existing(self, ids: list[str]) -> None:
        """Remember the product ids of an earlier output (--skip-existing)."""
        self._call("add_existing", ids)

    def existing(self, ids: list[str]) -> list[bool]:
        return self._call("existing", ids)

    def size(self) -> int:
        return sum(ray.get([actor.size.remote() for actor in self._actors]))

    def shutdown(self) -> None:
        """End the registry actors (they also end with the driver that created them)."""
        for actor in self._actors:
            ray.kill(actor)
