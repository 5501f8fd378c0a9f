"""The errors scratchbert reports to its users.

Every error a user can fix (a bad option, a missing or corrupt file, data that does not
fit the model) is a `ScratchBertError`: its message is one line that names the problem
and the fix. The command line prints it as that one line and exits non-zero; library
callers can catch it (it is a `ValueError`, so code written against the plain exceptions
keeps working).
"""

from __future__ import annotations


class ScratchBertError(ValueError):
    """A problem the user can fix; the message says what it is and how."""


class CorruptCheckpointError(ScratchBertError):
    """Model weights that cannot be read: truncated, half-written, or not a weights file at all."""


class NonFiniteLossError(ScratchBertError):
    """The loss became NaN or infinite: training stops and nothing new is saved."""


def corrupt_weights(path, reason: str) -> CorruptCheckpointError:
    """The one message every command gives for weights it cannot read."""
    return CorruptCheckpointError(
        f"{path} is corrupt or incomplete ({reason}): the weights cannot be read. Copy the file again, or save the "
        "model again from a checkpoint that loads (e.g. `scratchbert pretrain --resume` rewrites the final model)."
    )


__all__ = ["ScratchBertError", "CorruptCheckpointError", "NonFiniteLossError", "corrupt_weights"]
