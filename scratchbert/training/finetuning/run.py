"""Fine-tuning BERT checkpoints with `transformers.Trainer`.

`scratchbert finetune` turns any scratchbert or transformers BERT checkpoint (with its tokenizer)
into a text classifier, reading each thing once and in this order (`finetune`):

1. the checkpoint   `CheckpointInfo.read` (checkpoint_info.py): its config, head size and pooling, label order;
2. the data         `read_splits`, `check_columns`, `carve_splits`, labels (finetune_data.py), then
                    `tokenize_splits` (text_windows.py): `max_length` tokens, cut at the end by default;
3. the model        `load_sequence_classifier` (checkpoint_info.py);
4. training         a `Trainer` (`make_trainer`) with evaluation each epoch and the best epoch kept, as
                    `load_best_model_at_end` keeps it; with `soup` > 1 several runs averaged (soup.py);
                    a one-class answer is reported (`report_collapse`, classifier_metrics.py);
5. saving           model (its config records how it read a text), tokenizer, metrics.json; epoch
                    checkpoints removed unless `keep_checkpoints`.

`finetune_text_classification(checkpoint, out, **options)` is the same with the options as keyword
arguments; `scratchbert finetune` builds the `FinetuneConfig` from its flags and a --config file.
The metrics of token classification and question answering (`token_classification_metrics`,
`span_metrics`) work with the same `make_trainer`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from transformers import EarlyStoppingCallback

from scratchbert.configuration_scratchbert import CLASSIFIER_POOLINGS
from scratchbert.errors import ScratchBertError
from scratchbert.tokenization import load_tokenizer
from scratchbert.training.config_file import ConfigFile
from scratchbert.training.finetuning.data import carve_splits, check_columns, encode_labels, label_names_of, label_warnings, read_splits
from scratchbert.training.finetuning.metrics import (
    document_metrics,
    document_predictions,
    report_collapse,
    unprefixed,
)
from scratchbert.training.finetuning.pretrained import CheckpointInfo, load_sequence_classifier
from scratchbert.training.finetuning.soup import Member, WeightAverage, keep_soup_or_best_run, soup_record
from scratchbert.training.finetuning.windows import (
    DEFAULT_MAX_LENGTH,
    DEFAULT_WINDOWS,
    TRUNCATIONS,
    check_max_length,
    long_text_advice,
    record_inputs,
    tokenize_splits,
)
from scratchbert.training.run_folder import OutputDirLock, check_output_folder
from scratchbert.weights import check_vocabulary

logger = logging.getLogger(__name__)

METRICS = ("accuracy", "macro_f1")  # what each evaluation reports; either can pick the best epoch

# The `FinetuneConfig` fields that choose the data (`read_splits`) and cut it (`carve_splits`).
READ_OPTIONS = (
    "train_files", "validation_files", "test_files", "dataset_name", "dataset_config", "train_split", "validation_split", "test_split",
)  # fmt: skip

CARVE_OPTIONS = ("label_column", "validation_fraction", "max_train_samples", "max_eval_samples", "seed")

DOCS = "docs/finetuning.md"  # what was measured, and why the defaults are what they are

# A narrow encoder needs larger steps than BERT-base's 5e-5 (Google fine-tuned its BERT miniatures at
# up to 3e-4, Turc et al. 2019; `tiny` measured best at 1e-3): the peak learning rate by hidden size
# H, as (largest H, rate), where no --learning-rate is given (DOCS).
LEARNING_RATES_BY_WIDTH = ((128, 1e-3), (256, 3e-4), (512, 1e-4), (math.inf, 5e-5))

DEFAULT_EPOCHS = 3  # BERT's; with few labels, epochs are added until there are `min_steps` optimizer steps

DEFAULT_MIN_STEPS = 300  # fewer left `tiny` answering the majority class on 450 labels (DOCS)

DEFAULT_SOUP = 1  # fine-tuning runs averaged into the kept model; more cost a run each (DOCS)

# Evaluations without a better `best_metric` before training stops; None: every epoch runs.
DEFAULT_EARLY_STOPPING_PATIENCE = None

CHECKPOINTS_DIR = "checkpoints"  # the epoch checkpoints under --output-dir, removed at the end unless --keep-checkpoints

def _whole(value, least: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= least

@dataclass
class FinetuneConfig(ConfigFile):
    """Everything a fine-tuning run needs: `scratchbert finetune`'s flags and config file, in one place."""

    JOB = "fine-tuning"

    checkpoint: str | None = field(default=None, metadata={"positional": True, "help": "folder of the checkpoint to start from (config.json + weights), or a Hugging Face Hub name"})
    output_dir: str | None = field(default=None, metadata={"help": "where the fine-tuned model, tokenizer and metrics.json go (required)"})
    tokenizer: str | None = field(default=None, metadata={"file_only": True, "help": "tokenizer folder or Hub name (default: the checkpoint's)"})
    # --- data: local files or a datasets name ---
    train_files: list[str] | None = field(default=None, metadata={"flag": "--train-file", "aliases": ["--train-files"], "metavar": "FILE", "help": "CSV/TSV/JSON/JSONL/Parquet file(s) or globs, optionally compressed"})
    validation_files: list[str] | None = field(default=None, metadata={"flag": "--validation-file", "metavar": "FILE", "help": "default: hold out --validation-fraction of train"})
    test_files: list[str] | None = field(default=None, metadata={"flag": "--test-file", "metavar": "FILE", "help": "scored once at the end with the kept model"})
    dataset_name: str | None = field(default=None, metadata={"flag": "--dataset", "metavar": "NAME", "help": "a datasets name or saved folder, instead of --train-file"})
    dataset_config: str | None = field(default=None, metadata={"help": "configuration name of --dataset"})
    train_split: str | None = field(default=None, metadata={"help": "split of --dataset to train on (default: train)"})
    validation_split: str | None = field(default=None, metadata={"help": "split of --dataset to select epochs on (default: validation if present)"})
    test_split: str | None = field(default=None, metadata={"help": "split of --dataset to score at the end"})
    validation_fraction: float = field(default=0.1, metadata={"help": "held out of train without a validation split, the same share of each label"})
    text_column: str = field(default="text", metadata={"help": "column of the text"})
    text_pair_column: str | None = field(default=None, metadata={"help": "second text of a pair (e.g. hypothesis), joined with [SEP]"})
    label_column: str = field(default="label", metadata={"help": "string or integer labels"})
    max_train_samples: int | None = field(default=None, metadata={"file_only": True, "help": "train on a random subset of this size"})
    max_eval_samples: int | None = field(default=None, metadata={"file_only": True, "help": "evaluate on random subsets of this size"})
    max_length: int | None = field(default=None, metadata={"help": f"tokens per example after truncation (default: {DEFAULT_MAX_LENGTH} or the model's positions)"})
    truncation: str = field(
        default="head",
        metadata={"choices": TRUNCATIONS, "help": f"which tokens of a long text to keep: the first ones, or the first quarter and the last three quarters (single texts; {DOCS})"},
    )  # fmt: skip
    windows: int = field(
        default=DEFAULT_WINDOWS,
        metadata={"help": f"read a long single text as up to N windows of --max-length tokens, a text's prediction the mean of its windows' logits; training takes up to N times longer ({DOCS})"},
    )  # fmt: skip
    # --- training ---
    epochs: float | None = field(default=None, metadata={"help": f"passes over the training data (default: {DEFAULT_EPOCHS}, or more to reach --min-steps)"})
    min_steps: int = field(default=DEFAULT_MIN_STEPS, metadata={"help": "without --epochs, add epochs until training takes at least this many optimizer steps"})
    batch_size: int = field(default=16, metadata={"help": "examples per step"})
    eval_batch_size: int = field(default=64, metadata={"file_only": True, "help": "examples per evaluation batch"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "forward passes per optimizer step"})
    learning_rate: float | None = field(default=None, metadata={"help": f"peak learning rate of AdamW (default: by the model's hidden size, from 1e-3 to 5e-5: {DOCS})"})
    weight_decay: float = field(default=0.01, metadata={"file_only": True, "help": "AdamW weight decay"})
    warmup_ratio: float = field(default=0.1, metadata={"file_only": True, "help": "fraction of steps with a linear warmup"})
    best_metric: str = field(default="macro_f1", metadata={"choices": METRICS, "help": "picks the epoch that is kept"})
    early_stopping_patience: int | None = field(
        default=DEFAULT_EARLY_STOPPING_PATIENCE, metadata={"help": "stop after N evaluations with no better score (default: off)"}
    )  # fmt: skip
    pooling: str | None = field(
        default=None,
        metadata={"choices": CLASSIFIER_POOLINGS, "help": f"what the classifier reads: BERT's pooler on [CLS], or the mean of the real tokens (default: a trained head's own, else mean up to hidden size 128 and cls above; {DOCS})"},
    )  # fmt: skip
    soup: int = field(
        default=DEFAULT_SOUP,
        metadata={"help": f"fine-tune N times (seeds --seed, --seed + 1, ...) and keep the mean of the N kept models' weights, at N times the cost ({DOCS})"},
    )  # fmt: skip
    reinit_head: bool = field(default=False, metadata={"help": "train a new head even if the checkpoint has one"})
    seed: int = field(default=42, metadata={"help": "seed of the new head, the data order and dropout (of a soup's first run)"})
    full_determinism: bool = field(
        default=False, metadata={"help": "the same weights from the same seed on this machine: torch's deterministic mode, no CPU kernel chosen by timing"}
    )  # fmt: skip
    logging_steps: int = field(default=50, metadata={"file_only": True, "help": "log the training loss every N steps"})
    keep_checkpoints: bool = field(default=False, metadata={"help": f"keep the epoch checkpoints under --output-dir/{CHECKPOINTS_DIR} (default: removed at the end)"})
    overwrite: bool = field(default=False, metadata={"help": "allow a non-empty --output-dir"})
    show_progress: bool = field(default=True, metadata={"flag": "--progress-bar", "aliases": ["--show-progress"], "help": "show Trainer's progress bars"})

    def __post_init__(self) -> None:
        for name in ("train_files", "validation_files", "test_files"):
            if isinstance(getattr(self, name), (str, Path)):
                setattr(self, name, [getattr(self, name)])
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError naming the bad value and the fix (the data and checkpoint are checked when read)."""
        if not self.checkpoint:
            raise ScratchBertError("give the checkpoint to fine-tune: a folder with config.json and the model weights.")
        if not self.output_dir:
            raise ScratchBertError("give --output-dir: the folder the fine-tuned model goes to.")
        for name in ("epochs", "batch_size", "eval_batch_size", "gradient_accumulation_steps", "learning_rate", "logging_steps"):
            value = getattr(self, name)
            if value is None and name in ("epochs", "learning_rate"):
                continue  # fitted to the model and the data when the run starts (`fitted_schedule`)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ScratchBertError(f"{name}={value!r}: it must be a positive number (--{name.replace('_', '-')}).")
        if not _whole(self.min_steps, 0):
            raise ScratchBertError(f"min_steps={self.min_steps!r}: it must be a whole number, 0 or more (--min-steps).")
        if self.best_metric not in METRICS:
            raise ScratchBertError(f"best_metric must be one of {', '.join(METRICS)}, got {self.best_metric!r}.")
        patience = self.early_stopping_patience
        if patience is not None and not _whole(patience, 0):
            raise ScratchBertError(f"early_stopping_patience={patience!r}: it must be a whole number of evaluations, 0 (off) or more (--early-stopping-patience).")
        if not _whole(self.soup, 1):
            raise ScratchBertError(f"soup={self.soup!r}: it must be a whole number of fine-tuning runs, 1 or more (--soup).")
        if self.pooling is not None and self.pooling not in CLASSIFIER_POOLINGS:
            raise ScratchBertError(f"pooling must be one of {', '.join(CLASSIFIER_POOLINGS)}, got {self.pooling!r} (--pooling).")
        if not _whole(self.windows, 1):
            raise ScratchBertError(f"windows={self.windows!r}: it must be a whole number, 1 or more (--windows).")
        if self.truncation not in TRUNCATIONS:
            raise ScratchBertError(f"truncation must be one of {', '.join(TRUNCATIONS)}, got {self.truncation!r}.")
        if self.text_pair_column is not None and (self.windows > 1 or self.truncation != "head"):
            raise ScratchBertError("windows and head+tail truncation cut single texts; with --text-pair-column leave --windows 1 and --truncation head.")
        if not 0.0 <= self.warmup_ratio < 1.0 or self.weight_decay < 0:
            raise ScratchBertError("warmup_ratio must be in [0, 1) and weight_decay 0 or more.")

def default_learning_rate(hidden_size: int) -> float:
    """The peak learning rate for an encoder of width `hidden_size` (`LEARNING_RATES_BY_WIDTH`)."""
    return next(rate for width, rate in LEARNING_RATES_BY_WIDTH if hidden_size <= width)

def optimizer_steps_per_epoch(train_rows: int, batch_size: int, gradient_accumulation_steps: int = 1) -> int:
    """Optimizer steps in one pass over `train_rows` examples, counted as `Trainer` does (one process)."""
    return max(math.ceil(math.ceil(train_rows / batch_size) / gradient_accumulation_steps), 1)

def fitted_schedule(config: FinetuneConfig, hidden_size: int, train_rows: int) -> dict[str, Any]:
    """The learning rate and the number of epochs of the run, and where each came from.

    A value given in `config` (a flag or a file) is used as it is. Otherwise the learning rate
    follows the model's width (`default_learning_rate`) and the epochs are `DEFAULT_EPOCHS`, or
    as many whole epochs as it takes to make `config.min_steps` optimizer steps: 400 labelled
    examples in batches of 16 make 25 steps an epoch, too few updates in 3 epochs for a small
    model to leave the majority class. "optimizer_steps" counts one run's.

    Returns:
        {"learning_rate", "epochs", "optimizer_steps", "steps_per_epoch", "soup", "chosen_by": {option: why}}
    """
    per_epoch = optimizer_steps_per_epoch(train_rows, config.batch_size, config.gradient_accumulation_steps)
    learning_rate, epochs = config.learning_rate, config.epochs
    chosen_by = {"learning_rate": "given", "epochs": "given"}
    if learning_rate is None:
        learning_rate, chosen_by["learning_rate"] = default_learning_rate(hidden_size), f"default for hidden size {hidden_size}"
    if epochs is None:
        epochs = max(DEFAULT_EPOCHS, math.ceil(config.min_steps / per_epoch))
        chosen_by["epochs"] = f"default: {DEFAULT_EPOCHS}, or enough for --min-steps {config.min_steps}"
    return {
        "learning_rate": learning_rate, "epochs": epochs, "optimizer_steps": math.ceil(epochs * per_epoch), "steps_per_epoch": per_epoch,
        "soup": config.soup, "chosen_by": chosen_by,
    }  # fmt: skip

def fitted_inputs(config: FinetuneConfig, positions: int) -> dict[str, Any]:
    """How many tokens of each example the classifier reads, and which: `config`'s `max_length`
    (default `DEFAULT_MAX_LENGTH`, or the model's `positions` if fewer), `truncation` and `windows`.

    Returns:
        {"max_length", "truncation", "windows", "positions"}
    """
    max_length = config.max_length if config.max_length is not None else min(DEFAULT_MAX_LENGTH, positions)
    check_max_length(max_length, positions)
    return {"max_length": max_length, "truncation": config.truncation, "windows": config.windows, "positions": positions}

def make_trainer(
    model, tokenizer, args, train_dataset=None, eval_dataset=None, data_collator=None, compute_metrics=None, callbacks=None
):
    """A `Trainer` whose loss and gradients do not depend on how a batch is split up.

    Under gradient accumulation, Trainer passes `num_items_in_batch` (the labelled items of
    the whole accumulated batch) to a model that accepts loss kwargs and then skips its own
    division by `gradient_accumulation_steps`, trusting the model to divide its summed loss
    by that count. scratchbert's heads declare whether they do (`accepts_loss_kwargs`: True
    for token-level losses). A model that does not declare it is judged by whether its
    `forward` takes `**kwargs`, and transformers' BERT heads do take `**kwargs` yet average
    each micro-batch: Trainer would add up the micro-batch means, making loss and gradients
    `gradient_accumulation_steps` times too large. So a model that does not declare it is
    marked `accepts_loss_kwargs = False`, and Trainer divides by the number of micro-batches.
    """
    from transformers import DataCollatorWithPadding, Trainer  # on use: importing Trainer takes a while

    if not hasattr(model, "accepts_loss_kwargs"):
        model.accepts_loss_kwargs = False
    return Trainer(
        model=model, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset, processing_class=tokenizer,
        data_collator=data_collator if data_collator is not None else DataCollatorWithPadding(tokenizer),
        compute_metrics=compute_metrics, callbacks=callbacks,
    )  # fmt: skip

def training_arguments(config: FinetuneConfig, schedule: dict, checkpoints: Path, seed: int):
    """Trainer's arguments for one run: evaluation and a checkpoint each epoch, the best epoch by
    `config.best_metric` reloaded at the end (`load_best_model_at_end`, Trainer's rule for ties)."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(checkpoints),
        num_train_epochs=schedule["epochs"],
        per_device_train_batch_size=config.batch_size,
        per_device_eval_batch_size=config.eval_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        learning_rate=schedule["learning_rate"],
        weight_decay=config.weight_decay,
        warmup_steps=config.warmup_ratio,  # a float in [0, 1) is a fraction of the total steps
        eval_strategy="epoch",
        save_strategy="epoch",  # best-model selection needs a checkpoint of each evaluated epoch
        load_best_model_at_end=True,
        metric_for_best_model=config.best_metric,
        greater_is_better=True,
        save_total_limit=1,  # Trainer still keeps the best checkpoint besides the latest
        save_only_model=True,  # epoch checkpoints are for picking the best, not for resuming: no optimizer state
        logging_steps=config.logging_steps,
        seed=seed,
        full_determinism=config.full_determinism,
        report_to="none",
        disable_tqdm=not config.show_progress,
    )

