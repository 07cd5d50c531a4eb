"""The `hpd` command line: thin entry points over the packages that do the work.

- ``jobs.cli``: ``main`` (the ``hpd`` console script), one subcommand per module below.
- ``jobs.extract`` + ``jobs.config``: the extraction job (``pipelines``) and its configuration.
- ``jobs.evaluate``, ``jobs.convert``: over ``evaluation`` (and ``datafiles``).
- ``jobs.bench``: over ``bench``.
- ``jobs.finetune``: over ``training`` and ``hpd_core.finetune``.

Nothing outside ``jobs`` imports it.
"""

import contextlib
import signal
import threading


class CommandFailed(Exception):
    """A command that started and failed (not a usage error): ``hpd`` prints the message, exits 1."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (`ray job stop`, a pod or a scheduler stopping the job, `kill`): the command stops as
    Ctrl-C stops it, its clean-up included, and ``hpd`` exits 143."""


def _raise_terminated(signum, frame):
    raise Terminated()


def stop_cleanly_on_sigterm() -> None:
    """Make SIGTERM raise ``Terminated`` in the main thread. ``ray.init`` installs a handler of its
    own (measured with Ray 2.60: the driver then exits 15 on a joined cluster, and aborts with a
    stack dump, exit 134, on a local Ray it started), so a command that starts Ray calls this again
    after ``ray.init``."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


@contextlib.contextmanager
def sigterm_stops_cleanly():
    """``stop_cleanly_on_sigterm`` while the block runs; the handler from before is put back after
    it (``hpd``'s commands also run inside other processes: tests, a notebook)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    stop_cleanly_on_sigterm()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
