"""The attempts of a job: each `hpd extract` run that works on an output records its time and devices.

```
_attempts/<started>-<host>-<pid>.json   started_at, updated_at, wall_seconds, device, devices, price_per_hour
```

A record is written when an attempt starts (before the id index: ``devices`` 0 until its actors
are sized), refreshed every ``heartbeat_seconds`` while it runs and once more at its end (with
``ended``), so an attempt killed at any point still counts up to its last refresh. The report
sums them: wall time, device time and cost describe the whole job, however many times it was
resumed. A re-run of a finished job does no work and records no attempt.

The records are also the output's lease: two attempts on one output at once would write the same
chunks (and one that failed would delete the other's files), so an attempt that finds another one
running (``running``: not ended, refreshed within the last ``3 x heartbeat_seconds``, and, on the
same host and in the same PID namespace, its process still there) gives way once that one shows a
sign of life (a refresh), and goes on once its record goes stale (``await_quiet``). Each writes its record first and looks second, so
of two started together at least the later one sees the other (both may give way; neither runs).
An attempt whose own record went unrefreshed that long (its driver paused, its store unreachable)
may have been taken over so. The taker says so where the other cannot overwrite it: once it goes on,
it writes ``_attempts/<name>.taken`` beside every record it waited out (``mark_taken``). An attempt
whose record is marked so, or gone (an ``--overwrite`` deleted the output), or whose output was
closed (``_closed.json``, pipelines/commit.py) has lost its lease (``lease_lost``): its writers check
that before they write a chunk's files and again before its manifest, its heartbeat at each refresh
(then it stops refreshing, and never writes its record again), and the job as chunks commit
(``Heartbeat.check``). A refresh more than ``Heartbeat.LAPSE`` heartbeats late also looks for
another attempt running. So a paused attempt that wakes writes at most the chunk its writers had
already checked, instead of running beside the one that took over.

`hpd compact` (pipelines/compact.py) holds the lease the same way while it packs a finished output's
files (its records say ``command``), so an ``--overwrite`` gives way to it rather than deleting files
under it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from pipelines import io

log = logging.getLogger("hpd.extract")
DIRECTORY = "_attempts"
EXTRACT, COMPACT = "hpd extract", "hpd compact"  # the commands whose attempts hold an output's lease
HEARTBEAT_SECONDS = 15.0  # ProgressConfig.heartbeat_seconds's default


@dataclass(frozen=True)
class Attempt:
    name: str
    started_at: float
    updated_at: float
    device: str  # "gpu" or "cpu"
    devices: float  # GPUs, or vCPUs the actors compute on
    price_per_hour: float  # per device-hour
    ended: bool = False  # its last record: it ran to its end, failed or was interrupted (not killed)
    pid_namespace: str = ""  # its process's PID namespace (Linux; "" elsewhere and in older records)
    command: str = EXTRACT  # what holds the lease: the job, or `hpd compact` packing a finished output's files

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


def begin(output: str, device: str, devices: float, price_per_hour: float, started_at: float,
          command: str = EXTRACT) -> Attempt:
    attempt = Attempt(name_for(started_at), started_at, time.time(), device, devices, price_per_hour,
                      pid_namespace=pid_namespace(), command=command)
    save(output, attempt)
    return attempt


def record_uri(output: str, attempt: Attempt | str) -> str:
    name = attempt if isinstance(attempt, str) else attempt.name
    return io.join(output, DIRECTORY, f"{name}.json")


TAKEN = ".taken"  # _attempts/<name>.taken: another attempt took the output over from this one


def taken_uri(output: str, name: str) -> str:
    return io.join(output, DIRECTORY, f"{name}{TAKEN}")


def save(output: str, attempt: Attempt) -> Attempt:
    io.write_json(record_uri(output, attempt), dict(asdict(attempt), wall_seconds=attempt.wall_seconds))
    return attempt


def refresh(output: str, attempt: Attempt) -> Attempt:
    return save(output, replace(attempt, updated_at=time.time()))


def remove(output: str, attempt: Attempt) -> None:
    """Delete an attempt's record: one that gave way, or found the job finished, did no work, or
    one that held the lease while the output was deleted. A local folder of records left empty goes
    too (only if empty: another attempt may have just written its record)."""
    io.delete_if_exists(record_uri(output, attempt))
    fs, path = io.filesystem(io.join(output, DIRECTORY))
    if fs.type_name == "local":
        try:
            os.rmdir(path)
        except OSError:  # not empty, or not there
            pass


def load_all(output: str) -> list[Attempt]:
    """Every attempt recorded under ``output``, oldest first."""
    return _records(output)[0]


def _records(output: str) -> tuple[list[Attempt], set[str]]:
    """Every attempt recorded under ``output``, oldest first, and the names of those marked taken
    (one listing)."""
    attempts, taken = [], set()
    for uri in io.list_files(io.join(output, DIRECTORY)):
        if uri.endswith(TAKEN):
            taken.add(uri.rsplit("/", 1)[-1][: -len(TAKEN)])
        elif uri.endswith(".json"):
            try:
                data = io.read_json(uri)
            except (ValueError, OSError) as err:  # removed since the listing (an attempt that gave way), or broken
                if io.exists(uri):
                    log.warning("attempt record %s is not readable, left out: %s", uri, err)
                continue
            attempts.append(Attempt(**{name: data[name] for name in Attempt.__dataclass_fields__ if name in data}))
    return sorted(attempts, key=lambda a: a.started_at), taken


def _host_and_pid(name: str) -> tuple[str, int | None]:
    """The host and process id in a record's name (``name_for``); a host name may hold hyphens."""
    _, _, rest = name.partition("-")
    host, _, pid = rest.rpartition("-")
    return host, int(pid) if pid.isdigit() else None


