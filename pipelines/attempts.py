"""The attempts of a job: each `hpd extract` run that works on an output records its time and devices.

```
_attempts/<started>-<host>-<pid>.json   started_at, updated_at, wall_seconds, device, devices, price_per_hour
```

A record is written when an attempt starts, refreshed every ``heartbeat_seconds`` while it runs
and once more at its end, so an attempt killed at any point still counts up to its last refresh.
The report sums them: wall time, device time and cost describe the whole job, however many times it
was resumed. A re-run of a finished job does no work and records no attempt.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass, replace

from pipelines import io

log = logging.getLogger("hpd.extract")
DIRECTORY = "_attempts"


@dataclass(frozen=True)
class Attempt:
    name: str
    started_at: float
    updated_at: float
    device: str  # "gpu" or "cpu"
    devices: float  # GPUs, or vCPUs the actors compute on
    price_per_hour: float  # per device-hour

    @property
    def wall_seconds(self) -> float:
        return max(0.0, self.updated_at - self.started_at)

    @property
    def device_seconds(self) -> float:
        return self.wall_seconds * self.devices

    @property
    def usd(self) -> float:
        return self.device_seconds / 3600 * self.price_per_hour


def name_for(started_at: float) -> str:
    return f"{int(started_at * 1000):015d}-{socket.gethostname()}-{os.getpid()}"


def begin(output: str, device: str, devices: float, price_per_hour: float, started_at: float) -> Attempt:
    attempt = Attempt(name_for(started_at), started_at, time.time(), device, devices, price_per_hour)
    save(output, attempt)
    return attempt


def save(output: str, attempt: Attempt) -> Attempt:
    io.write_json(io.join(output, DIRECTORY, f"{attempt.name}.json"), dict(asdict(attempt), wall_seconds=attempt.wall_seconds))
    return attempt


def refresh(output: str, attempt: Attempt) -> Attempt:
    return save(output, replace(attempt, updated_at=time.time()))


def load_all(output: str) -> list[Attempt]:
    """Every attempt recorded under ``output``, oldest first."""
    attempts = []
    for uri in io.list_files(io.join(output, DIRECTORY)):
        if uri.endswith(".json"):
            data = io.read_json(uri)
            attempts.append(Attempt(**{name: data[name] for name in Attempt.__dataclass_fields__}))
    return sorted(attempts, key=lambda a: a.started_at)


class Heartbeat:
    """Refresh an attempt's record every ``seconds`` in a thread; ``stop`` refreshes it once more."""

    def __init__(self, output: str, attempt: Attempt, seconds: float) -> None:
        self.output, self.attempt, self.seconds = output, attempt, seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.seconds):
            self._refresh()

    def _refresh(self) -> None:
        # any error of the store (boto3's ClientError or EndpointConnectionError are not OSErrors):
        # a missed refresh only shortens this attempt's recorded time if the run is killed later
        try:
            self.attempt = refresh(self.output, self.attempt)
        except Exception as err:
            self.attempt = replace(self.attempt, updated_at=time.time())  # the report still counts it
            log.warning("could not refresh the attempt record: %s: %s", type(err).__name__, err)

    def stop(self) -> Attempt:
        """The attempt as of now, its record refreshed once more (a failure to write it is logged:
        the job's report, written next, holds the same time)."""
        self._stop.set()
        self._thread.join()
        self._refresh()
        return self.attempt
