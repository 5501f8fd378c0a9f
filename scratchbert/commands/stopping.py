"""How a command stops when it is told to: Ctrl-C (SIGINT) and SIGTERM end it the same way.

SIGTERM is what `kill`, schedulers (Slurm, Kubernetes) and `accelerate launch` send to stop a job.
Python's default is to die at once, saying nothing; here it raises `Terminated`, a
`KeyboardInterrupt`, so the code that handles Ctrl-C handles it too (`pretrain` says where
`--resume` starts), and `report_errors` ends the command with status 128 + the signal's number
(130 for SIGINT, 143 for SIGTERM, as a shell reports a process the signal stopped), no traceback.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stop as Ctrl-C stops."""

    signum = signal.SIGTERM


@contextlib.contextmanager
def terminate_as_interrupt():
    """Within the block, SIGTERM raises `Terminated` (where a handler can be set: the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_terminated(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM while stopping does not cut the stop short
    raise Terminated()


def exit_status(interrupt: KeyboardInterrupt) -> tuple[str, int]:
    """The signal that stopped a command, and the status it exits with (128 + its number)."""
    signum = signal.Signals(getattr(interrupt, "signum", signal.SIGINT))
    return signum.name, 128 + signum.value


__all__ = ["Terminated", "exit_status", "terminate_as_interrupt"]