def pid_namespace() -> str:
    """This process's PID namespace on this machine since its boot: the kernel's boot id and the
    namespace (``<boot id> pid:[4026531836]``), or "" where there is neither to read. Two containers
    that share a host name (host networking) have pids that mean nothing to each other, and so do
    two machines that share one (cloned VMs, a fixed container host name), whose processes outside
    containers are in namespaces of the same number (the first, on every Linux) but not of the same
    boot id (drill of session 53)."""
    parts = []
    for read in (_boot_id, lambda: os.readlink("/proc/self/ns/pid")):
        try:
            parts.append(read())
        except OSError:
            pass
    return " ".join(parts)


def _boot_id() -> str:
    with open(BOOT_ID, encoding="ascii") as file:
        return file.read().strip()


BOOT_ID = "/proc/sys/kernel/random/boot_id"  # random at each boot of a Linux kernel; containers share their host's


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def running(output: str, mine: Attempt | None, heartbeat_seconds: float, now: float | None = None) -> list[Attempt]:
    """The attempts on ``output`` other than ``mine`` (None: any) that may still be running: not ended,
    not taken over (``mark_taken``), refreshed within the last ``3 x heartbeat_seconds`` (by their
    host's clock), and, where they ran on this host and in this PID namespace, whose process is still
    there (a driver killed here gives way at once)."""
    records, taken = _records(output)
    return [other for other in records if _may_run(other, mine, taken, heartbeat_seconds, now)]


def _may_run(other: Attempt, mine: Attempt | None, taken: set[str], heartbeat_seconds: float,
             now: float | None = None) -> bool:
    """``running``'s test of one record."""
    now = time.time() if now is None else now
    if ((mine is not None and other.name == mine.name) or other.ended or other.name in taken
            or now - other.updated_at > 3 * heartbeat_seconds):
        return False
    host, pid = _host_and_pid(other.name)
    here = (socket.gethostname(), pid_namespace())
    same_processes = host == here[0] and other.pid_namespace in ("", here[1])  # "": a record from before 2026-11-29
    # this process's own pid: a killed driver's, reused (a container started again)
    return not (same_processes and pid is not None and (pid == os.getpid() or not _process_exists(pid)))


def busy(output: str, mine: Attempt | None, heartbeat_seconds: float) -> str | None:
    """What works on ``output`` now besides ``mine`` (None: anything), as ``await_quiet`` says it when
    it gives way: the latest attempt ``running`` there; None when nothing does."""
    others = running(output, mine, heartbeat_seconds)
    return _working(output, others[-1]) if others else None