def early_stopping_record(trainer, stopper, schedule: dict) -> dict:
    """What early stopping (`stopper`, an `EarlyStoppingCallback`, or None when off) did:
    {"patience", "stopped_early", "epochs_run", "optimizer_steps_run"}; a stop is logged."""
    patience = stopper.early_stopping_patience if stopper is not None else None
    stopped = stopper is not None and stopper.early_stopping_patience_counter >= patience
    record = {"patience": patience, "stopped_early": stopped, "epochs_run": trainer.state.epoch, "optimizer_steps_run": trainer.state.global_step}
    if stopped:
        logger.info(
            "early stopping: %d evaluations without a better validation %s; stopped after %g of %g epochs (%d of %d steps)",
            patience, trainer.args.metric_for_best_model, trainer.state.epoch, schedule["epochs"], trainer.state.global_step,
            schedule["optimizer_steps"],
        )  # fmt: skip
    return record

@dataclass
class Run:
    """What `finetune` has read and fitted before training, handed whole to the training steps."""

    config: FinetuneConfig
    checkpoint: CheckpointInfo
    tokenizer: Any
    splits: Any  # the tokenized `datasets.DatasetDict`
    label_names: list[str]
    label_warnings: dict | None
    inputs: dict  # `fitted_inputs`
    schedule: dict  # `fitted_schedule`
    output_dir: Path
    model_class: Any = None

