"""Pretrain BERT from scratch: masked-language modelling, with next-sentence prediction in the paper's recipe.

One loop, the same on a laptop core or a cluster, written with Hugging Face Accelerate:

    scratchbert pretrain                                      # one process; no arguments: the demo
    accelerate launch -m scratchbert.commands.pretrain ...   # as many processes as `accelerate config` says
    accelerate launch scripts/pretrain.py ...                 # the same, through the thin script

`pretrain(config)` reads as a training script does, one function per stage:

  0. the guarantees  `processes.guarded_run`, entered once around the whole run: one run per output
                     folder, processes that run the same software and share the folder, a lost process
                     named in one line, `--mixed-precision auto` settled, the CPU kernels' timings kept.
  1. `setup`         data (`corpus.py`: documents -> tokenizer -> examples, `examples.py`); the model
                     (`PretrainConfig.new_model`: the MLM head alone, or with NSP in the paper's recipe);
                     the batches (loaders that mask, `masking.py`); AdamW and the schedule, over steps or
                     the `--time-budget` (`optimization.py`): all built and checked *before* the output
                     folder is written (`checkpoint.py`), so a bad input never damages a finished run;
                     with `--resume`, the latest checkpoint's weights, optimizer, schedule, RNG states and place.
  2. `train`         the step loop, each block named where it runs: batch -> forward -> loss over the
                     global counts (`optimization.py`) -> backward -> optimizer step -> log (`RunLog`, the
                     JSONL records) -> evaluate (`evaluation.py`, at 15% masking whatever the training
                     rate) -> checkpoint.
  3. `finish`        the final evaluation, `save_pretrained` of model and tokenizer (loadable with the Auto
                     classes and `pipeline("fill-mask")`), a PNG of the curves, an orderly shutdown.

docs/walkthrough.md follows one step of this loop by hand.

Exact resumption needs every random draw to be reproducible from the checkpoint:
  - data order: `masking.EpochPermutation` (seed + epoch) and Accelerate's `skip_first_batches`;
  - dropout: torch's global RNG, saved per process by `save_state`, and used by nothing
    else (the DataLoaders get generators of their own);
  - MLM masks: drawn by the collator from a generator seeded by (seed, epoch, example
    indices) — not from the global stream, because the DataLoader prepares the next batch
    before the current step runs, which would interleave mask and dropout draws
    differently in a resumed run (`masking.SeededCollator`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from scratchbert.errors import NonFiniteLossError, ScratchBertError
from scratchbert.inspection import fill_mask, load_masked_lm
from scratchbert.training.pretraining import checkpoint as ckpt
from scratchbert.training.pretraining import optimization, processes, sharding
from scratchbert.training.pretraining.checkpoint import (
    CURVES_FILE,
    LOG_FILE,
    check_output_dir,
    prepare_output_dir,
    save_final_model,
)
from scratchbert.training.pretraining.config import PretrainConfig, check_vocabulary
from scratchbert.training.pretraining.corpus import build_data
from scratchbert.training.pretraining.evaluation import evaluate, held_out_passages, plateau_report, plot_training_curves, read_log, weight_checksum
from scratchbert.training.pretraining.masking import SeededCollator, make_dataloaders, make_long_loader
from scratchbert.training.pretraining.optimization import TimeBudgetSchedule, adamw, make_scheduler, parameter_groups
from scratchbert.training.pretraining.precision import warn_if_fp32_is_faster
from scratchbert.training.pretraining.prepared import load_prepared
from scratchbert.training.run_setup import OutputDirLock

# Shown after the demo run (no --train-files / --dataset): sentences in the style of the
# Python documentation the embedded corpus comes from, not copied from it. That text quotes
# keywords ('the "break" statement', as pydoc renders reST's ``break``), so these do too:
# without the quotes the model rightly expects a quote mark after "the".
DEMO_SENTENCES = (
    'the "[MASK]" statement is used to leave a loop early.',
    'the "[MASK]" statement imports a module.',
    'the "[MASK]" clause of a loop runs when the loop ends normally.',
    "this method returns a new [MASK] object.",
)


# ---------------------------------------------------------------------------------------------
# 2. The run: setup (data, model, optimizer, resume) -> the step loop -> the saved model
# ---------------------------------------------------------------------------------------------
@dataclass
class Position:
    """Where a run is: what a checkpoint records besides the weights and RNG states."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0
    batches_in_epoch: int = 0  # batches of this epoch already used (skipped on resume)
    tokens_seen: int = 0
    training_seconds: float = 0.0  # the clock a --time-budget runs on
    phase: int = 0  # 1 once the --long-phase has begun (epoch and batches_in_epoch then count its examples)