def _working(output: str, other: Attempt) -> str:
    host, pid = _host_and_pid(other.name)
    why = ("it is packing the output's files into fewer" if other.command == COMPACT
           else "two at once would write the same chunks")
    return (f"another `{other.command}` is working on {output} (attempt {other.name}: host {host}, pid {pid}, last "
            f"seen {max(0.0, time.time() - other.updated_at):.0f} s ago): {why}. Wait for it to end or stop it")


def await_quiet(output: str, mine: Attempt | None, heartbeat_seconds: float, poll_seconds: float = 1.0) -> None:
    """Give way to another attempt that shows a sign of life, and wait out one that does not.

    Raises ``ValueError`` as soon as another attempt's record is refreshed after this one first saw
    it (it lives: at most one heartbeat later); returns once no other is ``running`` (a driver killed
    anywhere, its record not refreshed for ``3 x heartbeat_seconds``; one killed on this host and in
    this PID namespace at once). So a driver started again right after one was killed (a restarted
    container, a scheduler's retry) waits out the killed one's record instead of being refused.
    Going on, ``mine`` marks every other unended record taken (``mark_taken``): one of a paused
    driver that wakes up later stops instead of writing beside it."""
    first_seen: dict[str, float] = {}
    said = False
    while others := running(output, mine, heartbeat_seconds):
        for other in others:
            if other.updated_at > first_seen.setdefault(other.name, other.updated_at):
                raise ValueError(_working(output, other))
        if not said:
            other = others[-1]
            host, pid = _host_and_pid(other.name)
            wait = max(0.0, 3 * heartbeat_seconds - (time.time() - other.updated_at))
            log.warning("attempt %s (host %s, pid %s) on %s was last seen %.0f s ago: waiting up to %.0f s for a sign "
                        "of life (then this run gives way) or for its record to go stale (a killed driver's; then this "
                        "run goes on)", other.name, host, pid, output, time.time() - other.updated_at, wait)
            said = True
        time.sleep(poll_seconds)
    if mine is not None:
        mark_taken(output, mine, heartbeat_seconds)


def mark_taken(output: str, mine: Attempt, heartbeat_seconds: float) -> None:
    """Write ``<name>.taken`` beside the record of every other attempt on ``output`` that did not end
    and is not ``running`` (``mine`` waited it out), naming ``mine``: a file its own heartbeat never
    writes, so a paused one that wakes up finds it (``lease_lost``). A record written since ``mine``
    last looked (another attempt starting now) is fresh, so not marked: that one sees ``mine`` at
    work and gives way."""
    records, taken = _records(output)
    for other in records:
        if (other.name != mine.name and not other.ended and other.name not in taken
                and not _may_run(other, mine, taken, heartbeat_seconds)):
            io.write_json(taken_uri(output, other.name), {"by": mine.name, "at": time.time()})


class LostLeaseError(ValueError):
    """This attempt may no longer write to its output: another took it over, an ``--overwrite``
    deleted it, or a later ``--skip-existing`` job closed it."""


def lease_lost(output: str, name: str) -> str | None:
    """Why the attempt ``name`` has lost its lease on ``output`` (its record gone, or marked taken);
    None while it holds it."""
    if io.exists(marker := taken_uri(output, name)):
        try:
            by = io.read_json(marker).get("by")
        except (ValueError, OSError):  # being written
            by = None
        host, pid = _host_and_pid(by) if by else ("?", None)
        return (f"attempt {by} (host {host}, pid {pid}) took the output over after this attempt's record was not "
                "refreshed in time (the process paused, or the store not written)")
    if not io.exists(record_uri(output, name)):
        return ("this attempt's record is gone: the output was deleted (an --overwrite), or an `hpd compact` that "
                "took it over ended, while it was not refreshed")
    return None


def forget_taken(output: str, mine: str, command: str) -> None:
    """Delete the records of ``command``'s attempts that ``mine`` marked taken (``mark_taken``: killed,
    or paused: one that wakes finds its record gone and stops), then their ``.taken`` markers, so a
    killed one does not stay for good. Not for `hpd extract`'s: its report counts its attempts."""
    records, taken = _records(output)
    for other in records:
        if other.command == command and other.name in taken:
            try:
                by = io.read_json(taken_uri(output, other.name)).get("by")
            except (ValueError, OSError):  # gone, or being written: left
                continue
            if by == mine:
                io.delete_if_exists(record_uri(output, other))
                io.delete_if_exists(taken_uri(output, other.name))