def train_member(run: Run, checkpoints: Path, seed: int):
    """Train one classifier from the checkpoint with `seed`, evaluating each epoch. -> (`Member`, its
    Trainer, which holds the kept epoch's model: Trainer reloads the best at the end).

    Each run of a soup draws its new head from its own `seed` (one shared start was measured: level
    for `tiny`, worse from random weights; DOCS).
    """
    from transformers import set_seed

    config = run.config
    set_seed(seed)  # the new head's initialisation and the data order
    model = load_sequence_classifier(run.checkpoint, run.label_names, config.reinit_head, run.model_class, config.pooling)
    # Early stopping reads the same per-epoch evaluation that picks the kept epoch (and the best one is still reloaded).
    stopper = EarlyStoppingCallback(early_stopping_patience=config.early_stopping_patience) if config.early_stopping_patience else None
    trainer = make_trainer(
        model, run.tokenizer, training_arguments(config, run.schedule, checkpoints, seed), run.splits["train"], run.splits["validation"],
        compute_metrics=document_metrics(run.splits["validation"]["document"]), callbacks=[stopper] if stopper else [],
    )  # fmt: skip
    train_output = trainer.train()
    # The best epoch's validation metrics were logged when it was evaluated; no need to evaluate again.
    best_epoch = next(e for e in trainer.state.log_history if e.get("step") == trainer.state.best_global_step and "eval_loss" in e)
    member = Member(
        seed, unprefixed(train_output.metrics, "train_"), unprefixed(best_epoch, "eval_"), trainer.state.best_model_checkpoint,
        early_stopping_record(trainer, stopper, run.schedule), trainer.state.log_history,
    )  # fmt: skip
    return member, trainer