class TrainingClock:
    """Seconds spent training, carried over when a run is resumed.

    Evaluation and checkpoint writing are left out (`pause` / `start` around them), so a
    budget buys the same amount of training whatever the bookkeeping costs. `timer` is
    injectable so tests can run a budget on a clock of their own.
    """

    def __init__(self, elapsed: float = 0.0, timer=time.perf_counter):
        self.timer = timer
        self._elapsed = elapsed
        self._since: float | None = None

    def start(self) -> None:
        if self._since is None:
            self._since = self.timer()

    def pause(self) -> None:
        if self._since is not None:
            self._elapsed += self.timer() - self._since
            self._since = None

    @contextlib.contextmanager
    def paused(self, window: dict):
        """The clock stopped for the block (evaluation, a checkpoint); the throughput `window` restarts after it."""
        self.pause()
        try:
            yield
        finally:
            self.start()
            window["start"] = time.perf_counter()  # throughput counts training time only

    def seconds(self) -> float:
        return self._elapsed + (self.timer() - self._since if self._since is not None else 0.0)


def long_phase_first_step(config: PretrainConfig) -> int:
    """--long-phase without a time budget: the step the phase begins on (its last `long_phase` of `max_steps`)."""
    return round((1.0 - config.long_phase) * config.max_steps)


@dataclass
class Run:
    """What `setup` builds and the later steps use: one object instead of twenty locals."""

    config: PretrainConfig
    accelerator: Accelerator
    tokenizer: object
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train_loader: DataLoader
    eval_loader: DataLoader
    train_collate: SeededCollator
    train_examples: int | None  # None for a stream, whose length is not known in advance
    eval_dataset: object  # the held-out examples (token ids)
    vocab_size: int
    budget_schedule: TimeBudgetSchedule | None = None
    global_batch: int = 0  # G: the examples of one optimizer step, over every process and micro-batch
    position: Position = field(default_factory=Position)
    last_saved: str | None = None  # the newest checkpoint, named in error messages
    setup_seconds: float = 0.0  # from the call to the training loop: reading and preparing the data, mostly
    long_loader: DataLoader | None = None  # --long-phase: its examples and masks
    long_collate: SeededCollator | None = None
    eval_metrics: dict = field(default_factory=dict)

    @property
    def output_dir(self) -> Path:
        return Path(self.config.output_dir)

    def out_of_time(self) -> bool:
        return self.config.time_budget is not None and self.position.training_seconds >= 60.0 * self.config.time_budget

    def long_phase_due(self) -> bool:
        """--long-phase: whether the run has reached its last `long_phase` of steps (or of the time budget)."""
        fraction = self.config.long_phase
        if not fraction or self.position.phase:
            return False
        if self.config.time_budget is not None:
            return self.position.training_seconds >= (1.0 - fraction) * 60.0 * self.config.time_budget
        return self.position.step >= long_phase_first_step(self.config)

    def batches(self) -> tuple[DataLoader, SeededCollator]:
        """The loader and collator of the phase the run is in."""
        return (self.long_loader, self.long_collate) if self.position.phase else (self.train_loader, self.train_collate)

    def done(self) -> bool:
        return (self.config.max_steps is not None and self.position.step >= self.config.max_steps) or self.out_of_time()


@dataclass
class PretrainResult:
    output_dir: Path
    steps: int
    eval_metrics: dict
    seconds: float
    masked_lm_dir: Path  # the saved masked-language model: output_dir
    held_out_passages: list[tuple[str, str]]  # held-out text with a word hidden, and the word (`held_out_passages`)


