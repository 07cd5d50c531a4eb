"""Watch the local Ray node a command started, and say so at once when it dies under the job.

When the raylet or the GCS of a local Ray that `hpd extract` started is killed (the system's
out-of-memory killer, a signal), Ray's C++ core ends the driver's process itself, after seconds to a
minute and with no word of hpd's (measured with Ray 2.60 on the 2-core sandbox: exit 1 after Ray's
"Raylet is terminated" lines; or, when an actor's death reaches the driver first, a misleading "an
extract actor's process died 4 time(s)"). ``watching`` polls those processes in a thread; when one
is gone it calls ``on_lost`` with one line naming it, and the command ends there (``lost_node``
prints it and exits 1: Ray's own clean-up would wait on the dead node). Committed chunks are kept,
so the same command resumes the job.

Only the processes this command started are watched (``local_node``): on a cluster the driver's
node is the head's, and its loss is Ray's to report.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator

import psutil

NODE_PROCESSES = ("raylet", "gcs_server")  # without either, the local Ray cannot go on
POLL_SECONDS = 1.0


def local_node() -> dict[str, psutil.Process]:
    """This process's children that make up the local Ray node ``ray.init`` started here, by name."""
    found = {}
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if (name := child.name()) in NODE_PROCESSES:
                found[name] = child
    return found


def _gone(process: psutil.Process) -> bool:
    """Ended: no longer there, or a zombie (a child killed and not yet reaped stays one)."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def describe(name: str, process: psutil.Process) -> str:
    return (f"Ray's local node stopped under the job: its {name} (pid {process.pid}) ended, killed by a "
            "signal or by the system's out-of-memory killer (`dmesg` says which; Ray's logs are in "
            "/tmp/ray/session_latest/logs)")


@contextlib.contextmanager
def watching(processes: dict[str, psutil.Process], on_lost: Callable[[str], None],
             poll_seconds: float = POLL_SECONDS) -> Iterator[None]:
    """While the block runs, call ``on_lost(line)`` (from a thread, once) when one of ``processes``
    ends. Stopped before the block's end returns, so the node's own shutdown is never taken for a loss."""
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(poll_seconds):
            if lost := next((name for name, process in processes.items() if _gone(process)), None):
                if not stop.is_set():
                    on_lost(describe(lost, processes[lost]))
                return

    thread = threading.Thread(target=watch, name="hpd-node-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def lost_node(write: Callable[[str], None], hint: str) -> Callable[[str], None]:
    """An ``on_lost`` for a command: ``write`` its failure line (with ``hint``), then end the process
    with exit status 1 at once."""

    def on_lost(line: str) -> None:
        write(f"\nhpd extract: failed: {line}; {hint}\n")
        os._exit(1)

    return on_lost
