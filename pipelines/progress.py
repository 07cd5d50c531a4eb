"""Live progress of a running job on one line: input rows done / total, rows/s and ETA.

```
extract actors ──start/add (as each prompt finishes)──▶ ProgressCounter (actor, 0 CPU)
driver: committed chunks' rows ──┐                                    │ snapshot
                                 └──────────▶ ProgressLine (thread) ◀─┘ ──▶ stderr, every few seconds
```

"Done" counts input rows: those of committed chunks (written, rejected or skipped, counted once, at
commit) plus the products the actors have decoded in chunks not yet committed, so the line moves
inside a chunk as each prompt finishes (pipelines/extract_stage.py); the products of prompts under
way are shown as "being decoded". A
chunk retried after a failure starts again from zero. The total is the id
index's count of every shard's rows when the job passes it (exact, and free: 30,000 Parquet footers
read one after another would keep the line without a total for about half an hour, estimated);
else it is counted in the
background (exact for inputs of up to ``exact_bytes`` of JSON Lines and for Parquet, from its
metadata; estimated from the first shard's rows per byte beyond that, shown with ``~``). The rate
counts from the moment the first chunk started decoding (model loading excluded); the ETA is what
is left at that rate. On a terminal the line is rewritten in place every ``tty_seconds``; in a log
(not a terminal) a new line is written every ``log_seconds``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import ray

from pipelines import attempts, reader


@ray.remote(num_cpus=0)
class ProgressCounter:
    """Per chunk in flight: products decoded so far and products to decode, as the actors report them.
    A committed chunk is forgotten (the driver says so), so what it holds, and each snapshot, stays
    the size of the chunks in flight, not of the job (150,000 chunks would make a snapshot of about
    5 MiB every second, estimated from the measured 170 bytes a chunk)."""

    def __init__(self) -> None:
        self._chunks: dict[str, list[int]] = {}
        self._first_start: float | None = None

    def start(self, chunk: str, products: int) -> None:
        self._chunks[chunk] = [0, products]  # a retried chunk starts again
        self._first_start = self._first_start or time.time()

    def add(self, chunk: str, products: int) -> None:
        if chunk in self._chunks:  # an actor's calls arrive in order: start first; never a forgotten chunk
            self._chunks[chunk][0] += products

    def forget(self, chunk: str) -> None:
        self._chunks.pop(chunk, None)

    def snapshot(self) -> tuple[dict[str, list[int]], float | None]:
        return dict(self._chunks), self._first_start


@dataclass(frozen=True)
class ProgressConfig:
    """tty_seconds / log_seconds: how often the line is rewritten on a terminal / written to a log;
    exact_bytes: JSON Lines inputs up to this size are counted exactly; heartbeat_seconds: how often
    the attempt record is refreshed (pipelines/attempts.py)."""

    tty_seconds: float = 1.0
    log_seconds: float = 10.0
    exact_bytes: int = 64 << 20
    heartbeat_seconds: float = attempts.HEARTBEAT_SECONDS

    def __post_init__(self) -> None:
        for name in ("tty_seconds", "log_seconds", "exact_bytes", "heartbeat_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def render(done: int, total: int | None, exact: bool, rate: float | None, elapsed: float, decoding: int = 0,
           committed: int | None = None) -> str:
    """The progress line (without a newline), in input rows (a rejected row counts as done, as the
    total counts it). ``decoding``: products in decoder calls under way; ``committed``: rows of
    committed chunks, said when fewer than ``done`` (decoded chunks wait for their writers: on S3,
    or with many categories a chunk, that can take a while, and a job stopped then redoes them)."""
    tilde = "" if exact else "~"
    if total:
        share = min(100, int(100 * done / total))
        line = f"extract: {done}/{tilde}{total} rows ({share}%)"
    else:
        line = f"extract: {done} rows"
    if rate is None:
        return f"{line}, starting (loading the model), {duration(elapsed)} elapsed"
    line += f", {rate:.2f} rows/s"
    if total and rate > 0 and done < total:
        line += f", ETA {tilde}{duration((total - done) / rate)}"
    if decoding:
        line += f", {decoding} being decoded"
    if committed is not None and committed < done:
        line += f", {committed} committed" + (f" ({int(100 * committed / total)}%)" if total else "")
    return f"{line}, {duration(elapsed)} elapsed"


class ProgressLine:
    """Driver side: the committed rows (fed by the driver's loop), the counter's snapshot, the line."""

    def __init__(self, counter, shards: list[reader.Shard], read: reader.ReadConfig, previous_rows: int,
                 stream, config: ProgressConfig = ProgressConfig(), total: int | None = None) -> None:
        """``shards``: the whole input (the total counts every row); ``previous_rows``: rows of chunks
        committed by earlier attempts; ``total``: the input's rows when already known (the id index
        counted them), else they are counted in the background."""
        self.counter, self.stream, self.config = counter, stream, config
        self.previous_rows = previous_rows  # committed by earlier attempts
        self.committed_rows = 0
        self.committed: set[str] = set()
        self.total: int | None = total
        self.exact = True
        self.started = time.time()
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._printed = False
        self._counting = threading.Thread(target=self._count, args=(shards, read), daemon=True)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _count(self, shards, read) -> None:
        try:
            total, exact = reader.count_rows(shards, read, self.config.exact_bytes)
        except (OSError, ValueError):  # the total is a nicety: an unreadable file fails its chunk, not this
            total, exact = None, False
        with self._lock:
            self.total, self.exact = total, exact

    def start(self) -> None:
        if self.total is None:
            self._counting.start()
        self._thread.start()

    def committed_chunk(self, chunk: str, rows: int) -> None:
        with self._lock:
            self.committed.add(chunk)  # kept: a chunk key per committed chunk (about 15 MiB at 150,000)
            self.committed_rows += rows
        self.counter.forget.remote(chunk)

    def line(self) -> str:
        try:
            chunks, first_start = ray.get(self.counter.snapshot.remote(), timeout=self.config.log_seconds)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):  # the line is best effort
            chunks, first_start = {}, None
        now = time.time()
        with self._lock:
            for chunk in [c for c in chunks if c in self.committed]:  # not forgotten yet, or started again late
                self.counter.forget.remote(chunk)
            in_flight = [counts for chunk, counts in chunks.items() if chunk not in self.committed]
            done_now = self.committed_rows + sum(decoded for decoded, _ in in_flight)
            done, total, exact = self.previous_rows + done_now, self.total, self.exact
            committed = self.previous_rows + self.committed_rows
        decoding = sum(to_decode - decoded for decoded, to_decode in in_flight)
        rate = done_now / max(now - first_start, 1e-9) if first_start else None
        return render(done, total, exact, rate, now - self.started, decoding, committed)

    def _run(self) -> None:
        interval = self.config.tty_seconds if self.tty else self.config.log_seconds
        while not self._stop.wait(interval):
            self._print(self.line())

    def _print(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._printed = True

    def stop(self, final: bool = True) -> None:
        """Stop the thread; print the last line (``final``), ending the in-place line on a terminal."""
        self._stop.set()
        self._thread.join()
        if final:
            self._print(self.line())
        if self.tty and self._printed:
            self.stream.write("\n")
            self.stream.flush()
