"""Start the trainer warm: a forked child of the agent, which imported the trainer's modules once.

Why: after a maintenance the machine boots, the startup script starts the agent, and the agent starts the
trainer. Started as a command (``python -m interlude_workload.train``), the trainer is a second interpreter
that imports numpy and google-cloud-storage again (~1 s on a quiet 2-core machine, more when loaded) before it
reads its checkpoint: time in which nothing trains, on every event. The agent imports them anyway (it reads
the plans from GCS), so it imports the trainer too (:func:`preload`) and forks; the child runs the trainer's
``main`` with the same arguments and exits with its code.

The trainer stays a separate process: SIGTERM is forwarded to its pid and its own handler commits the current
step; its exit code (0 done, 143 stopped after committing, 2 bad input) reaches the agent through ``waitpid``;
the agent waits for it before starting anything else, so there is still one writer of checkpoints.

Forking is safe only from a single-threaded process (a lock held by another thread at the fork stays held in
the child forever), so :func:`can_fork` says no when the agent has any other thread (Python's or a native
library's), and the agent then starts the trainer as a command, as before. ``python -m interlude_workload.train``
stays the way users run it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence


def preload() -> None:
    """Import what the trainer imports, once, in the agent: numpy, google-cloud-storage, the SDK, Orbax with JAX
    and tensorstore (~2.5 s of a cold start), and gcsfs (Orbax's client for gs:// paths, which fsspec imports only
    at a trainer's first save or restore).

    Imports only: no JAX backend is initialised, no file system or tensorstore context is made, so no thread is
    started (JAX's own fork warning is about an initialised backend; measured: the agent stays at one native thread,
    and :func:`can_fork` checks it). The forked trainer initialises its own backend and clients."""
    import importlib

    importlib.import_module("interlude_workload.train")  # first: it pins the BLAS thread pools to one thread
    importlib.import_module("gcsfs")
    importlib.import_module("etils.epath.backend")


def can_fork() -> bool:
    """A warm start needs fork() and a process with no other thread (see the module's docstring): no other Python
    thread, and no native one either (a library's thread pool: OpenBLAS's, tensorstore's, JAX's once a backend is
    up), which ``threading`` cannot see; Linux lists a process's threads in /proc/self/task."""
    return hasattr(os, "fork") and threading.active_count() == 1 and native_threads() <= 1


def native_threads() -> int:
    """This process's threads as the kernel counts them (1 where /proc is missing: nothing to go by)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


class ForkedTrainer:
    """The forked trainer, with the part of ``subprocess.Popen``'s interface the agent uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            _, status = os.waitpid(self.pid, 0)  # retried by Python after a signal handler ran (PEP 475)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Safe from a signal handler: no wait, no lock. An exited but unreaped child is a zombie that keeps
        its pid, so the signal can never reach another process."""
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass


def start(argv: Sequence[str]) -> ForkedTrainer:
    """Fork; the child runs ``interlude_workload.train.main(argv)`` and never returns."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # or the child would print the agent's buffered output a second time
    # SIGTERM/SIGINT stay blocked across the fork: one arriving in between is delivered after it, to the agent
    # (whose handler forwards it to the child's pid) or to the child once its handlers are a new process's.
    stops = {signal.SIGTERM, signal.SIGINT}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child ends in os._exit (covered by the agent tests' log lines)
        _run_child(list(argv), previous)
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return ForkedTrainer(pid)


def _run_child(argv: list[str], mask: set[signal.Signals]) -> None:
    code = 1
    try:
        # The agent's handlers only set its flags: the trainer starts with the defaults a new process has,
        # until its Checkpointer installs its own SIGTERM handler.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        from interlude_workload import train

        code = train.main(argv)
    except SystemExit as exc:  # argparse's errors (2), or a sys.exit() in user code
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the child must end here whatever happened, with the traceback said
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