def setup(config: PretrainConfig, accelerator: Accelerator, lock: OutputDirLock, asked_precision: str | None) -> Run:
    """Data, model, batches, optimizer, accelerator, resume: everything the step loop needs.

    The inputs are checked before the output folder is touched (a bad corpus never damages a
    finished run): the folder is written only once the data, the model and its batches are built.
    """
    resume_state = check_output_dir(config)  # None for a fresh start, else the checkpoint to resume
    set_seed(config.seed)  # weights and dropout; the data order and masks have seeds of their own

    # Data: documents -> tokenizer -> examples, packed text or NSP pairs (corpus.py).
    if config.prepared_data:  # built ahead by `scratchbert prepare-data`: prepared.py
        tokenizer, train_dataset, eval_dataset = load_prepared(config.prepared_data, config)
        long_dataset = None  # --long-phase is refused with prepared data (config.validate)
    else:
        tokenizer, train_dataset, eval_dataset, long_dataset = build_data(config, accelerator, resuming=resume_state is not None)

    # Model: freshly initialised, the MLM head alone or with NSP (`PretrainConfig.new_model`).
    # Its vocabulary: the checkpoint's when resuming, --vocab-size when given with --tokenizer, else the
    # tokenizer's own size (a trained one may come out smaller than asked).
    if resume_state is not None:
        vocab_size = resume_state["model_vocab_size"]
    else:
        vocab_size = config.vocab_size if config.tokenizer and config.vocab_size is not None else len(tokenizer)
    check_vocabulary(tokenizer, vocab_size)
    # sparse_prediction: the MLM head scores only the masked positions (the loss reads nothing else), for speed.
    new_model = partial(config.new_model, vocab_size, tokenizer.pad_token_id, sparse_prediction=True)
    model = new_model()
    if accelerator.is_fsdp2:  # one shard unit per layer, the tied MLM head with the embeddings (sharding.py)
        model = sharding.shard(model, accelerator)
    if asked_precision == "bf16" and accelerator.device.type == "cpu" and accelerator.is_main_process and resume_state is None:
        # bf16 is not faster on every CPU that has bf16 instructions: a few timed steps say (precision.py)
        warn_if_fp32_is_faster(new_model, config.batch_size, config.max_seq_length, config.mlm_probability)

    # Batches: loaders that hand out each epoch's examples, masked as they are drawn (masking.py).
    train_loader, eval_loader, train_collate = make_dataloaders(config, tokenizer, train_dataset, eval_dataset, accelerator)
    long_loader, long_collate = (None, None) if long_dataset is None else make_long_loader(config, tokenizer, long_dataset, accelerator.num_processes)

    # Optimizer and schedule: AdamW, warmup then linear decay over steps or the time budget (optimization.py).
    groups = parameter_groups(model, config.weight_decay)
    betas = (config.adam_beta1, config.adam_beta2)
    optimizer = adamw(groups, accelerator.device, lr=config.learning_rate, betas=betas, eps=config.adam_epsilon)
    scheduler, budget_schedule = make_scheduler(optimizer, config.max_steps, config.warmup_ratio, config.time_budget)
    global_batch = optimization.examples_per_step(config.batch_size, config.gradient_accumulation_steps, accelerator.num_processes)

    # Everything is known to be good: only now is the folder cleared (--overwrite) and written.
    prepare_output_dir(config, accelerator, tokenizer, fresh_start=resume_state is None, lock=lock)

    # Onto the device (wrapped for several processes): model, optimizer, loaders, schedule.
    if config.streaming:  # a stream is split by streaming.py and put on the device by its StreamLoader
        model, optimizer, eval_loader, scheduler = accelerator.prepare(model, optimizer, eval_loader, scheduler)
    else:
        model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(model, optimizer, train_loader, eval_loader, scheduler)
    long_loader = accelerator.prepare(long_loader) if long_loader is not None else None
    run = Run(
        config, accelerator, tokenizer, model, optimizer, scheduler, train_loader, eval_loader, train_collate,
        None if config.streaming else len(train_dataset), eval_dataset, vocab_size, budget_schedule, global_batch,
        long_loader=long_loader, long_collate=long_collate,
    )  # fmt: skip
    # Resume: the latest checkpoint's weights, optimizer, schedule, RNG states and place in the data.
    if resume_state is None:
        if config.resume:
            accelerator.print(f"--resume: no checkpoint in {run.output_dir} yet, so training starts at step 0")
        return run
    check_same_global_batch(config, accelerator, resume_state)
    ckpt.load_checkpoint(accelerator, resume_state["path"])
    run.position = Position(**{name: resume_state[name] for name in Position.__dataclass_fields__ if name in resume_state})
    run.last_saved = resume_state["path"]
    # A process's place in the epoch is counted in its own micro-batches: N * B examples each.
    saved_batch = resume_state["config"]["batch_size"] * resume_state.get("num_processes", accelerator.num_processes)
    run.position.batches_in_epoch = run.position.batches_in_epoch * saved_batch // (config.batch_size * accelerator.num_processes)
    if config.streaming:  # the stream's place, the same in every process (streaming.py)
        run.train_loader.load_state_dict(resume_state["stream"])
        run.position.epoch = resume_state["stream"]["epoch"]
    accelerator.print(f"resuming from {resume_state['path']} (step {run.position.step}, epoch {run.position.epoch})")
    return run


