"""Training checkpoints that a crash cannot damage.

Layout of a run's output directory:

    output_dir/
      checkpoints/
        step-200/                 accelerator.save_state(...): model, optimizer, scheduler,
          trainer_state.json      sampler and every process's RNG streams; plus our own
        step-400/                 counters (step, epoch, position in the epoch) and the config
        .tmp-step-600/            a checkpoint being written (ignored, removed on the next save)
        .deleting-step-200/       an old checkpoint being removed (ignored, removed on the next save)

Why it is safe: a checkpoint is written into `.tmp-step-N` and only then renamed to
`step-N`. A rename within one directory is atomic on POSIX filesystems, so `step-N`
either does not exist or is complete; a process killed mid-write leaves only a
`.tmp-*` directory, which `list_checkpoints` never returns. `trainer_state.json` is
written last and checked on load, as a second guard (e.g. against a copy made by hand).
Old checkpoints are deleted only after the new one is in place, and each is first renamed to a
`.deleting-*` name, so an interrupted deletion leaves no half-emptied `step-N` behind. A save
the disk refuses (it is full) removes what it wrote and stops with a one-line error; the
previous checkpoint stays the newest. `resumable_checkpoint` reads the newest checkpoint's
files before a resumed run writes anything, and names one that was cut short.

All processes must call `save_checkpoint` (every rank writes its own RNG state); the
renames and deletions happen on the main process, between barriers. For multi-node runs
the output directory must be on a filesystem every node sees.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import zipfile
from pathlib import Path

from accelerate import Accelerator
from accelerate.utils import gather_object

from scratchbert.errors import CorruptCheckpointError, ScratchBertError, disk_full
from scratchbert.training.pretraining.config import PretrainConfig, resumable_options
from scratchbert.training.pretraining.corpus import TOKENIZER_DIR
from scratchbert.training.pretraining.sharding import unsharded_copy
from scratchbert.training.run_setup import OutputDirLock, check_output_folder

CHECKPOINTS = "checkpoints"

STATE_FILE = "trainer_state.json"

TMP_PREFIX = ".tmp-"

DELETING_PREFIX = ".deleting-"

_STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / CHECKPOINTS / f"step-{step}"


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints as `(step, path)`, oldest first; temporary directories are skipped."""
    root = Path(output_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_DIR.match(path.name)
        if match and path.is_dir() and (path / STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def _fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json(path: Path, values: dict) -> None:
    """Write JSON and fsync it, so a checkpoint's state file is on disk before the rename."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(values, handle, indent=2)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())


def save_checkpoint(accelerator, output_dir: str | Path, step: int, trainer_state: dict, keep_last: int) -> Path:
    """Write `output_dir/checkpoints/step-<step>` atomically and keep only the last `keep_last`.

    Call on every process. `trainer_state` is stored as `trainer_state.json` next to the
    files of `accelerator.save_state`. Returns the final checkpoint path. Raises a
    ScratchBertError on every process, having removed what it wrote, when the disk is full.
    """
    root = Path(output_dir) / CHECKPOINTS
    final = root / f"step-{step}"
    tmp = root / f"{TMP_PREFIX}step-{step}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(root)
        tmp.mkdir()
    accelerator.wait_for_everyone()
    _write_or_stop(accelerator, tmp, trainer_state, final)
    if accelerator.is_main_process:
        if final.exists():  # the same step saved again (e.g. a resumed run): swap, then delete the old one
            retired = root / f"{TMP_PREFIX}retired-step-{step}"
            final.rename(retired)
            tmp.rename(final)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            tmp.rename(final)
        _fsync_dir(root)
        for _, old in list_checkpoints(output_dir)[:-keep_last]:
            _delete(old)
    accelerator.wait_for_everyone()
    return final


def _remove_leftovers(root: Path) -> None:
    """What a crash left: a checkpoint half written (`.tmp-*`) or half deleted (`.deleting-*`)."""
    for prefix in (TMP_PREFIX, DELETING_PREFIX):
        for stale in root.glob(f"{prefix}*"):
            shutil.rmtree(stale, ignore_errors=True)


def _delete(checkpoint: Path) -> None:
    """Remove a checkpoint so that an interruption leaves it complete or gone: renamed out of the
    `step-N` names first (atomic), then deleted (the next save finishes an interrupted deletion)."""
    doomed = checkpoint.with_name(DELETING_PREFIX + checkpoint.name)
    checkpoint.rename(doomed)
    _fsync_dir(checkpoint.parent)
    shutil.rmtree(doomed, ignore_errors=True)


def _write_or_stop(accelerator, tmp: Path, trainer_state: dict, final: Path) -> None:
    """Every process writes its part into `tmp`; if the disk refused any part, all stop together.

    The processes agree through a gather (which is also the barrier after writing), so a rank
    whose write failed cannot leave the others waiting. `tmp` is removed before the error.
    """
    refused = None
    try:
        with _quiet_about_tied_weights():
            accelerator.save_state(str(tmp))
        if accelerator.is_main_process:
            write_json(tmp / STATE_FILE, trainer_state)
    except Exception as error:  # torch, safetensors and the OS each report a full disk their own way
        if not disk_full(error, tmp):
            raise
        refused = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    refused = agreed_refusal(accelerator, refused)
    if refused is None:
        return
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    newest = list_checkpoints(final.parent.parent)
    kept = f"{newest[-1][1]} is still the newest checkpoint" if newest else "no checkpoint was kept"
    raise ScratchBertError(
        f"the disk is full: checkpoint {final.name} could not be written in {final.parent} ({refused}) and was removed; "
        f"{kept}. Free some space (or lower --keep-last), then continue with --resume.",
        every_process=True,
    )


def agreed_refusal(accelerator, refused: str | None) -> str | None:
    """The first process's reason to stop (None when none has one), known to every process: a
    gather, so it is also a barrier, and a process that failed to write cannot leave the others waiting."""
    refusals = gather_object([refused]) if accelerator.num_processes > 1 else [refused]
    return next((why for why in refusals if why), None)


class _DropTiedWeightNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Removed shared tensor" not in record.getMessage()


@contextlib.contextmanager
def _quiet_about_tied_weights():
    """`save_state` warns on every save that it stored the tied MLM decoder weight once (safetensors
    cannot hold one tensor twice). That is expected here and `load_state` re-ties it (the
    resume test proves it), so the notice is dropped rather than repeated at every checkpoint."""
    notice_filter = _DropTiedWeightNotice()
    logger = logging.getLogger("accelerate.utils.other")
    logger.addFilter(notice_filter)
    try:
        yield
    finally:
        logger.removeFilter(notice_filter)


def read_trainer_state(path: str | Path) -> dict:
    """The `trainer_state.json` of a checkpoint; a clear error if the checkpoint is damaged."""
    path = Path(path)
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise ScratchBertError(f"{path} is not a complete checkpoint (no {STATE_FILE}); delete it or resume from another one.")
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ScratchBertError(f"{state_file} is damaged ({err}); delete {path} to resume from the checkpoint before it.") from None
    missing = [key for key in ("step", "epoch", "batches_in_epoch", "config") if key not in state]
    if missing:
        raise ScratchBertError(f"{state_file} lacks {', '.join(missing)}: it was not written by scratchbert pretrain.")
    return state


def damage(path: str | Path) -> str | None:
    """What is wrong with checkpoint `path`'s files (a cut or half-copied one), or None when each reads whole.

    Only the structure is read, not the tensors: a safetensors header records every tensor's
    byte range (so a cut file fails to open), and torch's `.bin`/`.pkl` are zips whose
    directory sits at their end (so a cut one is no zip at all).
    """
    from safetensors import safe_open

    for file in sorted(Path(path).iterdir()):
        try:
            if file.suffix == ".safetensors":
                with safe_open(str(file), framework="pt"):
                    pass
            elif file.suffix in (".bin", ".pkl", ".pt") and not zipfile.is_zipfile(file):
                return f"{file.name} is cut short or not a torch file"
        except Exception as error:  # safetensors' errors have no base class of their own
            return f"{file.name}: {str(error).splitlines()[0]}"
    return None


def resumable_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest checkpoint, once its files are known to read whole; None when there is none.

    A damaged newest checkpoint is refused, not passed over: a run resumed from the one before
    would save over the damaged one at its step, and it may be a copy still being made or a file
    that can be restored. The error names the previous complete checkpoint and how to take it.
    """
    existing = list_checkpoints(output_dir)
    if not existing:
        return None
    latest = existing[-1][1]
    problem = damage(latest)
    if problem is None:
        return latest
    previous = next((path for _, path in reversed(existing[:-1]) if damage(path) is None), None)
    fix = (
        f"move it away or delete it to resume from {previous.name}, the newest complete one"
        if previous
        else "no earlier checkpoint is complete: copy the file again, or start over with --overwrite"
    )
    raise CorruptCheckpointError(f"the newest checkpoint {latest} is damaged ({problem}), so --resume cannot continue from it: {fix}.")


def config_differences(saved: dict, current: dict) -> list[str]:
    """Options whose change would make a resumed run differ from the run that wrote the checkpoint."""
    saved = PretrainConfig.from_dict(saved).to_dict()  # resolved as the run was: an option it lacks reads as its default
    names = sorted((set(saved) | set(current)) - resumable_options())
    return [
        f"{name}: checkpoint {saved.get(name)!r}, now {current.get(name)!r}"
        for name in names
        if saved.get(name) != current.get(name)
    ]


def check_compatible(path: str | Path, current_config: dict) -> dict:
    """Read a checkpoint's state and raise a ValueError if `current_config` cannot continue it."""
    state = read_trainer_state(path)
    differences = config_differences(state["config"], current_config)
    if differences:
        raise ScratchBertError(
            f"the checkpoint {path} was written by a run with different options, so it cannot be resumed "
            "exactly:\n  " + "\n  ".join(differences) + "\nUse the same options (or its saved "
            "pretrain_config.json via --config), or choose another --output-dir, or pass --overwrite to start over."
        )
    return state


def load_checkpoint(accelerator, path: str | Path) -> dict:
    """Restore model, optimizer, scheduler, sampler and RNG streams; return the trainer state."""
    state = read_trainer_state(path)
    accelerator.load_state(str(path))
    return state

# ---------------------------------------------------------------------------------------------
# A pretraining run's output folder: checked before the run starts, written once its inputs are good.
# ---------------------------------------------------------------------------------------------


LOG_FILE = "train_log.jsonl"

CURVES_FILE = "training_curves.png"

KERNEL_DECISIONS_FILE = "kernel_decisions.json"

RUN_CONFIG_FILE = "pretrain_config.json"

# What a finished run leaves in its folder besides checkpoints/ (the model, its tokenizer, the record).
FINAL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "generation_config.json", LOG_FILE, CURVES_FILE)


def run_contents(path: Path) -> str | None:
    """What a pretraining run would replace in `path`: a run's checkpoints, configuration or finished model."""
    existing = list_checkpoints(path)
    if existing:
        return f"a run (checkpoints up to {existing[-1][1].name})"
    if any((path / name).exists() for name in (RUN_CONFIG_FILE, "config.json", "model.safetensors")):
        return "a run (a saved model or a run's configuration)"
    return None


def check_output_dir(config: PretrainConfig) -> dict | None:
    """Decide between a fresh start and a resumption; return the checkpoint's state to resume from.

    Reads the folder only (`check_output_folder`). Raises a ScratchBertError when the checkpoint
    to resume is damaged (`resumable_checkpoint`) or belongs to a different run.
    """
    output_dir = check_output_folder(config.output_dir, config.overwrite, resume=config.resume, held=run_contents)
    if config.overwrite:
        return None
    latest = resumable_checkpoint(output_dir)
    if latest is None:
        return None
    state = check_compatible(latest, config.to_dict())
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
                shutil.rmtree(output_dir / CHECKPOINTS, ignore_errors=True)
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
    unwrapped.config.sparse_prediction = False  # whoever loads it gets BertForMaskedLM's (B, S, V) logits in every mode
    refused = None
    try:
        unwrapped.save_pretrained(output_dir, is_main_process=accelerator.is_main_process, save_function=accelerator.save, state_dict=state_dict)
        if accelerator.is_main_process:
            tokenizer.save_pretrained(output_dir)
    except Exception as error:  # torch, safetensors and the OS each report a full disk their own way
        if not disk_full(error, output_dir):
            raise
        refused = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    refused = agreed_refusal(accelerator, refused)
    if refused is not None:
        _refuse_half_saved_model(accelerator, output_dir, refused)


def _refuse_half_saved_model(accelerator: Accelerator, output_dir: Path, refused: str) -> None:
    """Remove what a save the disk cut short wrote of the final model, and say so on every process."""
    if accelerator.is_main_process:
        for name in ("config.json", "model.safetensors", "pytorch_model.bin", "generation_config.json"):
            (output_dir / name).unlink(missing_ok=True)
    newest = list_checkpoints(output_dir)
    kept = f"the last checkpoint, {newest[-1][1]}, is whole" if newest else "no checkpoint was written"
    raise ScratchBertError(
        f"the disk is full: the final model could not be saved in {output_dir} ({refused}) and its partial files were removed; "
        f"{kept}. Free some space, then run again with --resume (it saves the final model again).",
        every_process=True,
    )
