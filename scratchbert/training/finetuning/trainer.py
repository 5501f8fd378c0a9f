"""What every fine-tuning task's run shares: its schedule (`fitted_schedule`), Trainer's arguments
(`training_arguments`), the `Trainer` (`make_trainer`) and what full determinism is undone by
(`determinism_restored`), what each run reports and saves (`run_outcome`, `save_run`). run.py (text classification), token_classification.py and
question_answering.py each read top to bottom from these.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from scratchbert.errors import ScratchBertError
from scratchbert.training.finetuning.config import CHECKPOINTS_DIR, DEFAULT_EPOCHS, LEARNING_RATES_BY_WIDTH, FinetuneConfig


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
    model to leave the majority class.

    Returns:
        {"learning_rate", "epochs", "optimizer_steps", "steps_per_epoch", "chosen_by": {option: why}}
    """
    per_epoch = optimizer_steps_per_epoch(train_rows, config.batch_size, config.gradient_accumulation_steps)
    learning_rate, epochs = config.learning_rate, config.epochs
    chosen_by = {"learning_rate": "given", "epochs": "given"}
    if learning_rate is None:
        learning_rate, chosen_by["learning_rate"] = default_learning_rate(hidden_size), f"default for hidden size {hidden_size}"
    if epochs is None:
        epochs = max(DEFAULT_EPOCHS, math.ceil(config.min_steps / per_epoch))
        chosen_by["epochs"] = f"default: {DEFAULT_EPOCHS}, or enough for min_steps {config.min_steps}"
    return {
        "learning_rate": learning_rate, "epochs": epochs, "optimizer_steps": math.ceil(epochs * per_epoch), "steps_per_epoch": per_epoch,
        "chosen_by": chosen_by,
    }  # fmt: skip

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

def training_arguments(config: FinetuneConfig, schedule: dict[str, Any], output_dir: Path, best_metric: str):
    """Trainer's arguments for every task: evaluation and a checkpoint each epoch, the best epoch by
    `best_metric` (the first of equal ones) reloaded at the end, the schedule `fitted_schedule` chose."""
    from transformers import TrainingArguments  # on use: importing it takes a while

    return TrainingArguments(
        output_dir=str(output_dir / CHECKPOINTS_DIR), num_train_epochs=schedule["epochs"], learning_rate=schedule["learning_rate"],
        per_device_train_batch_size=config.batch_size, per_device_eval_batch_size=config.eval_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps, weight_decay=config.weight_decay,
        warmup_steps=config.warmup_ratio,  # a float in [0, 1) is a fraction of the total steps
        eval_strategy="epoch", save_strategy="epoch",  # picking the best epoch needs a checkpoint of each evaluated one
        load_best_model_at_end=True, metric_for_best_model=best_metric, greater_is_better=True,
        save_total_limit=1,  # Trainer still keeps the best checkpoint besides the latest
        save_only_model=True,  # epoch checkpoints are for picking the best, not for resuming: no optimizer state
        logging_steps=config.logging_steps, seed=config.seed, full_determinism=config.full_determinism, report_to="none",
        disable_tqdm=not config.progress_bar,
    )  # fmt: skip

def make_trainer(
    model, tokenizer, args, train_dataset=None, eval_dataset=None, data_collator=None, compute_metrics=None, callbacks=None,
    early_stopping_patience: int = 0,
):
    """A `Trainer` whose loss and gradients do not depend on how a batch is split up, stopping early after
    `early_stopping_patience` evaluations without a better `metric_for_best_model` (0: never).

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
    from transformers import DataCollatorWithPadding, EarlyStoppingCallback, Trainer  # on use: importing Trainer takes a while

    if not hasattr(model, "accepts_loss_kwargs"):
        model.accepts_loss_kwargs = False
    if early_stopping_patience:  # it reads the per-epoch evaluation that picks the kept epoch; the best one is still reloaded
        callbacks = [*(callbacks or []), EarlyStoppingCallback(early_stopping_patience=early_stopping_patience)]
    return Trainer(
        model=model, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset, processing_class=tokenizer,
        data_collator=data_collator if data_collator is not None else DataCollatorWithPadding(tokenizer),
        compute_metrics=compute_metrics, callbacks=callbacks,
    )  # fmt: skip

def run_outcome(trainer, train_output, keep_checkpoints: bool) -> dict[str, Any]:
    """What every task's metrics.json says of the training: {"train", "validation" (the kept epoch's scores as logged
    when it was evaluated), "best_checkpoint" (None once removed), "early_stopping"}, without Trainer's prefixes."""
    from transformers import EarlyStoppingCallback

    from scratchbert.training.finetuning.metrics import unprefixed

    state = trainer.state
    stopper = next((callback for callback in trainer.callback_handler.callbacks if isinstance(callback, EarlyStoppingCallback)), None)
    best_epoch = next(entry for entry in state.log_history if entry.get("step") == state.best_global_step and "eval_loss" in entry)
    patience = stopper.early_stopping_patience if stopper is not None else None
    return {
        "train": unprefixed(train_output.metrics, "train_"), "validation": unprefixed(best_epoch, "eval_"),
        "best_checkpoint": state.best_model_checkpoint if keep_checkpoints else None,  # else removed by `save_run`
        "early_stopping": {"patience": patience, "stopped_early": stopper is not None and stopper.early_stopping_patience_counter >= patience,
                           "epochs_run": state.epoch, "optimizer_steps_run": state.global_step},
    }  # fmt: skip

def save_run(trainer, tokenizer, max_length: int, output_dir: Path, results: dict[str, Any], keep_checkpoints: bool) -> None:
    """Save the kept model and the tokenizer (cutting where training cut, so a pipeline reads what was scored), drop
    the epoch checkpoints unless kept, and write `results` with the log history to metrics.json."""
    tokenizer.model_max_length = max_length
    trainer.save_model(str(output_dir))  # save_pretrained of the model and of the tokenizer
    if not keep_checkpoints:
        shutil.rmtree(output_dir / CHECKPOINTS_DIR, ignore_errors=True)
    results["log_history"] = trainer.state.log_history
    (output_dir / "metrics.json").write_text(json.dumps(results, indent=2) + "\n")

def refuse_text_classification_options(config: FinetuneConfig, task_reads: str, **also: bool) -> None:
    """Refuse text classification's options in another task's run, which would otherwise leave them unused.
    `task_reads` says what the task reads instead; `also` adds flags of its own ({"--reinit-head": ...})."""
    unused = {"--windows": config.windows != 1, "--truncation": config.truncation != "head", "--pooling": config.pooling is not None,
              "--text-pair-column": config.text_pair_column is not None, **also}  # fmt: skip
    given = [flag for flag, is_given in unused.items() if is_given]
    if given:
        raise ScratchBertError(f"{', '.join(given)} belong to text classification; {config.task} reads {task_reads}.")
