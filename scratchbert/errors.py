"""The errors scratchbert reports to its users, and the policy that decides which they are.

The policy:

- Every error a user can fix (a bad option, a missing or corrupt file, data that does not fit
  the model) is a `ScratchBertError`: its message is one line that names the problem and the
  fix. It is a `ValueError` (and `MissingFileError` also a `FileNotFoundError`), so code
  written against the plain exceptions keeps catching it.
- Anything else (a plain `ValueError`, `TypeError`, ...) is a programming error: a bug in
  scratchbert or in the code calling it.
- The command line prints a `ScratchBertError` as one line and exits with status 2; every
  other exception keeps its traceback. `SCRATCHBERT_DEBUG=1` (or `scratchbert --debug`) shows
  the traceback of a user's error too.
- Under `accelerate launch` each process prints its own error, except one the processes agreed
  on (`every_process=True`: the main process found it and told the others, as the folder lock
  and the NaN check do), which the main process prints once.
"""

from __future__ import annotations

import errno
import shutil

# Below this much free space, a write that failed without saying why is taken for a full disk.
NEARLY_FULL_BYTES = 64 * 2**20
_FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class ScratchBertError(ValueError):
    """A problem the user can fix; the message says what it is and how.

    every_process: every process of a launch raises this error together, having agreed on it
    through a collective, so one process saying it is enough.
    """

    def __init__(self, *args, every_process: bool = False):
        super().__init__(*args)
        self.every_process = every_process


class MissingFileError(ScratchBertError, FileNotFoundError):
    """A file or folder the user named does not exist (or is not what it must be)."""


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


def disk_full(error: BaseException, folder) -> bool:
    """Whether `error`, raised while writing into `folder`, means its disk (or quota) is full.

    The OS says so with ENOSPC or EDQUOT, safetensors in its message; torch's zip writer only
    says "unexpected pos", so a write error with under `NEARLY_FULL_BYTES` left counts too.
    """
    if isinstance(error, OSError):
        return error.errno in _FULL_DISK_ERRNOS
    if "No space left on device" in str(error) or "Disk quota exceeded" in str(error):
        return True
    if not isinstance(error, RuntimeError):
        return False
    try:
        return shutil.disk_usage(folder).free < NEARLY_FULL_BYTES
    except OSError:
        return False


__all__ = ["ScratchBertError", "MissingFileError", "CorruptCheckpointError", "NonFiniteLossError", "corrupt_weights", "disk_full"]