def train(run: Run, timer=time.perf_counter) -> RunLog:
    """The step loop: batch -> forward -> loss over the global counts -> backward -> optimizer step
    -> log -> evaluate -> checkpoint, until max_steps or the time budget. Returns the run's log."""
    config, accelerator, position, model = run.config, run.accelerator, run.position, run.model
    log = RunLog(accelerator, run.output_dir / LOG_FILE, position.step if run.last_saved else None)
    progress = progress_bar(config, accelerator, position.step, position.training_seconds)
    _announce(run, log)
    clock = TrainingClock(position.training_seconds, timer)  # evaluation and checkpoints stop it: a budget buys training
    window = {"loss": torch.zeros((), device=accelerator.device), "steps": 0, "tokens": 0, "start": time.perf_counter(),
              "finite": torch.ones((), dtype=torch.bool, device=accelerator.device)}  # fmt: skip
    model.train()
    clock.start()
    try:
        while not run.done():
            batches_before = position.batches_in_epoch
            # Batch: this process's micro-batches of one global batch (optimization.py), masked for this epoch.
            for micro_batches in optimization.optimizer_steps(_epoch_batches(run), config.gradient_accumulation_steps):
                # Forward and backward: each micro-batch's summed loss divided by the whole step's counts.
                counts = optimization.GlobalCounts.of(accelerator, micro_batches)
                scale = optimization.backward_scale(accelerator)
                for number, batch in enumerate(micro_batches):
                    last = number == len(micro_batches) - 1
                    # Gradients are exchanged once, after the last micro-batch, as Trainer does (optimization.py).
                    accelerator.gradient_state._set_sync_gradients(last)
                    exchange = contextlib.nullcontext() if last or accelerator.distributed_type == DistributedType.DEEPSPEED else accelerator.no_sync(model)
                    with exchange:
                        loss = model(**batch, **counts.loss_kwargs()).loss  # this micro-batch's share of the step's loss
                        window["finite"] &= torch.isfinite(loss.detach()).all()  # on the device: no sync per micro-batch
                        if last:  # a NaN/inf loss stops the run before it reaches the weights, on every process
                            _stop_if_not_finite(accelerator, window, loss, position.step, run.last_saved, config)
                        accelerator.backward(loss * scale)
                    window["loss"] += loss.detach().float()
                    window["tokens"] += batch["attention_mask"].sum()  # a tensor: no device sync per step
                # Optimizer step: clip, AdamW, then the schedule.
                if config.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                run.optimizer.step()
                run.optimizer.zero_grad()
                window["steps"] += 1
                position.batches_in_epoch += len(micro_batches)
                before = position.training_seconds
                position.training_seconds = _synchronized_seconds(accelerator, clock) if config.time_budget is not None else clock.seconds()
                if run.budget_schedule is not None:
                    run.budget_schedule.elapsed = position.training_seconds
                run.scheduler.step()
                position.step += 1
                progress.update(position.training_seconds - before if config.time_budget is not None else 1)
                # Log, evaluate, checkpoint: each on its schedule (`RunLog` below, evaluation.py, checkpoint.py).
                if position.step % config.log_every == 0 or run.done():
                    _log_training(run, log, window, progress)
                if config.eval_every and position.step % config.eval_every == 0 and not run.done():
                    with clock.paused(window):
                        run.eval_metrics = evaluate(model, run.eval_loader, accelerator, run.tokenizer.mask_token_id)
                        log.write({"type": "eval", "step": position.step, "training_seconds": position.training_seconds, **run.eval_metrics})
                if config.save_every and position.step % config.save_every == 0:
                    with clock.paused(window):
                        run.last_saved = str(ckpt.save_checkpoint(accelerator, run.output_dir, position.step, _trainer_state(run), config.keep_last))
                if run.done() or run.long_phase_due():
                    break
            else:  # the epoch ran out before the run did: start the next one
                if position.batches_in_epoch == batches_before == 0:
                    raise ScratchBertError(
                        "a whole epoch gave no optimizer step: the stream holds fewer examples than one step's "
                        f"{optimization.describe(config.batch_size, config.gradient_accumulation_steps, accelerator.num_processes)}. "
                        "Add text, or lower --batch-size."
                    )
                position.epoch += 1
                position.batches_in_epoch = 0
    except KeyboardInterrupt:
        progress.close()
        # From the folder, not `run.last_saved`: a checkpoint renamed into place is whole even when the
        # signal came before `save_checkpoint` returned.
        saved = ckpt.list_checkpoints(run.output_dir)
        last = str(saved[-1][1]) if saved else run.last_saved
        where = f"the last checkpoint is {last}; `--resume` continues from it" if last else "no checkpoint was written yet"
        accelerator.print(f"interrupted at step {position.step}: {where}.")
        raise
    clock.pause()
    progress.close()
    if run.out_of_time():
        accelerator.print(f"the time budget of {config.time_budget:g} minutes is spent after {position.step} steps")
    return log