def finetune_text_classification(checkpoint: str | Path, output_dir: str | Path, *, model_class=None, **options) -> dict[str, Any]:
    """Fine-tune `checkpoint` as a text (or text-pair) classifier and save it to `output_dir`.

    `options` are the fields of `FinetuneConfig` (train_files=..., epochs=..., ...); see
    `finetune` for what happens.
    """
    config = FinetuneConfig(checkpoint=str(checkpoint), output_dir=str(output_dir), **options)
    return finetune(config, model_class=model_class)

# What `transformers.enable_full_determinism` (Trainer's `full_determinism`) sets for the rest of the process.
DETERMINISM_ENVIRONMENT = ("CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG", "ASCEND_LAUNCH_BLOCKING", "HCCL_DETERMINISTIC", "FLASH_ATTENTION_DETERMINISTIC")

@contextlib.contextmanager
def determinism_restored():
    """Put back what Trainer's `full_determinism` changes for good: torch's deterministic mode (which
    also keeps every CPU product on torch's own kernel, `cpu_gemm`), cuDNN's flags and the
    environment variables above, so work after a reproducible run runs at full speed."""
    mode = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    environment = {name: os.environ.get(name) for name in DETERMINISM_ENVIRONMENT}
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(mode[0], warn_only=mode[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
        for name, value in environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

def read_labelled_splits(config: FinetuneConfig, checkpoint: CheckpointInfo):
    """The data, checked and labelled: -> (splits with a "labels" column, label names in id order, `label_warnings`).
    Cells are checked in the files' order, before `carve_splits` shuffles them."""
    splits = read_splits(**{name: getattr(config, name) for name in READ_OPTIONS})
    check_columns(splits, config.text_column, config.text_pair_column, config.label_column)
    splits = carve_splits(splits, **{name: getattr(config, name) for name in CARVE_OPTIONS})
    label_names = label_names_of(splits, config.label_column)
    if len(label_names) < 2:
        raise ScratchBertError(f"the data has a single label ({label_names[0]!r}); a classifier needs at least two.")
    label_names = checkpoint.label_order(label_names, config.reinit_head)
    logger.info("%d labels: %s; %s", len(label_names), ", ".join(label_names), ", ".join(f"{k} {len(v)} rows" for k, v in splits.items()))
    splits = encode_labels(splits, config.label_column, label_names)
    return splits, label_names, label_warnings(splits, label_names)

def finetune(config: FinetuneConfig, model_class=None) -> dict[str, Any]:
    """Fine-tune as `config` says: read the checkpoint once, then the data, then train, score and save.

    Learning rate and epochs not given are fitted to the model's width and the number of training
    examples (`fitted_schedule`). Evaluates accuracy and macro-F1 on the validation split after every
    epoch (a text read in several `windows` by its windows' mean logits; stopping after
    `early_stopping_patience` evaluations without a better `best_metric`, when set) and reloads the
    epoch with the best `best_metric` at the end, as Trainer's `load_best_model_at_end` does; with
    `soup` = N > 1 does that N times and keeps the mean of the N kept models' weights (`train_and_score`).

    Returns:
        {"labels", "label_warnings", "schedule", "inputs", "train", "validation", "test" (when a test
         split is given), "best_checkpoint" (None once removed: without keep_checkpoints), "pooling", "early_stopping", "collapsed", and for a soup
         "soup"}, with metrics named without Trainer's "eval_" prefix; also written to metrics.json.
    """
    checkpoint = CheckpointInfo.read(config.checkpoint)
    inputs = fitted_inputs(config, checkpoint.positions)
    logger.info("%d tokens per example, %s truncation, up to %d windows per text", inputs["max_length"], inputs["truncation"], inputs["windows"])
    output_dir = check_output_folder(config.output_dir, config.overwrite)
    tokenizer = load_tokenizer(config.tokenizer if config.tokenizer is not None else checkpoint.folder, max_length=inputs["positions"])
    check_vocabulary(checkpoint.config.get("vocab_size", len(tokenizer)), tokenizer, config.tokenizer or checkpoint.name)
    splits, label_names, doubtful_labels = read_labelled_splits(config, checkpoint)
    splits = tokenize_splits(splits, tokenizer, config.text_column, config.text_pair_column, inputs["max_length"], inputs["truncation"], inputs["windows"])
    if (advice := long_text_advice(splits["train"], inputs["max_length"], inputs["windows"], config.text_pair_column)) is not None:
        logger.info(advice)
    schedule = fitted_schedule(config, checkpoint.hidden_size, len(splits["train"]))
    logger.info(
        "learning rate %g (%s), %g epochs of %d optimizer steps (%s), %d run%s averaged into the kept model",
        schedule["learning_rate"], schedule["chosen_by"]["learning_rate"], schedule["epochs"], schedule["steps_per_epoch"],
        schedule["chosen_by"]["epochs"], schedule["soup"], "s" if schedule["soup"] > 1 else "",
    )  # fmt: skip
    run = Run(config, checkpoint, tokenizer, splits, label_names, doubtful_labels, inputs, schedule, output_dir, model_class)
    # The data is good: only now is the folder made, and held against a second run writing there too.
    with OutputDirLock(output_dir, "scratchbert finetune") as lock, determinism_restored():
        lock.claim(PartialState(), writing=True)
        return train_and_score(run)

def train_runs(run: Run):
    """The soup's runs (one by default), seeds `config.seed` + 0..N-1, checkpoints in `checkpoints/run-k`
    for a soup. -> (the members, the last run's Trainer holding the kept model, the soup's record or None)."""
    runs, seed = run.schedule["soup"], run.config.seed
    members, average = [], WeightAverage()
    for k in range(runs):
        if runs > 1:
            logger.info("soup: fine-tuning run %d of %d (seed %d)", k + 1, runs, seed + k)
        member, trainer = train_member(run, run.output_dir / CHECKPOINTS_DIR / (f"run-{k}" if runs > 1 else ""), seed + k)
        members.append(member)
        if runs > 1:
            average.add(trainer.model)
    if runs == 1:
        return members, trainer, None
    average.load_into(trainer.model)
    together = soup_record(members)
    together["soup"] |= keep_soup_or_best_run(trainer, members, run.splits["validation"], run.config.best_metric)
    logger.info("soup of %d runs; each run's validation %s: %s", runs, run.config.best_metric, ", ".join(f"{m.validation[run.config.best_metric]:.4f}" for m in members))
    return members, trainer, together

def score_splits(trainer, splits, results: dict, rescore_validation: bool) -> dict:
    """Score the kept model on validation and test, per text; -> {split: (logits (D, K), labels (D,))}.
    The test scores (and, for a soup, the validation scores) go into `results`."""
    outputs = {}
    for split, prefix in (("validation", "eval"), ("test", "test")):
        if split in splits:
            trainer.compute_metrics = document_metrics(splits[split]["document"])
            output = trainer.predict(splits[split], metric_key_prefix=prefix)
            outputs[split] = document_predictions(output.predictions, output.label_ids, splits[split]["document"])
            if split == "test" or rescore_validation:
                results[split] = unprefixed(output.metrics, f"{prefix}_")
    return outputs

def train_and_score(run: Run) -> dict[str, Any]:
    """`finetune`'s training, scoring and saving, on the checked and tokenized data (`Run`)."""
    members, trainer, soup = train_runs(run)
    member = members[-1]
    log_history = member.log_history if soup is None else [entry | {"run": k} for k, m in enumerate(members) for entry in m.log_history]
    results = {
        "labels": run.label_names, "label_warnings": run.label_warnings, "schedule": run.schedule, "inputs": run.inputs,
        "train": member.train if soup is None else soup["train"],
        "validation": member.validation,  # a soup's own replaces it in `score_splits`
        "best_checkpoint": member.best_checkpoint if soup is None else None,
        "pooling": getattr(trainer.model.config, "classifier_pooling", "cls"),
        "early_stopping": member.early_stopping if soup is None else soup["early_stopping"],
    } | ({"soup": soup["soup"]} if soup is not None else {})  # fmt: skip
    outputs = score_splits(trainer, run.splits, results, rescore_validation=soup is not None)
    results["collapsed"] = report_collapse(log_history, outputs, run.label_names)
    save_classifier(run, trainer)
    if not run.config.keep_checkpoints:  # save_classifier removed them: metrics.json names no folder that is gone
        for record in [results, *results.get("soup", {}).get("members", [])]:
            record["best_checkpoint"] = None
    results["log_history"] = log_history
    (run.output_dir / "metrics.json").write_text(json.dumps(results, indent=2) + "\n")
    for split in ("validation", "test"):
        if split in results:
            logger.info("%s: accuracy %.4f, macro-F1 %.4f", split, results[split]["accuracy"], results[split]["macro_f1"])
    return results

def save_classifier(run: Run, trainer) -> None:
    """Save the kept model and its tokenizer, its config recording how it read a text (`record_inputs`,
    read back by `classify_texts`; the tokenizer cuts at `max_length`, as a `pipeline` then does), and
    remove the epoch checkpoints unless `keep_checkpoints`."""
    record_inputs(trainer.model.config, run.inputs)
    run.tokenizer.model_max_length = run.inputs["max_length"]
    trainer.save_model(str(run.output_dir))  # save_pretrained of the model and of the tokenizer
    if not run.config.keep_checkpoints:
        shutil.rmtree(run.output_dir / CHECKPOINTS_DIR, ignore_errors=True)
    logger.info("saved the fine-tuned model and tokenizer to %s", run.output_dir)
