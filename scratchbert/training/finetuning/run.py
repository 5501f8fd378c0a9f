"""Fine-tuning BERT checkpoints with `transformers.Trainer`: `finetune(config)`, read top to bottom.

`scratchbert finetune` turns any scratchbert or transformers BERT checkpoint (with its tokenizer)
into a text classifier, reading each thing once and in this order, one block of `finetune` each:

1. the checkpoint  `CheckpointInfo.read` (pretrained.py): config.json, the head's size and labels; the
                   tokenizer; what the classifier reads of a text (`fitted_inputs`, windows.py);
2. the data        `read_splits`, `check_columns`, `carve_splits`, the labels as ids (data.py), then
                   `tokenize_splits` (windows.py): `max_length` tokens, cut at the end by default; the
                   learning rate and epochs fitted to the model and the data (`fitted_schedule`);
3. the model       `load_sequence_classifier` (pretrained.py);
4. the Trainer     `make_trainer`: evaluation each epoch and the best epoch kept, as
                   `load_best_model_at_end` keeps it;
5. evaluation      validation and test scored per text (metrics.py); a one-class answer is reported;
6. saving          model (its config records how it read a text), tokenizer, metrics.json; epoch
                   checkpoints removed unless `keep_checkpoints`.

`finetune_text_classification(checkpoint, out, **options)` is the same with the options as keyword
arguments; `scratchbert finetune` builds the `FinetuneConfig` (config.py) from its flags and a
--config file. Token classification and question answering (`token_classification_metrics`,
`span_metrics`) train with the same `make_trainer`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
from functools import partial
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from transformers import EarlyStoppingCallback

from scratchbert.tokenization import load_tokenizer
from scratchbert.training.finetuning.config import CHECKPOINTS_DIR, DEFAULT_EPOCHS, LEARNING_RATES_BY_WIDTH, METRICS_BY_TASK, FinetuneConfig
from scratchbert.training.finetuning.data import carve_splits, check_columns, encode_labels, label_names_of, label_warnings, read_splits
from scratchbert.training.finetuning.metrics import document_metrics, document_predictions, report_collapse, unprefixed
from scratchbert.training.finetuning.pretrained import CheckpointInfo, load_sequence_classifier
from scratchbert.training.finetuning.windows import fitted_inputs, long_text_advice, record_inputs, tokenize_splits
from scratchbert.training.run_folder import OutputDirLock, check_output_folder
from scratchbert.weights import check_vocabulary

logger = logging.getLogger(__name__)

def finetune(config: FinetuneConfig, model_class=None) -> dict[str, Any]:
    """Fine-tune as `config` says, in the module's six steps, into a `model_class` (default: scratchbert's classifier).

    Returns {"labels", "label_warnings", "schedule", "inputs", "train", "validation", "test" (with a test split),
    "best_checkpoint" (None once removed, without keep_checkpoints), "pooling", "early_stopping", "collapsed", "log_history"},
    metrics named without Trainer's "eval_" prefix; also written to metrics.json."""
    from transformers import set_seed  # on use: importing it takes a while

    if config.task == "token-classification":  # each task's run reads top to bottom in its own file
        from scratchbert.training.finetuning.token_classification import finetune_token_classification

        return finetune_token_classification(config, model_class)
    if config.task == "question-answering":
        from scratchbert.training.finetuning.question_answering import finetune_question_answering

        return finetune_question_answering(config, model_class)
    best_metric = config.best_metric or METRICS_BY_TASK[config.task][0]

    # 1. The checkpoint, read once; its tokenizer; how many tokens of a text the classifier reads, and which.
    output_dir = check_output_folder(config.output_dir, config.overwrite)
    checkpoint = CheckpointInfo.read(config.checkpoint)
    inputs = fitted_inputs(config, checkpoint.positions)
    logger.info("%d tokens per example, %s truncation, up to %d windows per text", inputs["max_length"], inputs["truncation"], inputs["windows"])
    tokenizer = load_tokenizer(config.tokenizer if config.tokenizer is not None else checkpoint.folder, max_length=checkpoint.positions)
    check_vocabulary(checkpoint.vocab_size or len(tokenizer), tokenizer, config.tokenizer or checkpoint.name)

    # 2. The data: its cells checked in the files' order, validation held out, labels made ids, texts tokenized.
    splits = read_splits(config.train_files, config.validation_files, config.test_files, config.dataset, config.dataset_config,
                         config.train_split, config.validation_split, config.test_split)  # fmt: skip
    check_columns(splits, config.text_column, config.text_pair_column, config.label_column)
    splits = carve_splits(splits, config.label_column, config.validation_fraction, config.max_train_samples, config.max_eval_samples, config.seed)
    label_names = label_names_of(splits, config.label_column, None if config.reinit_head else checkpoint.head_labels)
    splits = encode_labels(splits, config.label_column, label_names)
    doubtful_labels = label_warnings(splits, label_names)
    splits = tokenize_splits(splits, tokenizer, config.text_column, config.text_pair_column, inputs["max_length"], inputs["truncation"], inputs["windows"])
    if (advice := long_text_advice(splits["train"], inputs["max_length"], inputs["windows"], config.text_pair_column)) is not None:
        logger.info(advice)
    schedule = fitted_schedule(config, checkpoint.hidden_size, len(splits["train"]))
    logger.info("learning rate %g (%s), %g epochs of %d optimizer steps (%s)", schedule["learning_rate"], schedule["chosen_by"]["learning_rate"],
                schedule["epochs"], schedule["steps_per_epoch"], schedule["chosen_by"]["epochs"])  # fmt: skip

    # The data is good: only now is the folder made, and held against a second run writing there too.
    with determinism_restored(), OutputDirLock(output_dir, "scratchbert finetune") as lock:
        lock.claim(PartialState(), writing=True)
        # 3. The model: the checkpoint as a classifier of these labels; a new head is drawn from the seed.
        set_seed(config.seed)
        model = load_sequence_classifier(checkpoint, label_names, config.reinit_head, model_class, config.pooling)

        # 4. The Trainer: evaluation and a checkpoint each epoch; the best epoch by `best_metric` (the first of equal ones) reloaded at the end.
        args = training_arguments(config, schedule, output_dir, best_metric)
        # Early stopping reads the same per-epoch evaluation that picks the kept epoch (and the best one is still reloaded).
        patience = config.early_stopping_patience or None  # 0: off, as None
        stopper = EarlyStoppingCallback(early_stopping_patience=patience) if patience else None
        trainer = make_trainer(
            model, tokenizer, args, splits["train"], splits["validation"],
            compute_metrics=partial(document_metrics, documents=splits["validation"]["document"]), callbacks=[stopper] if stopper else [],
        )  # fmt: skip
        train_output = trainer.train()

        # 5. Evaluation: the kept epoch's validation scores as logged when it was evaluated; each text's scores for the one-class check.
        state = trainer.state
        best_epoch = next(entry for entry in state.log_history if entry.get("step") == state.best_global_step and "eval_loss" in entry)
        stopped = stopper is not None and stopper.early_stopping_patience_counter >= patience
        if stopped:
            logger.info("early stopping: %d evaluations without a better validation %s; stopped after %g of %g epochs (%d of %d steps)",
                        patience, best_metric, state.epoch, schedule["epochs"], state.global_step, schedule["optimizer_steps"])  # fmt: skip
        results = {
            "labels": label_names, "label_warnings": doubtful_labels, "schedule": schedule, "inputs": inputs,
            "train": unprefixed(train_output.metrics, "train_"), "validation": unprefixed(best_epoch, "eval_"),
            "best_checkpoint": state.best_model_checkpoint if config.keep_checkpoints else None,  # else removed below
            "pooling": getattr(trainer.model.config, "classifier_pooling", "cls"),
            "early_stopping": {"patience": patience, "stopped_early": stopped, "epochs_run": state.epoch, "optimizer_steps_run": state.global_step},
        }  # fmt: skip
        outputs = {}  # split -> each text's logits (D, K) and label (D,)
        for split, prefix in (("validation", "eval"), ("test", "test")):
            if split in splits:
                trainer.compute_metrics = partial(document_metrics, documents=splits[split]["document"])
                output = trainer.predict(splits[split], metric_key_prefix=prefix)
                outputs[split] = document_predictions(output.predictions, output.label_ids, splits[split]["document"])
                if split == "test":
                    results["test"] = unprefixed(output.metrics, "test_")
        results["collapsed"] = report_collapse(state.log_history, outputs, label_names)

        # 6. Saving: the config records how the model read a text (read back by `classify_texts`), the tokenizer cuts where it did.
        record_inputs(trainer.model.config, inputs)
        tokenizer.model_max_length = inputs["max_length"]
        trainer.save_model(str(output_dir))  # save_pretrained of the model and of the tokenizer
        if not config.keep_checkpoints:
            shutil.rmtree(output_dir / CHECKPOINTS_DIR, ignore_errors=True)
        results["log_history"] = state.log_history
        (output_dir / "metrics.json").write_text(json.dumps(results, indent=2) + "\n")
    logger.info("saved the fine-tuned model and tokenizer to %s", output_dir)
    for split in ("validation", "test"):
        if split in results:
            logger.info("%s: accuracy %.4f, macro-F1 %.4f", split, results[split]["accuracy"], results[split]["macro_f1"])
    return results

def finetune_text_classification(checkpoint: str | Path, output_dir: str | Path, *, model_class=None, **options) -> dict[str, Any]:
    """Fine-tune `checkpoint` as a text (or text-pair) classifier and save it to `output_dir`.

    `options` are the fields of `FinetuneConfig` (train_files=..., epochs=..., ...); see
    `finetune` for what happens.
    """
    config = FinetuneConfig(checkpoint=str(checkpoint), output_dir=str(output_dir), **options)
    return finetune(config, model_class=model_class)

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
