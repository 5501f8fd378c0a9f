"""One run at a time per output folder: `OutputDirLock`, held by `scratchbert pretrain` and `finetune`."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from accelerate import Accelerator, PartialState
from accelerate.utils import broadcast_object_list

from scratchbert.errors import ScratchBertError

try:
    import fcntl
except ImportError:  # Windows: runs are not locked
    fcntl = None


LOCK_FILE = ".scratchbert.lock"  # while a run writes in a folder: which process holds it

logger = logging.getLogger(__name__)


class OutputDirLock:
    """One run at a time per output folder: an exclusive lock on the folder itself.

    A second run given the same --output-dir (a second terminal, a job started twice), here or on
    another machine that shares the folder, stops with an error instead of writing its
    checkpoints between the first run's or, with --overwrite, deleting them. The lock is the
    operating system's (`flock` on the folder), so it ends with the process that holds it: a run
    that was killed leaves nothing to clean up, and a run refused for bad input writes nothing.
    Once the run writes, `LOCK_FILE` says who holds the folder, for the error a second run
    gives. The main process holds it; on a file system without locks (some network mounts), or
    on Windows, runs are not locked. `kind` names the run in that file ("scratchbert pretrain").

    A folder that did not exist at the first `claim` is locked only once the run makes it, so
    another run may have written there meanwhile: `claim(..., recheck=...)` looks again, under
    the lock and before the first write (`folder_existed` says which case it is).
    """

    def __init__(self, output_dir: str | os.PathLike, kind: str):
        self.folder = Path(output_dir)
        self.kind = kind
        self._fd: int | None = None
        self.folder_existed: bool | None = None  # at the first claim (main process)

    def __enter__(self) -> OutputDirLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def claim(self, state: Accelerator | PartialState, writing: bool = False, recheck: Callable[[], str | None] | None = None) -> None:
        """Hold the lock if the folder exists (a no-op once held); raise on every process if another run holds it.

        writing: the run writes there from now on, so the folder is made first, and once held it
        says who holds it.
        recheck: called on the main process once the lock is held, before anything is written:
        a message refuses the folder (e.g. another run finished there meanwhile).
        """
        refused = None
        if state.is_main_process:
            if self.folder_existed is None:
                self.folder_existed = self.folder.is_dir()
            try:
                refused = self._claim_here(writing, recheck)
            except PermissionError as error:  # a read-only folder (the holder's note cannot be written)
                refused = (
                    f"--output-dir {self.folder} is not writable ({error.strerror}: {error.filename}): "
                    "choose another --output-dir, or make it writable."
                )
        if state.num_processes > 1:  # only the main process knows, and every process must stop
            refused = broadcast_object_list([refused])[0]
        if refused:
            raise ScratchBertError(refused, every_process=True)

    def _claim_here(self, writing: bool, recheck: Callable[[], str | None] | None) -> str | None:
        """The main process's part of `claim`: the message that refuses the folder, or None."""
        if writing:
            self.folder.mkdir(parents=True, exist_ok=True)
        refused = self._try_lock() if self._fd is None and self.folder.is_dir() else None
        if refused is None and recheck is not None:
            refused = recheck()
        if writing and refused is None:
            self._write_holder()
        return refused

    def _try_lock(self) -> str | None:
        """Lock the folder; the error message when another process holds it."""
        if fcntl is None:
            return None
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            try:
                holder = (self.folder / LOCK_FILE).read_text(encoding="utf-8").strip()
            except OSError:
                holder = "still checking its inputs"
            return f"{self.folder} is in use by another run ({holder}). Wait for it to end or stop it, or choose another --output-dir."
        except OSError as error:  # no locks on this file system: run unlocked
            os.close(fd)
            logger.debug("output folder %s not locked: %s", self.folder, error)
            return None
        self._fd = fd
        (self.folder / LOCK_FILE).unlink(missing_ok=True)  # a killed run's: it held the lock no longer
        return None

    def _write_holder(self) -> None:
        """Say who holds the folder, in `LOCK_FILE`."""
        if self._fd is not None:
            since = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            holder = f"{self.kind}, process {os.getpid()} on {socket.gethostname()}, since {since}"
            (self.folder / LOCK_FILE).write_text(holder + "\n", encoding="utf-8")

    def release(self) -> None:
        """Let the next run in."""
        if self._fd is not None:
            (self.folder / LOCK_FILE).unlink(missing_ok=True)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def folder_contents(path: Path) -> str | None:
    """What any command would replace in `path`: anything at all (None when it is empty or absent)."""
    return "files (it is not empty)" if path.is_dir() and any(path.iterdir()) else None


def check_output_folder(path: str | Path, overwrite: bool, *, resume: bool | None = None, held=folder_contents) -> Path:
    """The one check of an `--output-dir` before a command writes there (pretrain, prepare-data, finetune).

    path:      the folder the command will write.
    overwrite: --overwrite was passed: what the folder holds may be replaced (the caller deletes it,
               and only once its new inputs are known to be good).
    resume:    None for a command without --resume; True lets a folder that holds a run through
               (the caller then checks that the checkpoint belongs to this run).
    held:      path -> a description of what the command would replace there, or None when
               nothing; `folder_contents` (any file) unless the command knows better (`run_contents`).

    Reads the folder only and returns it as a Path. Raises a ScratchBertError when path is a file
    or cannot be written, or when it holds something and neither --overwrite nor --resume says
    what to do with it.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ScratchBertError(f"--output-dir {path} is a file, not a directory: choose another path.")
    check_writable(path)
    if overwrite or resume:
        return path
    contents = held(path)
    if contents is None:
        return path
    choices = "pass --resume to continue it, --overwrite to start over" if resume is not None else "pass --overwrite to replace it"
    raise ScratchBertError(f"--output-dir {path} already holds {contents}: {choices}, or choose another --output-dir.")


def check_writable(path: Path) -> None:
    """Refuse a folder the command could not write, before any long work: the folder itself, or
    the nearest existing folder above it, where it would be made."""
    existing = next(folder for folder in (path, *path.absolute().parents) if folder.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "it" if existing == path else f"{existing}, where it would be made,"
        raise ScratchBertError(
            f"--output-dir {path}: {where} is read-only for this user: choose another --output-dir, or make it writable."
        )
