"""Quiet by default, everything with --verbose.

By default `hpd extract` shows its own progress line, warnings and the final summary, and not:
Ray's INFO logs (the token-auth notice, "Started a local Ray instance"), Ray Data's progress blocks
and execution logs, the output of worker processes (model-loading bars, library warnings such as
transformers' FutureWarnings or bitsandbytes' "pip install kernels"), nor known harmless lines that
Ray's C++ core writes straight to the driver's standard error (the ``max_restarts > 0`` notice
Ray Data's restartable actors trigger). Those still go to Ray's log files
(``/tmp/ray/session_latest/logs``). Errors are never hidden: they reach the driver as exceptions.

``log_to_stderr`` is `hpd finetune`'s log: every INFO line, warnings and errors marked as such.
``quiet_libraries`` hides, around a command that runs the model in its own process (`hpd
finetune`), what the libraries print that is no concern of its user: transformers' progress bars
("Loading weights", "Writing model shards"), their FutureWarnings and DeprecationWarnings, and
bitsandbytes' "pip install kernels" notice (a faster CPU kernel for 4-bit layers, which no command
here uses); its ``--verbose`` shows them. hpd's own warnings (logged) are not affected.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import warnings

# lines of Ray's C++ core (written to fd 2, not through Python) that are harmless for this job
NOISE = (re.compile(rb"core_worker\.cc:\d+: Actor with class name: .* has constructor arguments in the object store "
                    rb"and max_restarts > 0"),
         # the raylet's word (through the driver) on a task of an actor this job stopped itself (SIGTERM, the end),
         # and on a task sent to an actor whose process just died: its "infinite retries" are the task's on the
         # restarted actor, which reads as if --actor-restarts were ignored (the death itself stays: Ray's "A
         # worker died" line, and hpd's own once the restarts are spent)
         re.compile(rb"\(raylet\).* There are infinite retries remaining, so the task will be retried\. Error: The actor "
                    rb"(is dead because it was killed by `ray\.kill`\.|is temporarily unavailable)"),
         # the last 20 lines of a dead raylet's log that Ray prints under its "Raylet is terminated" line
         # (that line stays, and hpd's own follows: jobs.nodewatch)
         re.compile(rb"^    \[(state-dump\]|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z] \d+ \d+\] \(raylet\))"))

# libraries whose deprecation warnings (FutureWarning, DeprecationWarning) are hidden by default:
# notices for their callers' developers (transformers' `is_gradient_checkpointing`, which peft calls)
LIBRARIES = r"(transformers|peft|accelerate|torch|bitsandbytes|huggingface_hub)(\.|$)"


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger().setLevel(logging.INFO if verbose else logging.WARNING)  # also on a second run in one process
    if verbose:  # undo an earlier quiet run in the same process
        logging.getLogger("ray").setLevel(logging.NOTSET)
        logging.getLogger("ray.data").setLevel(logging.INFO)
    else:
        logging.getLogger("ray").setLevel(logging.ERROR)
        # Ray Data logs a failed task's whole traceback, per attempt: the error reaches the driver
        # as an exception anyway, and hpd prints its cause in one line
        logging.getLogger("ray.data").setLevel(logging.CRITICAL)


class LevelPrefix(logging.Formatter):
    """``warning: `` / ``error: `` before the message of a record at that level (INFO lines as they
    are), as `hpd extract` marks the warnings it prints (``hpd extract: warning: ...``)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        if record.levelno < logging.WARNING:
            return super().formatMessage(record)
        marked = logging.makeLogRecord(record.__dict__)  # a copy: other handlers see the record as it was
        marked.message = f"{'error' if record.levelno >= logging.ERROR else 'warning'}: {record.message}"
        return super().formatMessage(marked)


def log_to_stderr(format: str) -> None:
    """INFO and up to stderr in ``format``, warnings and errors marked (``LevelPrefix``); as
    ``logging.basicConfig``, nothing changes when the root logger already has a handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LevelPrefix(format))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def ray_init_options(verbose: bool) -> dict:
    return {} if verbose else {"logging_level": logging.ERROR, "log_to_driver": False}


def quiet_ray_data(verbose: bool) -> None:
    """Ray Data's progress bars / progress log blocks off (after ray is imported)."""
    import ray

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = verbose
    if hasattr(context, "enable_operator_progress_bars"):
        context.enable_operator_progress_bars = verbose
    logging.getLogger("ray.data").setLevel(logging.INFO if verbose else logging.CRITICAL)


@contextlib.contextmanager
def quiet_libraries(active: bool = True):
    """While the block runs (``active``): no transformers progress bars (the hub's download bars stay:
    a download takes minutes), no deprecation warnings of ``LIBRARIES``, bitsandbytes' log at ERROR
    only. As they were after it (a command also runs inside other processes: tests, a notebook)."""
    if not active:
        yield
        return
    import huggingface_hub.utils as hub
    from transformers.utils import logging as transformers_logging

    bars, downloads = transformers_logging.is_progress_bar_enabled(), not hub.are_progress_bars_disabled()
    transformers_logging.disable_progress_bar()  # the hub's bars too: the downloads' are put back
    if downloads:
        hub.enable_progress_bars()
    bitsandbytes = logging.getLogger("bitsandbytes")
    level = bitsandbytes.level
    bitsandbytes.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            for category in (FutureWarning, DeprecationWarning):
                warnings.filterwarnings("ignore", category=category, module=LIBRARIES)
            yield
    finally:
        bitsandbytes.setLevel(level)
        if bars:
            transformers_logging.enable_progress_bar()
        if not downloads:
            hub.disable_progress_bars()


class StderrFilter:
    """Drop ``NOISE`` lines written to file descriptor 2 while active (a context manager).

    fd 2 is pointed at a pipe; a thread copies what arrives to the real stderr, line by line, leaving
    out the noise. A partial line (a progress line rewritten in place) is passed on at once unless
    it may be the start of a C++ log line (they start with ``[``). Use it after ``ray.init`` so that
    the processes Ray starts keep the real stderr.
    """

    def __init__(self, active: bool = True) -> None:
        self.active = active

    def __enter__(self) -> StderrFilter:
        if not self.active:
            return self
        sys.stderr.flush()
        self._saved = os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self._thread = threading.Thread(target=self._pump, args=(read,), daemon=True)
        self._thread.start()
        return self

    def write(self, text: str) -> None:
        """``text`` to the real stderr at once, past the filter (for a thread about to end the process)."""
        sys.stderr.flush()
        if self.active:
            self._emit(text.encode())
        else:
            os.write(2, text.encode())

    def _emit(self, data: bytes) -> None:
        try:
            os.write(self._saved, data)
        except OSError:  # stderr gone (a closed pipe): keep draining, so that writers never block
            pass

    def _pump(self, read: int) -> None:
        pending = b""
        while data := os.read(read, 1 << 16):
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not any(pattern.search(line) for pattern in NOISE):
                    self._emit(line + b"\n")
            if pending and not pending.startswith(b"["):
                self._emit(pending)
                pending = b""
        if pending:
            self._emit(pending)
        os.close(read)

    def __exit__(self, *exc) -> None:
        if not self.active:
            return
        sys.stderr.flush()
        os.dup2(self._saved, 2)  # closes the pipe's write end: the thread sees the end and stops
        self._thread.join(timeout=5)
        os.close(self._saved)
