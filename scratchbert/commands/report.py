"""How a command reports an error (the policy is in `scratchbert.errors`).

A `ScratchBertError` is printed as one line, `scratchbert <command>: error: <what and how to
fix it>`, with exit status 2; any other exception is a bug and propagates with its traceback.
Under `accelerate launch`, an error all processes agreed on is printed by the main process only.
`SCRATCHBERT_DEBUG=1` (or `scratchbert --debug`) lets user errors raise with theirs too.
Ctrl-C and SIGTERM stop a command with one line and status 130 or 143 (`stopping.py`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from scratchbert.errors import ScratchBertError

from .stopping import exit_status, terminate_as_interrupt

DEBUG_VARIABLE = "SCRATCHBERT_DEBUG"


def debugging() -> bool:
    """Whether user errors should keep their traceback (`SCRATCHBERT_DEBUG` set to 1, true or yes)."""
    return os.environ.get(DEBUG_VARIABLE, "").lower() in ("1", "true", "yes")


def report_errors(run: Callable[[argparse.Namespace], int | None], args: argparse.Namespace, prog: str) -> int:
    """Run a command; a user's error becomes one line on stderr and exit status 2, Ctrl-C or SIGTERM
    one line and status 128 + the signal's number."""
    debug = getattr(args, "debug", False) or debugging()
    try:
        with terminate_as_interrupt():
            return int(run(args) or 0)
    except ScratchBertError as err:
        if debug:
            raise
        if not err.every_process or _main_process():
            print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:  # what the command had to say about where it stopped, it said
        if debug:
            raise
        name, status = exit_status(interrupt)
        if _main_process():
            print(f"{prog}: stopped by {name}", file=sys.stderr)
        return status


def _main_process() -> bool:
    """Whether this is the main process of a launch, or the only process (read from `RANK`, which
    `accelerate launch` sets for each process, so that reporting an error never starts a state)."""
    return os.environ.get("RANK", "0") == "0"


__all__ = ["DEBUG_VARIABLE", "debugging", "report_errors"]
