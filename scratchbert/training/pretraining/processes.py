"""The processes of a pretraining run and the guarantees around it, entered once (`guarded_run`).

- `start_processes` / `build_accelerator`: the process group (gloo without GPUs), its collective deadline,
  the `Accelerator` (devices, mixed precision, trackers, a replayable data order).
- `naming_lost_processes`: a process killed or hung is named in one line, with the checkpoint to --resume
  from, within bounded time (the deadline; with more than two processes, a heartbeat in the launch's store).
- `check_shared_output_dir`: on several machines, an output folder they do not share is refused (measured:
  without the check a run on two local folders "finishes" with machine 0's checkpoints lacking process 1's
  random state).
- `check_same_versions`: processes that run a different scratchbert (source digest), torch, transformers or
  accelerate are refused, naming which has which.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import os
import secrets
import socket
import threading
import time
from datetime import timedelta
from functools import partial
from importlib import metadata
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator, PartialState
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, broadcast_object_list, is_tensorboard_available

import scratchbert
from scratchbert import cpu_gemm
from scratchbert.errors import ScratchBertError
from scratchbert.tokenization import load_tokenizer
from scratchbert.training.pretraining import checkpoint as ckpt
from scratchbert.training.pretraining import prepared
from scratchbert.training.pretraining.config import DEFAULT_VOCAB_SIZE, PretrainConfig
from scratchbert.training.pretraining.precision import auto_precision
from scratchbert.training.run_setup import OutputDirLock, progress_bars

DEFAULT_DDP_TIMEOUT = PretrainConfig.ddp_timeout  # seconds a collective waits for the other processes: the option's default
TIMEOUT_FLAG = "ddp_timeout in a --config file"
SHARED_CHECK_PREFIX = ".scratchbert-shared-check-"  # the file `check_shared_output_dir` writes, then deletes
SHARED_FOLDER_WAIT = 10.0  # seconds a process looks for that file: a network file system may show it late
HEARTBEAT_SECONDS = 1.0  # how often each process of a launch of more than two says it is alive
SILENCE_BEATS = 3  # heartbeats missed before a process counts as gone
HEARTBEAT_KEY = "scratchbert/heartbeat/"
# What gloo and NCCL say when a peer's connection closes or a collective passes its deadline.
_CLOSED = ("connection reset by peer", "connection closed by peer", "broken pipe", "connection refused", "communicator was aborted")
_TIMED_OUT = ("timed out", "timeout")
PACKAGES = ("torch", "transformers", "accelerate")


def settle_mixed_precision(config: PretrainConfig) -> PretrainConfig:
    """`--mixed-precision auto` made concrete, before the Accelerator that fixes a run's precision exists.

    A resumed run keeps the precision its checkpoint trained in. Otherwise the main process
    decides (`precision.auto_precision`: on a CPU a timed trial of the run's model, batch and
    masking rate, with the vocabulary `trial_vocab_size` expects) and tells the others, so every process trains alike. The
    returned config names the precision chosen, and so does the pretrain_config.json it saves.
    """
    if config.mixed_precision != "auto":
        return config
    state = PartialState(cpu=not has_accelerator_device())  # the Accelerator built next shares it
    decision, failure = [None], None
    if state.is_main_process:
        try:
            decision = [_auto_decision(config)]
        except Exception as err:  # e.g. a damaged checkpoint: the other ranks must not wait for an answer
            decision, failure = [("error", str(err))], err
    if state.num_processes > 1:
        broadcast_object_list(decision, from_process=0)
    choice, reason = decision[0]
    if choice == "error":
        if failure is not None:
            raise failure
        raise ScratchBertError(f"the main process could not settle --mixed-precision auto: {reason}", every_process=True)
    state.print(f"--mixed-precision auto: {reason}")
    return dataclasses.replace(config, mixed_precision=choice)


def _auto_decision(config: PretrainConfig) -> tuple[str, str]:
    checkpoints = ckpt.list_checkpoints(config.output_dir) if config.resume else []
    if checkpoints:
        resumed = ckpt.read_trainer_state(checkpoints[-1][1])["config"].get("mixed_precision", "no")
        return resumed, f"{'fp32' if resumed == 'no' else resumed}, the precision of the checkpoint this run continues"
    return auto_precision(
        partial(config.new_model, trial_vocab_size(config), sparse_prediction=True), config.batch_size, config.max_seq_length, config.mlm_probability,
        on_gpu=has_accelerator_device(),
    )


def trial_vocab_size(config: PretrainConfig) -> int:
    """The vocabulary size the run's model will have, as far as it is known before the data is built.

    A tokenizer given (`--tokenizer`, or a `--prepared-data` folder's) sets it, unless `--vocab-size`
    overrides it for `--tokenizer`, as `pretrain.setup` does; one trained for the run comes out at
    most the size asked. The trial must time the model that will train: the MLM head's product of
    the predicted positions with the (H, V) output matrix is a large share of a small model's
    step (`tiny` at 32 x 64 on a Zen 4: 32,000 tokens/s in fp32 with 4,096 tokens, 10,000 with
    BERT's 30,522).
    """
    if config.prepared_data:
        prepared.check_options(config.prepared_data, config)  # a missing or mismatched folder is named before any trial
        return len(load_tokenizer(Path(config.prepared_data) / "tokenizer"))
    if config.tokenizer and config.vocab_size is None:
        return len(load_tokenizer(config.tokenizer))
    return config.vocab_size or DEFAULT_VOCAB_SIZE


def has_accelerator_device() -> bool:
    return torch.cuda.is_available() or (hasattr(torch, "accelerator") and torch.accelerator.is_available())


def start_processes(ddp_timeout: float = DEFAULT_DDP_TIMEOUT) -> PartialState:
    """The launch's process group (gloo on a machine without GPUs), each collective waiting at most `ddp_timeout` seconds.

    Call it before anything else asks for a `PartialState`: Accelerate keeps one state per process, so
    the first call starts the processes and fixes the deadline, and every later state (the one
    `settle_mixed_precision` asks for, the Accelerator's) shares it. With more than two processes each
    also beats a heartbeat, by which the survivors of a lost process tell which one it was.
    """
    state = PartialState(cpu=not has_accelerator_device(), timeout=collective_timeout(ddp_timeout))
    start_heartbeat()
    return state


def build_accelerator(config: PretrainConfig) -> Accelerator:
    """An Accelerator for this run; on a machine without GPUs, several processes use gloo on CPU.

    FSDP and DeepSpeed need accelerator devices: on a CPU-only machine a launch that asks for
    them is refused with the DDP command to use instead, never silently turned into DDP.
    Processes that run different software are refused here, on every process (`check_same_versions`);
    the processes' deadline for a collective is `start_processes`'s.
    """
    has_device = has_accelerator_device()
    if config.mixed_precision == "fp16" and not has_device:
        raise ScratchBertError("mixed_precision='fp16' needs a GPU; on CPU use --mixed-precision bf16 (or no).")
    for variable, name in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")):
        if os.environ.get(variable, "false").lower() in ("1", "true", "yes") and not has_device:
            raise ScratchBertError(
                f"{name} shards the model across GPUs, and this machine has none. On CPU, run data-parallel (DDP over "
                "gloo) instead: `accelerate launch --multi_gpu --num_processes 2 -m scratchbert.commands.pretrain ...` (no GPU needed)."
            )
    trackers = _trackers(config.report_to)
    check_same_versions(PartialState(cpu=not has_device))
    return Accelerator(
        # Without an accelerator device, `cpu=True` makes a multi-process launch (even
        # `--multi_gpu`) use gloo DDP on CPU instead of quietly running N copies alone.
        cpu=not has_device,
        mixed_precision=config.mixed_precision,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        log_with=trackers or None,
        project_config=ProjectConfiguration(project_dir=config.output_dir, logging_dir=str(Path(config.output_dir) / "logs")),
        # The training order is masking.EpochPermutation's (seed + epoch), which Accelerate leaves
        # alone; the seedable sampler would stand in for any plain shuffling DataLoader.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=config.seed),
        # We step the scheduler once per optimizer step ourselves; by default Accelerate
        # steps it once per process, for schedules written in single-process steps.
        step_scheduler_with_optimizer=False,
    )


def _trackers(report_to: str) -> list[str]:
    if report_to == "none":
        return []
    if report_to == "auto":
        return ["tensorboard"] if is_tensorboard_available() else []
    return [name.strip() for name in report_to.split(",") if name.strip()]


class LostProcessError(ScratchBertError):
    """Another process of the launch died or stopped answering: this one stopped too, and nothing more was saved."""


def collective_timeout(ddp_timeout: float = DEFAULT_DDP_TIMEOUT) -> timedelta:
    """The deadline of every collective, for `init_process_group(timeout=...)` (`accelerator.start_processes`).

    Passed to the process group directly, not through accelerate's `InitProcessGroupKwargs`, which
    drops a timeout equal to its own default (600 s, NCCL's) and so would leave gloo at 1800 s.
    """
    if isinstance(ddp_timeout, bool) or not isinstance(ddp_timeout, (int, float)) or not 0 < ddp_timeout < float("inf"):
        raise ScratchBertError(f"ddp_timeout={ddp_timeout!r}: it must be a positive number of seconds (e.g. ddp_timeout: 1800 in a --config file).")
    return timedelta(seconds=ddp_timeout)


# ---------------------------------------------------------------------------------------------
# A process that dies or hangs
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def naming_lost_processes(output_dir: str | Path, ddp_timeout: float = DEFAULT_DDP_TIMEOUT):
    """Turn the error a collective raises when another process is gone into a one-line `LostProcessError`.

    Wrap everything of a run that talks to the other processes (setup to the final save). Any other
    exception, and every exception of a single-process run, passes through unchanged.
    """
    try:
        yield
    except RuntimeError as error:
        if not is_lost_process(error):
            raise
        raise lost_process_error(error, output_dir, ddp_timeout) from error


def is_lost_process(error: BaseException) -> bool:
    """Whether `error` is a collective failing because another process closed its connection or passed the deadline."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return False
    text = str(error).lower()
    from_backend = isinstance(error, dist.DistError) or "gloo" in text or "nccl" in text
    return from_backend and any(marker in text for marker in _CLOSED + _TIMED_OUT)


def lost_process_error(error: BaseException, output_dir: str | Path, ddp_timeout: float) -> LostProcessError:
    """The one line for `error`: which process is gone, why this one stopped, what is saved and how to continue.

    Only the lowest-numbered survivor prints it (`every_process` on the others); with more than two
    processes the gone ones are those whose `Heartbeat` stopped.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    missing = [1 - rank] if world == 2 else (silent_processes(_default_store(), world) or [])
    survivors = [other for other in range(world) if other not in missing] if missing else []
    gone = f"{_processes(missing)} of {world}" if missing else f"another of the {world} processes"
    it, is_, its = ("they", "are", "their") if len(missing) > 1 else ("it", "is", "its")
    text = str(error).lower()
    if any(marker in text for marker in _TIMED_OUT) and not any(marker in text for marker in _CLOSED):
        what = (
            f"did not answer within {ddp_timeout:g} s ({TIMEOUT_FLAG}): {it} hang, or {its} machine or the network to "
            f"{'them' if len(missing) > 1 else 'it'} went away (if one process legitimately works alone for longer, e.g. "
            f"the main process preparing a large corpus, raise {TIMEOUT_FLAG})"
        ).replace("it hang,", "it hangs,")
    else:
        what = f"{is_} gone ({it} closed {its} connection: failed, killed, or {its} machine went down; {its} own log says why)"
    return LostProcessError(
        f"{gone} {what}, so process {rank} stopped too; {_resume_advice(output_dir)}",
        every_process=bool(survivors) and rank != min(survivors),
    )


def _resume_advice(output_dir: str | Path) -> str:
    checkpoints = ckpt.list_checkpoints(output_dir)
    if not checkpoints:
        return "no checkpoint was written yet: once every machine is up, run the same launch again on each (with --resume it starts over)."
    return (
        f"nothing was saved after the last complete checkpoint, {checkpoints[-1][1]}: once every machine is up, run "
        "the same launch again on each with --resume to continue from it."
    )


class Heartbeat:
    """This process's counter in the launch's key-value store, advanced every `HEARTBEAT_SECONDS` by a daemon thread.

    With more than two processes a survivor cannot tell from its error which process is gone; the
    counters tell it (`silent_processes`). The thread beats while the process waits in a collective
    (which releases the GIL), so only a dead or stopped process falls silent. It stops with the
    store's host (the first machine) or at exit.
    """

    def __init__(self, store, rank: int, interval: float = HEARTBEAT_SECONDS):
        self.store, self.key, self.interval = store, f"{HEARTBEAT_KEY}{rank}", interval
        self._stopped = threading.Event()
        self.store.add(self.key, 1)
        self._thread = threading.Thread(target=self._beat, name="scratchbert-heartbeat", daemon=True)
        self._thread.start()
        atexit.register(self.stop)  # before the interpreter tears down what the thread uses

    def _beat(self) -> None:
        while not self._stopped.wait(self.interval):
            try:
                self.store.add(self.key, 1)
            except Exception:  # the store is gone: nothing left to tell
                return

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=2 * self.interval)


_heartbeat: Heartbeat | None = None  # one per process, as the process group


def start_heartbeat() -> Heartbeat | None:
    """This process's `Heartbeat`, started once, when the launch has more than two processes (with two, the one gone is the other)."""
    global _heartbeat
    store = _default_store()
    if _heartbeat is None and store is not None and dist.is_initialized() and dist.get_world_size() > 2:
        try:
            _heartbeat = Heartbeat(store, dist.get_rank())
        except Exception:  # no store to beat in: a lost process is then named less precisely
            return None
    return _heartbeat


def silent_processes(store, world: int, wait_seconds: float = HEARTBEAT_SECONDS * SILENCE_BEATS) -> list[int] | None:
    """The processes whose heartbeat did not advance in `wait_seconds`; None when the store cannot be read."""
    if store is None:
        return None
    try:
        store.set_timeout(timedelta(seconds=wait_seconds))  # the run is ending: an unreachable store must not hold it
        before = [store.add(f"{HEARTBEAT_KEY}{rank}", 0) for rank in range(world)]  # add 0: read without waiting
        time.sleep(wait_seconds)
        after = [store.add(f"{HEARTBEAT_KEY}{rank}", 0) for rank in range(world)]
    except Exception:
        return None
    return [rank for rank in range(world) if after[rank] == before[rank]]


def _default_store():
    """The default process group's key-value store (torch keeps it private; None where it cannot be had)."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None


def _processes(ranks: list[int]) -> str:
    return f"process {ranks[0]}" if len(ranks) == 1 else "processes " + ", ".join(map(str, ranks))


# ---------------------------------------------------------------------------------------------
# An output folder the machines do not share
# ---------------------------------------------------------------------------------------------
def check_shared_output_dir(state, output_dir: str | Path, wait_seconds: float = SHARED_FOLDER_WAIT) -> None:
    """Refuse, on every process, an --output-dir that the machines do not share; call on every process.

    state: the run's Accelerator (or PartialState). The main process writes a file of random name and
    content in the folder or, before it exists, in its nearest folder that does (where the run will
    make it, and where the tokenizer of a run is handed to the other processes), and deletes it once
    every process has looked for it at the same place under its own --output-dir (a network file
    system may show it late: each looks for `wait_seconds`). A folder only another machine has is
    refused too. A path the main process cannot write is left to the run's own errors.
    """
    if state.num_processes == 1:
        return
    folder = Path(output_dir).absolute()
    written = [_write_token(folder) if state.is_main_process else None]
    dist.broadcast_object_list(written, src=0)  # after the write: every process may look now
    levels, token = written[0] or (0, None)
    place = folder.parents[levels - 1] if levels else folder
    sees = token is None or _sees(place / token, token, wait_seconds)
    agrees = sees and (levels == 0 or not folder.is_dir())  # no folder of its own where the main process has none
    reports = [None] * state.num_processes
    dist.all_gather_object(reports, (state.process_index, socket.gethostname(), str(place), sees, agrees))
    if token is not None and state.is_main_process:
        (place / token).unlink(missing_ok=True)
    dist.barrier()  # the folder is as it was when any process goes on
    blind = [report for report in reports if not report[4]]
    if blind:
        raise ScratchBertError(_unshared_message(folder, reports[0], blind), every_process=True)


def _write_token(folder: Path) -> tuple[int, str] | None:
    """Write the check's file in `folder` or its nearest existing parent: (levels up, its name); None if it cannot."""
    place, levels = folder, 0
    while not place.is_dir() and place != place.parent:
        place, levels = place.parent, levels + 1
    token = f"{SHARED_CHECK_PREFIX}{secrets.token_hex(8)}"
    try:
        (place / token).write_text(token, encoding="utf-8")
    except OSError:
        return None
    return levels, token


def _sees(path: Path, content: str, wait_seconds: float) -> bool:
    """Whether `path` holds `content`, looking again for `wait_seconds` (a network file system's cache may lag)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            if path.read_text(encoding="utf-8") == content:
                return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def _unshared_message(folder: Path, main: tuple, blind: list[tuple]) -> str:
    """The refusal: which process sees what, and the fix."""
    problems = []
    for rank, host, place, sees, _ in blind:
        if sees:
            problems.append(f"process {rank} on {host} already has a folder {folder} where process 0 has none")
        else:
            problems.append(f"process {rank} on {host} does not see in {place} the file process 0 (on {main[1]}) just wrote in {main[2]}")
    return (
        f"--output-dir {folder} is not shared between the machines: {'; '.join(problems)}. Every process writes its "
        "random state into each checkpoint and reads it back on --resume, and the main process writes the rest, so "
        "every machine must see the same folder: put --output-dir on a file system that every machine mounts (NFS, "
        "Lustre, ...; the path may differ between machines), and remove a machine's own copy."
    )


# ---------------------------------------------------------------------------------------------
# Different software on different machines
# ---------------------------------------------------------------------------------------------
def installed_versions() -> dict[str, str]:
    """This process's versions of scratchbert (and a digest of its source files), torch, transformers and accelerate."""
    versions = {"scratchbert": f"{scratchbert.__version__} (source {source_digest()})"}
    for package in PACKAGES:
        try:
            versions[package] = torch.__version__ if package == "torch" else metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def source_digest() -> str:
    """12 hex digits of a hash of the package's Python files: two checkouts with one version number differ here."""
    root = Path(scratchbert.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def check_same_versions(state, versions: dict[str, str] | None = None) -> None:
    """Refuse, on every process, a launch whose processes run different versions; call on every process.

    versions: this process's (default `installed_versions()`).
    """
    if state.num_processes == 1:
        return
    reports = [None] * state.num_processes
    dist.all_gather_object(reports, (socket.gethostname(), versions or installed_versions()))
    differences = version_differences(reports)
    if differences:
        raise ScratchBertError(
            f"the processes of this launch run different software: {differences}. Install the same versions on every "
            "machine (the same scratchbert checkout or `pip install` line, and the same torch, transformers and "
            "accelerate), then launch again.",
            every_process=True,
        )


def version_differences(reports: list[tuple[str, dict[str, str]]]) -> str:
    """'' when every process has the same versions; else, per package that differs, which process has which.

    reports: (host, versions) of each process, in process order.
    """
    parts = []
    for package in reports[0][1]:
        holders: dict[str, list[int]] = {}
        for rank, (_, versions) in enumerate(reports):
            holders.setdefault(versions.get(package, "not installed"), []).append(rank)
        if len(holders) > 1:
            parts.append(f"{package} " + ", ".join(f"{version} on {_on(ranks, reports)}" for version, ranks in holders.items()))
    return "; ".join(parts)


def _on(ranks: list[int], reports: list[tuple[str, dict]]) -> str:
    """'processes 0, 2 (host-a)': one line whatever the number of processes (a few names, then a count)."""
    hosts = sorted({reports[rank][0] for rank in ranks})
    shown = ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    return f"{'process' if len(ranks) == 1 else 'processes'} {shown} ({', '.join(hosts[:4])}{', ...' if len(hosts) > 4 else ''})"


@contextlib.contextmanager
def guarded_run(config: PretrainConfig):
    """Every guarantee of a pretraining run, entered once around it; yields (config, accelerator, lock).

    - one run per output folder at a time (`run_setup.OutputDirLock`, claimed here if the folder exists);
    - a process that is lost (killed, hung) named in one line with the last checkpoint (`naming_lost_processes`);
    - the process group started with its deadline, processes running other software refused (`build_accelerator`),
      an output folder the machines do not share refused before anything is written (`check_shared_output_dir`);
    - `--mixed-precision auto` settled to one precision for every process (`precision.settle_mixed_precision`);
    - the CPU kernels each matrix product runs on kept in the folder, so --resume multiplies on the same ones;
    - `--no-progress-bar` silencing datasets' and transformers' bars too (`progress_bars`; with bars, one machine's process draws them).
    The config yielded is the run's, with its precision settled.
    """
    with naming_lost_processes(config.output_dir, config.ddp_timeout):
        processes = start_processes(config.ddp_timeout)  # first: the process group's deadline is fixed by whoever starts it
        with OutputDirLock(config.output_dir, "scratchbert pretrain") as lock:
            lock.claim(processes)  # held from now on if the folder exists; else once the run makes it
            kernels = cpu_gemm.decisions_kept_in(Path(config.output_dir) / ckpt.KERNEL_DECISIONS_FILE)
            with progress_bars(config.progress_bar and processes.is_local_main_process), kernels:  # bars: one process per machine
                config = settle_mixed_precision(config)
                accelerator = build_accelerator(config)  # refuses processes that run other software
                check_shared_output_dir(accelerator, config.output_dir)  # before anything is written next to it
                yield config, accelerator, lock