def check_lease(output: str, name: str, also: Callable[[], str | None] = lambda: None) -> None:
    """Raise ``LostLeaseError`` if the attempt ``name`` lost its lease on ``output`` (``lease_lost``, or
    ``also``'s reason: the output closed)."""
    if (why := lease_lost(output, name) or also()) is not None:
        raise LostLeaseError(lost_message(output, why))


def lost_message(output: str, why: str) -> str:
    return f"this attempt lost its lease on {output}: {why}; this one stops"


class Heartbeat:
    """Refresh an attempt's record every ``seconds`` in a thread; ``stop`` refreshes it once more.

    Each refresh first asks whether the attempt still holds its lease (``lease_lost``, and ``also``:
    the output closed); a refresh that comes more than ``LAPSE`` heartbeats after the record was last
    written (the process was paused, or the store could not be written) also looks for another
    attempt running on the output (one that waited out this attempt's silent record and has not yet
    marked it taken). Once the lease is lost, ``lost`` says why, the record is never written again
    (``stop`` included: the output may have been deleted, or be another's now), and ``check`` raises."""

    LAPSE = 2  # heartbeats; another attempt takes over after 3 (``running``), by its own clock

    def __init__(self, output: str, attempt: Attempt, seconds: float,
                 also: Callable[[], str | None] = lambda: None) -> None:
        self.output, self.attempt, self.seconds, self.also = output, attempt, seconds, also
        self.lost: str | None = None
        self._written_at = time.time()  # the record's last successful write (``begin`` wrote it)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # ``sized`` from the job's thread, refreshes from this one
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.seconds):
            self._refresh()

    def _refresh(self) -> None:
        # any error of the store (boto3's ClientError or EndpointConnectionError are not OSErrors):
        # a missed refresh only shortens this attempt's recorded time if the run is killed later
        with self._lock:
            try:
                if self.lost is None and (why := self._why_lost()) is not None:
                    self.lost = why
                    log.warning("%s", lost_message(self.output, why))
                if self.lost is None:
                    self.attempt = refresh(self.output, self.attempt)
                    self._written_at = time.time()
            except Exception as err:
                self.attempt = replace(self.attempt, updated_at=time.time())  # the report still counts it
                log.warning("could not refresh the attempt record: %s: %s", type(err).__name__, err)

    def _why_lost(self) -> str | None:
        if (why := lease_lost(self.output, self.attempt.name) or self.also()) is not None:
            return why
        if time.time() - self._written_at > self.LAPSE * self.seconds:
            if others := running(self.output, self.attempt, self.seconds):
                host, pid = _host_and_pid(others[-1].name)
                return (f"its record was not refreshed for {time.time() - self._written_at:.0f} s (the process paused, "
                        f"or the store not written), and attempt {others[-1].name} (host {host}, pid {pid}) took the "
                        "output over and goes on with the job")
        return None

    def check(self) -> None:
        """Raise ``LostLeaseError`` once this attempt has lost its lease (see the class)."""
        if self.lost is not None:
            raise LostLeaseError(lost_message(self.output, self.lost))

    def sized(self, device: str, devices: float, price_per_hour: float) -> None:
        """The devices the attempt's actors compute on, once they are sized (written next refresh)."""
        with self._lock:
            self.attempt = replace(self.attempt, device=device, devices=devices, price_per_hour=price_per_hour)

    def stop(self, write: bool = True) -> Attempt:
        """The attempt as of now, its record refreshed once more and marked ended (a failure to
        write it is logged: the job's report, written next, holds the same time; nothing is written
        once the lease is lost); ``write`` False: the record is left as it is (the output is about
        to be deleted). Stopping again returns the same attempt and writes nothing."""
        if self._stop.is_set():
            return self.attempt
        self._stop.set()
        self._thread.join()
        self.attempt = replace(self.attempt, ended=True)
        if write:
            self._refresh()
        return self.attempt
