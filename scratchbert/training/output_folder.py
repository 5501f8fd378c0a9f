"""A pretraining run's output folder: checked before the run starts, written once its inputs are good.

    output_dir/
      pretrain_config.json   the run's options
      tokenizer/             the tokenizer the run started with (a resumed run keeps it)
      checkpoints/           `checkpoint.py`
      train_log.jsonl        `run_log.RunLog`; logs/ holds Accelerate's trackers
      kernel_decisions.json  the CPU kernel each matrix product runs on (`cpu_gemm.decisions_kept_in`):
                             a resumed or overwriting run on this machine takes them instead of timing again
      config.json, model.safetensors, the tokenizer's files, training_curves.png: the finished model
      .scratchbert.lock      while a run writes here: which process holds the folder (`folder_lock.py`)
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from accelerate import Accelerator

from scratchbert.errors import ScratchBertError, disk_full
from scratchbert.training import checkpoint as ckpt
from scratchbert.training.config import PretrainConfig
from scratchbert.training.corpus import TOKENIZER_DIR
from scratchbert.training.folder_lock import OutputDirLock
from scratchbert.training.sharding import unsharded_copy

LOG_FILE = "train_log.jsonl"
CURVES_FILE = "training_curves.png"
KERNEL_DECISIONS_FILE = "kernel_decisions.json"
RUN_CONFIG_FILE = "pretrain_config.json"
# What a finished run leaves in its folder besides checkpoints/ (the model, its tokenizer, the record).
FINAL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "generation_config.json", LOG_FILE, CURVES_FILE)


def folder_contents(path: Path) -> str | None:
    """What any command would replace in `path`: anything at all (None when it is empty or absent)."""
    return "files (it is not empty)" if path.is_dir() and any(path.iterdir()) else None


def run_contents(path: Path) -> str | None:
    """What a pretraining run would replace in `path`: a run's checkpoints, configuration or finished model."""
    existing = ckpt.list_checkpoints(path)
    if existing:
        return f"a run (checkpoints up to {existing[-1][1].name})"
    if any((path / name).exists() for name in (RUN_CONFIG_FILE, "config.json", "model.safetensors")):
        return "a run (a saved model or a run's configuration)"
    return None


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


def check_output_dir(config: PretrainConfig) -> dict | None:
    """Decide between a fresh start and a resumption; return the checkpoint's state to resume from.

    Reads the folder only (`check_output_folder`). Raises a ScratchBertError when the checkpoint
    to resume is damaged (`ckpt.resumable_checkpoint`) or belongs to a different run.
    """
    output_dir = check_output_folder(config.output_dir, config.overwrite, resume=config.resume, held=run_contents)
    if config.overwrite:
        return None
    latest = ckpt.resumable_checkpoint(output_dir)
    if latest is None:
        return None
    state = ckpt.check_compatible(latest, config.to_dict())
    state["path"] = str(latest)
    return state


def prepare_output_dir(config: PretrainConfig, accelerator: Accelerator, tokenizer, fresh_start: bool, lock: OutputDirLock) -> None:
    """Make the folder ready for the run, once its inputs are known to be good (main process writes).

    With --overwrite the old checkpoints and final model go only now, after the new run's data
    was built. A fresh start saves its tokenizer; a resumed run keeps the one it started with.
    A folder made only now (it was absent when checked) is looked at again under the lock: a
    run that finished there meanwhile is refused, not overwritten (`taken_meanwhile`).
    """
    output_dir = Path(config.output_dir)
    recheck = None if config.overwrite else lambda: taken_meanwhile(output_dir, lock)
    lock.claim(accelerator, writing=True, recheck=recheck)  # a folder that did not exist when the run started is claimed only now
    if accelerator.is_main_process:
        try:
            if config.overwrite:
                shutil.rmtree(output_dir / ckpt.CHECKPOINTS, ignore_errors=True)
                for name in FINAL_FILES:
                    (output_dir / name).unlink(missing_ok=True)
            config.save(output_dir / RUN_CONFIG_FILE)  # atomic: the old record stays whole if this fails
            if fresh_start or not (output_dir / TOKENIZER_DIR).is_dir():
                tokenizer.save_pretrained(output_dir / TOKENIZER_DIR)
        except OSError as error:
            if not disk_full(error, output_dir):
                raise
            raise ScratchBertError(f"the disk of --output-dir {output_dir} is full ({error.strerror}): free some space and run again.") from None
    accelerator.wait_for_everyone()


def taken_meanwhile(output_dir: Path, lock: OutputDirLock) -> str | None:
    """Why a folder that was absent when this run checked it may not be written now: another run's
    checkpoints, configuration or model appeared there while this one prepared its data."""
    if lock.folder_existed:  # held since the check: nothing else wrote there
        return None
    contents = run_contents(output_dir)
    if contents is None:
        return None
    return (
        f"--output-dir {output_dir} was empty when this run started, but another run has since written {contents} there: "
        "nothing was changed. Pass --resume to continue it, --overwrite to replace it, or choose another --output-dir."
    )


def save_final_model(accelerator: Accelerator, model, tokenizer, output_dir: Path, finetune_dropout: float) -> None:
    """`save_pretrained` of model (safetensors + config.json) and tokenizer into `output_dir`.

    The saved config carries `finetune_dropout` as both dropout rates: dropout is a training
    choice, and whoever loads the model next fine-tunes it. (The packed recipe pretrains
    without dropout, as Cramming does, and like Cramming turns it back on for fine-tuning.)
    A full disk stops every process with one line, the half-written model removed.
    """
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_fsdp2 and accelerator.is_main_process:  # the gathered weights in scratchbert's own class (sharding.py)
        unwrapped, state_dict = unsharded_copy(unwrapped, state_dict), None
    unwrapped.config.hidden_dropout_prob = unwrapped.config.attention_probs_dropout_prob = finetune_dropout
    refused = None
    try:
        unwrapped.save_pretrained(output_dir, is_main_process=accelerator.is_main_process, save_function=accelerator.save, state_dict=state_dict)
        if accelerator.is_main_process:
            tokenizer.save_pretrained(output_dir)
    except Exception as error:  # torch, safetensors and the OS each report a full disk their own way
        if not disk_full(error, output_dir):
            raise
        refused = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    refused = ckpt.agreed_refusal(accelerator, refused)
    if refused is not None:
        _refuse_half_saved_model(accelerator, output_dir, refused)


def _refuse_half_saved_model(accelerator: Accelerator, output_dir: Path, refused: str) -> None:
    """Remove what a save the disk cut short wrote of the final model, and say so on every process."""
    if accelerator.is_main_process:
        for name in ("config.json", "model.safetensors", "pytorch_model.bin", "generation_config.json"):
            (output_dir / name).unlink(missing_ok=True)
    newest = ckpt.list_checkpoints(output_dir)
    kept = f"the last checkpoint, {newest[-1][1]}, is whole" if newest else "no checkpoint was written"
    raise ScratchBertError(
        f"the disk is full: the final model could not be saved in {output_dir} ({refused}) and its partial files were removed; "
        f"{kept}. Free some space, then run again with --resume (it saves the final model again).",
        every_process=True,
    )
