"""The one configuration object of a fine-tuning run: `FinetuneConfig`, and the defaults behind it.

Each field is a flag of `scratchbert finetune` (or, marked "file_only", an option of its --config
file) with a one-line help text; `run_setup` turns the fields into flags and reads the files.
What a field leaves unset (the learning rate, the epochs, the tokens per example, the pooling) is
fitted to the model and the data when the run starts (`steps.fitted_schedule`, `data.fitted_inputs`,
`CheckpointInfo.pooling`), from the defaults here and in those modules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from scratchbert.configuration_scratchbert import CLASSIFIER_POOLINGS
from scratchbert.errors import ScratchBertError
from scratchbert.training.run_setup import ConfigFile
from scratchbert.training.finetuning.data import DEFAULT_MAX_LENGTH, DEFAULT_WINDOWS, TRUNCATIONS

DOCS = "docs/finetuning.md"  # what was measured, and why the defaults are what they are

# What `scratchbert finetune --task` trains: a label per text (or text pair), a tag per word, or the span of a
# context that answers a question. Each task's run reads top to bottom in its own file (run.py, token_classification.py,
# question_answering.py), from the same checkpoint reading, Trainer and saving.
TASKS = ("text-classification", "token-classification", "question-answering")

# What each evaluation of a task reports, any of which can pick the best epoch; the first is the default
# (token classification: entity F1 for IOB/IOB2/BIOES tags, else word accuracy).
METRICS_BY_TASK = {
    "text-classification": ("macro_f1", "accuracy"),
    "token-classification": ("f1", "accuracy"),
    "question-answering": ("f1", "exact_match"),
}
METRICS = METRICS_BY_TASK["text-classification"]

# A narrow encoder needs larger steps than BERT-base's 5e-5 (Google fine-tuned its BERT miniatures at
# up to 3e-4, Turc et al. 2019; `tiny` measured best at 1e-3): the peak learning rate by hidden size
# H, as (largest H, rate), where no --learning-rate is given (DOCS).
LEARNING_RATES_BY_WIDTH = ((128, 1e-3), (256, 3e-4), (512, 1e-4), (math.inf, 5e-5))

DEFAULT_EPOCHS = 3  # BERT's; with few labels, epochs are added until there are `min_steps` optimizer steps

DEFAULT_MIN_STEPS = 300  # fewer left `tiny` answering the majority class on 450 labels (DOCS)

# Evaluations without a better `best_metric` before training stops; None: every epoch runs.
DEFAULT_EARLY_STOPPING_PATIENCE = None

CHECKPOINTS_DIR = "checkpoints"  # the epoch checkpoints under --output-dir, removed at the end unless keep_checkpoints (--config)


def _whole(value, least: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= least


@dataclass
class FinetuneConfig(ConfigFile):
    """Everything a fine-tuning run needs: `scratchbert finetune`'s flags and config file, in one place."""

    JOB = "fine-tuning"
    RENAMED_OPTIONS = {"show_progress": "progress_bar", "dataset_name": "dataset"}  # pretraining's names since issue 84

    checkpoint: str | None = field(default=None, metadata={"positional": True, "help": "folder of the checkpoint to start from (config.json + weights), or a Hugging Face Hub name"})
    output_dir: str | None = field(default=None, metadata={"help": "where the fine-tuned model, tokenizer and metrics.json go (required)"})
    tokenizer: str | None = field(default=None, metadata={"file_only": True, "help": "tokenizer folder or Hub name (default: the checkpoint's)"})
    task: str = field(default="text-classification", metadata={"choices": TASKS, "help": f"a label per text, a tag per word, or a context's span answering a question ({DOCS})"})
    # --- data: local files or a datasets name ---
    train_files: list[str] | None = field(default=None, metadata={"metavar": "FILE", "help": "CSV/TSV/JSON/JSONL/Parquet file(s) or globs, optionally compressed"})
    validation_files: list[str] | None = field(default=None, metadata={"flag": "--validation-file", "metavar": "FILE", "help": "default: hold out --validation-fraction of train"})
    test_files: list[str] | None = field(default=None, metadata={"flag": "--test-file", "metavar": "FILE", "help": "scored once at the end with the kept model"})
    dataset: str | None = field(default=None, metadata={"metavar": "NAME", "help": "a datasets name or saved folder, instead of --train-files"})
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
    # --- token classification and question answering ---
    label_all_pieces: bool = field(default=False, metadata={"help": "token classification: every WordPiece of a word carries its tag, not only the first (run_ner.py's label_all_tokens)"})
    doc_stride: int = field(default=128, metadata={"help": "question answering: tokens of a long context that consecutive windows share (run_qa.py's doc_stride)"})
    n_best: int = field(default=20, metadata={"file_only": True, "help": "question answering: start and end candidates per window that are paired into answers"})
    max_answer_length: int = field(default=30, metadata={"file_only": True, "help": "question answering: the longest answer, in tokens"})
    # --- training ---
    epochs: float | None = field(default=None, metadata={"help": f"passes over the training data (default: {DEFAULT_EPOCHS}, or more to reach min_steps)"})
    min_steps: int = field(default=DEFAULT_MIN_STEPS, metadata={"file_only": True, "help": "without --epochs, add epochs until training takes at least this many optimizer steps"})
    batch_size: int = field(default=16, metadata={"help": "examples per step"})
    eval_batch_size: int = field(default=64, metadata={"file_only": True, "help": "examples per evaluation batch"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "forward passes per optimizer step"})
    learning_rate: float | None = field(default=None, metadata={"help": f"peak learning rate of AdamW (default: by the model's hidden size, from 1e-3 to 5e-5: {DOCS})"})
    weight_decay: float = field(default=0.01, metadata={"file_only": True, "help": "AdamW weight decay"})
    warmup_ratio: float = field(default=0.1, metadata={"file_only": True, "help": "fraction of steps with a linear warmup"})
    best_metric: str | None = field(
        default=None, metadata={"choices": sorted({m for ms in METRICS_BY_TASK.values() for m in ms}), "help": "picks the epoch that is kept (default: the task's F1)"}
    )  # fmt: skip
    early_stopping_patience: int | None = field(
        default=DEFAULT_EARLY_STOPPING_PATIENCE, metadata={"help": "stop after N evaluations with no better score (default: off)"}
    )  # fmt: skip
    pooling: str | None = field(
        default=None,
        metadata={"choices": CLASSIFIER_POOLINGS, "help": f"what the classifier reads: BERT's pooler on [CLS], or the mean of the real tokens (default: a trained head's own, else mean up to hidden size 128 and cls above; {DOCS})"},
    )  # fmt: skip
    reinit_head: bool = field(default=False, metadata={"help": "train a new head even if the checkpoint has one"})
    seed: int = field(default=42, metadata={"help": "seed of the new head, the data order and dropout"})
    full_determinism: bool = field(
        default=False, metadata={"help": "the same weights from the same seed on this machine: torch's deterministic mode, no CPU kernel chosen by timing"}
    )  # fmt: skip
    logging_steps: int = field(default=50, metadata={"file_only": True, "help": "log the training loss every N steps"})
    keep_checkpoints: bool = field(default=False, metadata={"file_only": True, "help": f"keep the epoch checkpoints under --output-dir/{CHECKPOINTS_DIR} (default: removed at the end)"})
    overwrite: bool = field(default=False, metadata={"help": "allow a non-empty --output-dir"})
    progress_bar: bool = field(default=True, metadata={"help": "show Trainer's progress bars"})

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
            raise ScratchBertError(f"min_steps={self.min_steps!r}: it must be a whole number, 0 or more (min_steps in the --config file).")
        if self.task not in TASKS:
            raise ScratchBertError(f"task must be one of {', '.join(TASKS)}, got {self.task!r} (--task).")
        if self.best_metric is not None and self.best_metric not in METRICS_BY_TASK[self.task]:
            raise ScratchBertError(f"best_metric must be one of {', '.join(METRICS_BY_TASK[self.task])} for {self.task}, got {self.best_metric!r} (--best-metric).")
        for name in ("doc_stride", "n_best", "max_answer_length"):
            if not _whole(getattr(self, name), 1):
                raise ScratchBertError(f"{name}={getattr(self, name)!r}: it must be a whole number, 1 or more (--{name.replace('_', '-')}).")
        patience = self.early_stopping_patience
        if patience is not None and not _whole(patience, 0):
            raise ScratchBertError(f"early_stopping_patience={patience!r}: it must be a whole number of evaluations, 0 (off) or more (--early-stopping-patience).")
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