def _log_training(run: Run, log: RunLog, window: dict, progress) -> None:
    """The training record of the steps since the last one: loss, learning rate, throughput."""
    config, position = run.config, run.position
    record = train_record(run.accelerator, window, position.step, position.epoch, run.scheduler)
    position.tokens_seen += record.pop("tokens")
    record.update(tokens_seen=position.tokens_seen, training_seconds=position.training_seconds)
    if config.long_phase:
        record["seq_length"] = (config.long_seq_length or config.max_position_embeddings) if position.phase else config.max_seq_length
    log.write(record)
    progress.set_postfix(step=position.step, loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_second']:.0f}")


# ---------------------------------------------------------------------------------------------
# The log: a JSONL record per logging window and evaluation (and Accelerate's trackers), the progress bar
# ---------------------------------------------------------------------------------------------
class RunLog:
    """The always-on JSONL log (main process) plus Accelerate's trackers."""

    def __init__(self, accelerator: Accelerator, path: Path, resume_step: int | None):
        self.accelerator = accelerator
        self.path = path
        if accelerator.is_main_process:
            path.parent.mkdir(parents=True, exist_ok=True)
            if resume_step is None:
                path.write_text("", encoding="utf-8")
            elif path.exists():  # drop what the interrupted run logged after its last checkpoint
                kept = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
                kept = [line for line in kept if json.loads(line).get("step", 0) <= resume_step]
                partial = path.with_name(f".{path.name}.partial")  # written whole, then renamed: a full disk keeps the old log
                partial.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
                os.replace(partial, path)

    def write(self, record: dict) -> None:
        if not self.accelerator.is_main_process:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        numbers = {f"{record['type']}/{k}": v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        self.accelerator.log(numbers, step=record.get("step"))


class BudgetBar(tqdm):
    """Seconds of training out of a time budget. The last step ends past the budget, and tqdm drops a
    total that `n` has passed (its bar format would then fail on total=None): this bar stops at its total."""

    def update(self, n: float = 1) -> bool | None:
        return super().update(max(0.0, min(n, self.total - self.n)))


def progress_bar(config: PretrainConfig, accelerator: Accelerator, step: int, training_seconds: float):
    """Steps out of max_steps; with a time budget, seconds of training out of the budget."""
    disable = not (accelerator.is_local_main_process and config.progress_bar)
    if config.time_budget is None:
        return tqdm(total=config.max_steps, initial=step, desc="pretrain", unit="step", disable=disable, dynamic_ncols=True)
    budget = 60.0 * config.time_budget
    return BudgetBar(
        total=budget, initial=min(training_seconds, budget), desc="pretrain", unit="s", disable=disable, dynamic_ncols=True,
        bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}s [{elapsed}<{remaining}{postfix}]",
    )  # fmt: skip


def train_record(accelerator: Accelerator, window: dict, step: int, epoch: int, scheduler) -> dict:
    """Mean training loss per optimizer step over the logging window, and throughput.

    Each process holds its share of every step's loss (`optimization.py`): their sum is the step's.
    """
    mean_loss = accelerator.reduce(window["loss"], reduction="sum").item() / max(window["steps"], 1)
    local_tokens = torch.as_tensor(window["tokens"], device=accelerator.device)
    tokens = int(accelerator.reduce(local_tokens, reduction="sum").item())
    seconds = time.perf_counter() - window["start"]
    window.update(loss=torch.zeros_like(window["loss"]), steps=0, tokens=0, start=time.perf_counter())
    return {
        "type": "train", "step": step, "epoch": epoch, "loss": mean_loss,
        "learning_rate": scheduler.get_last_lr()[0], "tokens": tokens, "tokens_per_second": tokens / max(seconds, 1e-9),
    }  # fmt: skip


def _trainer_state(run: Run) -> dict:
    """What a checkpoint records besides the weights, optimizer, schedule and RNG states (`Position`, the stream's place)."""
    state = {**asdict(run.position), "num_processes": run.accelerator.num_processes, "model_vocab_size": run.vocab_size,
             "config": run.config.to_saved_dict()}  # fmt: skip
    if run.config.streaming:  # the stream's place, the same in every process
        state["stream"] = run.train_loader.state_dict()
    return state


def pretrain(config: PretrainConfig, timer=time.perf_counter) -> PretrainResult:
    """Run (or resume) pretraining as `config` says: setup, the step loop, then the saved model.

    Every guarantee of a run is entered once, around it (`processes.guarded_run`): one run per
    output folder (the lock), processes that run the same software and share the folder, a lost
    process named in one line, the CPU kernels' timings kept for --resume. `timer` is the clock a
    `--time-budget` is measured on (tests pass one of their own).
    """
    started, cpu_started = time.perf_counter(), time.process_time()
    asked_precision = config.mixed_precision  # before --mixed-precision auto is settled
    with processes.guarded_run(config) as (config, accelerator, lock):
        run = setup(config, accelerator, lock, asked_precision)
        run.setup_seconds = time.perf_counter() - started
        log = train(run, timer)
        return finish(run, log, started, cpu_started)


def check_same_global_batch(config: PretrainConfig, accelerator: Accelerator, resume_state: dict) -> None:
    """A run resumes on any number of processes, as long as its optimizer steps keep their examples.

    The checkpoint's run took steps of N * B * k examples; this one must too, or the examples
    of the steps to come (and what the schedule and the optimizer state were tuned on) change.
    """
    saved = resume_state["config"]
    saved_processes = resume_state.get("num_processes", 1)
    before = optimization.examples_per_step(saved["batch_size"], saved.get("gradient_accumulation_steps", 1), saved_processes)
    now = optimization.examples_per_step(config.batch_size, config.gradient_accumulation_steps, accelerator.num_processes)
    if config.streaming and "stream" not in resume_state:
        raise ScratchBertError(
            f"{resume_state['path']} was written by an older scratchbert, whose streamed processes each read their own documents; "
            "it cannot continue the same examples. Start a fresh run (or resume with the scratchbert that wrote it)."
        )
    if before != now:
        raise ScratchBertError(
            f"{resume_state['path']} trained on steps of "
            f"{optimization.describe(saved['batch_size'], saved.get('gradient_accumulation_steps', 1), saved_processes)}; "
            f"this run's would be {optimization.describe(config.batch_size, config.gradient_accumulation_steps, accelerator.num_processes)}. "
            f"Choose --batch-size and --gradient-accumulation-steps so that processes x batch x accumulation = {before}."
        )


def _epoch_batches(run: Run):
    """The batches left in the epoch the run is in (of its phase, which may begin now), masked for that epoch."""
    config, accelerator, position = run.config, run.accelerator, run.position
    if run.long_phase_due():  # the last stretch of the run: longer examples, from their first epoch
        position.phase, position.epoch, position.batches_in_epoch = 1, 0, 0
        accelerator.print(f"step {position.step}: the long phase begins (examples of {config.long_seq_length or config.max_position_embeddings} tokens)")
    epoch_loader, collate = run.batches()
    collate.epoch = position.epoch
    epoch_loader.set_epoch(position.epoch)
    if position.batches_in_epoch and not config.streaming:  # a stream resumes itself (`setup` loads its place)
        return accelerator.skip_first_batches(epoch_loader, position.batches_in_epoch)
    return epoch_loader


def finish(run: Run, log: RunLog, started: float, cpu_started: float) -> PretrainResult:
    """Step 4: the final evaluation, the saved model and tokenizer, the curves, an orderly shutdown."""
    accelerator, position, output_dir = run.accelerator, run.position, run.output_dir
    run.eval_metrics = evaluate(run.model, run.eval_loader, accelerator, run.tokenizer.mask_token_id)
    log.write({"type": "eval", "step": position.step, "training_seconds": position.training_seconds, **run.eval_metrics})
    checksums = accelerator.gather(torch.tensor([weight_checksum(run.model)], dtype=torch.float64, device=accelerator.device))
    save_final_model(accelerator, run.model, run.tokenizer, output_dir, run.config.finetune_dropout)
    seconds = time.perf_counter() - started
    plateau = plateau_report(run.eval_metrics)
    log.write(
        {
            "type": "final", **asdict(position), "seconds": seconds, "cpu_seconds": time.process_time() - cpu_started,
            "weight_checksums": checksums.tolist(), **run.eval_metrics, "plateau_warning": plateau,
        }
    )  # fmt: skip
    if accelerator.is_main_process:
        plot_training_curves(read_log(output_dir / LOG_FILE), output_dir / CURVES_FILE, title=f"{run.config.preset} BERT")
    metrics = run.eval_metrics
    nsp = f", NSP accuracy {metrics['nsp_accuracy']:.3f}" if "nsp_accuracy" in metrics else ""
    accelerator.print(
        f"done in {seconds:.0f}s ({position.training_seconds:.0f}s of training): held-out MLM accuracy "
        f"{metrics['mlm_accuracy']:.3f} (perplexity {metrics['perplexity']:.1f}; guessing from word frequencies alone "
        f"{metrics['context_free_accuracy']:.3f}){nsp}; model and tokenizer saved in {output_dir}"
    )
    if plateau is not None:
        accelerator.print(f"warning: {plateau}")
    shut_down(run)
    passages = held_out_passages(run.eval_dataset, run.tokenizer, seed=run.config.seed)
    return PretrainResult(output_dir, position.step, metrics, seconds, output_dir, passages)


def shut_down(run: Run) -> None:
    """Release the processes in an order that cannot hang.

    A DistributedDataParallel model owns a gloo "reducer" whose threads wait on the process
    group. Destroying the group while the reducer is alive (it would die later, at
    interpreter exit) left a rank blocked in the reducer's destructor. So: drop every
    reference to the wrapped model and optimizer first, collect them, wait for all ranks,
    and only then end training, which closes the trackers and destroys the process group.
    """
    accelerator = run.accelerator
    run.model = run.optimizer = run.scheduler = run.train_loader = run.eval_loader = None
    accelerator.free_memory()  # Accelerate's own references to what it prepared
    gc.collect()
    accelerator.wait_for_everyone()
    accelerator.end_training()


def _announce(run: Run, log: RunLog) -> None:
    """The run's first log record and the one line a user reads before the progress bar."""
    config, accelerator = run.config, run.accelerator
    parameters = sum(map(torch.numel, run.model.parameters()))
    tracked = asdict(config)
    for name, value in tracked.items():  # trackers take numbers and text: a list of files as its text
        if isinstance(value, list):
            tracked[name] = str(value)
    accelerator.init_trackers("pretrain", config=tracked)
    log.write(
        {
            "type": "start", "step": run.position.step, "num_processes": accelerator.num_processes, "device": str(accelerator.device),
            "train_examples": run.train_examples, "eval_examples": len(run.eval_dataset),
            "parameters": parameters, "vocab_size": len(run.tokenizer), "setup_seconds": run.setup_seconds,
        }
    )  # fmt: skip
    examples = "a stream of examples" if run.train_examples is None else f"{run.train_examples} examples"
    if config.time_budget is None:
        length = f"{config.max_steps} steps"
    else:
        length = f"{config.time_budget:g} minutes" + (f" (at most {config.max_steps} steps)" if config.max_steps else "")
    long_phase = ""
    if config.long_phase:
        long_phase = f"; the last {config.long_phase:.0%} on examples of {config.long_seq_length or config.max_position_embeddings} tokens"
    objective = "MLM + NSP" if config.nsp else "MLM"
    accelerator.print(
        f"pretraining a {config.preset} BERT (L={config.num_hidden_layers}, H={config.hidden_size}, "
        f"{parameters / 1e6:.1f}M parameters, vocabulary {len(run.tokenizer)}) with the "
        f"{config.recipe} recipe ({objective} on {config.packing}, "
        f"{config.mlm_probability:.0%} masking, learning rate {config.learning_rate:g}) on {examples} "
        f"({len(run.eval_dataset)} held out), {accelerator.num_processes} process(es), {length} of {run.global_batch} examples{long_phase}"
    )


def _synchronized_seconds(accelerator: Accelerator, clock: TrainingClock) -> float:
    """The training time of the slowest process: every process then agrees on the learning rate and on when to stop."""
    seconds = torch.tensor([clock.seconds()], dtype=torch.float64, device=accelerator.device)
    return accelerator.reduce(seconds, reduction="max").item() if accelerator.num_processes > 1 else seconds.item()


def _stop_if_not_finite(accelerator: Accelerator, window: dict, loss: torch.Tensor, step: int, last_saved, config) -> None:
    """Stop before a NaN/inf loss reaches the weights; every process agrees through the reduce.

    Called once per optimizer step: `window["finite"]` gathered the micro-batches' verdicts on the
    device, so this is the step's one host read (and, with several processes, its one all-reduce).
    """
    finite = window["finite"]
    if accelerator.num_processes > 1:
        finite = accelerator.reduce(finite.to(torch.int32), reduction="sum") == accelerator.num_processes
    if bool(finite):
        return
    kept = (
        f"the last good checkpoint is {last_saved} (resume from it with --resume"
        if last_saved
        else "no checkpoint had been written yet (start again"
    )
    raise NonFiniteLossError(
        f"the training loss became {loss.item() if not torch.isfinite(loss).all() else 'nan or inf'} at step {step + 1}; training stopped and nothing was saved "
        f"after it. {kept} after lowering --learning-rate (now {config.learning_rate:g})"
        + (", or using --mixed-precision bf16 instead of fp16" if config.mixed_precision == "fp16" else "")
        + ").",
        every_process=True,
    )


# ---------------------------------------------------------------------------------------------
# 3. Showing what the model learned
# ---------------------------------------------------------------------------------------------
def print_fill_mask(model_dir: str | Path, sentences, top_k: int = 5, hidden: Sequence[str] | None = None) -> None:
    """The saved model's top guesses at each sentence's [MASK], loaded back from disk as a user would.

    `hidden`: the word behind each sentence's one [MASK] (held-out text, `held_out_passages`), shown beside the guesses.
    """
    model, tokenizer = load_masked_lm(model_dir)
    where = "held-out text, the hidden word in brackets" if hidden else f"top {top_k}"
    print(f"\nwhat the model fills in ({where}; loaded back from {model_dir}):")
    for index, sentence in enumerate(sentences):
        truth = f"   [{hidden[index]}]" if hidden else ""
        for guesses in fill_mask(model, tokenizer, sentence, top_k):
            print(f"  {sentence}{truth}\n      -> " + ", ".join(f"{token} ({p:.2f})" for token, p in guesses))

# ---------------------------------------------------------------------------------------------
# The model a pretraining run trains, built from its config: one rule for the run and for its precision trial.
# ---------------------------------------------------------------------------------------------

