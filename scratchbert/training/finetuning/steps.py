"""The steps every fine-tuning task's run takes, in the order it takes them. run.py (text
classification), token_classification.py and question_answering.py each read top to bottom from these:

1. the checkpoint, read once (`CheckpointInfo.read`): its config.json and the size and labels of its
   classification head, from the weight files' headers; the pooling a classifier keeps follows from
   them, and the model is later built from the same object;
2. the model, loaded with a head over the run's labels (`load_sequence_classifier` for a text
   classifier, `load_labelled_head` for any labelled head), and what it used of the checkpoint and
   what starts afresh, in words (`report_loaded_weights`);
3. the schedule (`fitted_schedule`): the learning rate fitted to the model's width and the epochs to
   the data, where the run does not give them;
4. Trainer's arguments (`training_arguments`) and the `Trainer` (`make_trainer`), and what Trainer's
   full determinism changes for good put back once the run ends (`determinism_restored`);
5. what the run reports (`run_outcome`) and saves (`save_run`).

Another task's run refuses text classification's options that it would leave unused
(`refuse_text_classification_options`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from scratchbert.configuration_scratchbert import CLASSIFIER_POOLINGS
from scratchbert.errors import ScratchBertError
from scratchbert.modeling_scratchbert import ScratchBertPreTrainedModel
from scratchbert.training.finetuning.config import CHECKPOINTS_DIR, DEFAULT_EPOCHS, LEARNING_RATES_BY_WIDTH, FinetuneConfig
from scratchbert.weights import check_weights, model_folder, quiet_loading, read_model_config, tensor_shape

logger = logging.getLogger(__name__)

HEAD_KEY = "classifier.weight"  # (K, H) weight of BERT's classification head, in every BERT checkpoint

# What a new classification head reads when --pooling is not given, by hidden size H, as (largest
# H, pooling): the mean of the real tokens measured above BERT's pooler on [CLS] for `tiny`
# (the [CLS] head collapsed where the mean did not); wider encoders keep BERT's [CLS]. A
# checkpoint's trained head keeps the pooling it was trained with (docs/finetuning.md).
POOLING_BY_WIDTH = ((128, "mean"), (math.inf, "cls"))

POOLING_WORDS = {"cls": "BERT's pooled [CLS] vector", "mean": "the mean of the real tokens"}

@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint as fine-tuning needs to know it: where it is, its config.json and its head's size."""

    name: str  # as the user gave it: a folder or a Hub name
    folder: Path  # the local folder (a Hub name's cached copy)
    config: dict  # config.json
    hidden_size: int
    positions: int  # rows of the position table: the most tokens an example can have
    vocab_size: int | None
    head_size: int | None  # rows of the classification head (its labels), None without one
    head_labels: tuple[str | None, ...] | None  # the label each row of the head was trained on (config.json's id2label)

    @classmethod
    def read(cls, checkpoint: str | Path) -> CheckpointInfo:
        """Read `checkpoint` once: a missing, truncated or corrupt weight file fails here, in one line."""
        folder = model_folder(checkpoint)
        check_weights(folder)
        shape = tensor_shape(folder, HEAD_KEY)  # from the weight files' headers only
        config = read_model_config(folder)
        head_size = shape[0] if shape is not None else None
        id2label = config.get("id2label") or {}
        head_labels = tuple(map(id2label.get, map(str, range(head_size)))) if head_size is not None else None
        hidden_size, positions = config.get("hidden_size", 768), config.get("max_position_embeddings", 512)
        return cls(str(checkpoint), folder, config, hidden_size, positions, config.get("vocab_size"), head_size, head_labels)

    def pooling(self, pooling: str | None = None, reinit_head: bool = False) -> tuple[str, str]:
        """The pooling the classifier will read (`ScratchBertConfig.classifier_pooling`), and why.

        Given (`pooling`), it is used; else a checkpoint's own classification head keeps the pooling
        it was trained with, and a new head gets `default_pooling` of the encoder's width. A trained
        head is refused another pooling unless `reinit_head`: its weights were fitted to the other vector.
        """
        head_pooling = self.config.get("classifier_pooling", "cls")
        has_head = self.head_size is not None and not reinit_head
        if pooling is None:
            if has_head:
                return head_pooling, "the checkpoint's head"
            return default_pooling(self.hidden_size), f"default for hidden size {self.hidden_size}"
        if pooling not in CLASSIFIER_POOLINGS:
            raise ScratchBertError(f"pooling={pooling!r}: choose one of {', '.join(CLASSIFIER_POOLINGS)} (--pooling).")
        if has_head and pooling != head_pooling:
            raise ScratchBertError(
                f"the checkpoint {self.name} has a classification head trained on {head_pooling!r} pooling; it cannot read "
                f"{pooling!r} pooling. Pass --reinit-head to train a new head, or drop --pooling to keep {head_pooling!r}."
            )
        return pooling, "given"

def default_pooling(hidden_size: int) -> str:
    """What a new classification head reads for an encoder of width `hidden_size` (`POOLING_BY_WIDTH`)."""
    return next(pooling for width, pooling in POOLING_BY_WIDTH if hidden_size <= width)

def load_sequence_classifier(
    checkpoint: CheckpointInfo, label_names: Sequence[str], reinit_head: bool = False, model_class=None, pooling: str | None = None
):
    """Load `checkpoint` as a classifier over `label_names` (id order), with `id2label`/`label2id` set.

    A checkpoint without a classification head (a pretrained encoder) gets a fresh one. A
    checkpoint whose head has a different number of labels is refused unless
    `reinit_head=True`, which replaces the head with a freshly initialised one (as does
    `reinit_head=True` on a head of the right size).

    Args:
        model_class: the class to load into; `ScratchBertForSequenceClassification` by
            default (transformers' `BertForSequenceClassification` works the same way).
        pooling: "cls" or "mean" (`CheckpointInfo.pooling`: None keeps a trained head's, else
            the default for the encoder's width); transformers' BERT classes pool [CLS] only.
    """
    if model_class is None:
        from scratchbert import ScratchBertForSequenceClassification as model_class
    options = {}
    if issubclass(model_class, ScratchBertPreTrainedModel):
        pooling, chosen_by = checkpoint.pooling(pooling, reinit_head)
        options["classifier_pooling"] = pooling
    elif pooling in (None, "cls"):
        pooling, chosen_by = "cls", f"{model_class.__name__}'s only pooling"
    else:
        raise ScratchBertError(f"pooling={pooling!r} needs scratchbert's classifier: {model_class.__name__} pools the [CLS] vector only.")
    logger.info("the classifier reads %s (%s)", POOLING_WORDS[pooling], chosen_by)
    return load_labelled_head(checkpoint, label_names, reinit_head, model_class, **options)


def load_labelled_head(checkpoint: CheckpointInfo, label_names: Sequence[str], reinit_head: bool, model_class, **options):
    """`model_class` (a text or token classifier) from `checkpoint` with a head over `label_names`: the
    checkpoint's own head when it has one of that size (unless `reinit_head`), else a new one; `options`
    go to the model's config. A head of another size is refused unless `reinit_head`."""
    num_labels, head_size = len(label_names), checkpoint.head_size
    if head_size is not None and head_size != num_labels and not reinit_head:
        raise ScratchBertError(
            f"the checkpoint {checkpoint.name} has a classification head for {head_size} labels, but the data has "
            f"{num_labels} ({', '.join(label_names)}). Pass --reinit-head (reinit_head=True) to train a new head "
            "for these labels, or use data with the checkpoint's labels."
        )
    with quiet_loading():  # the report below says what transformers' table would, in words
        model, loading = model_class.from_pretrained(
            str(checkpoint.folder), num_labels=num_labels, id2label=dict(enumerate(label_names)),
            label2id=dict(zip(label_names, range(num_labels))),
            ignore_mismatched_sizes=reinit_head,  # only reached with a mismatch when the user asked for a new head
            output_loading_info=True, **options,
        )  # fmt: skip
    report_loaded_weights(checkpoint.name, loading)
    if reinit_head and head_size == num_labels:
        # the loaded head had the right size, so from_pretrained kept it; start it afresh as asked
        model.classifier.weight.data.normal_(mean=0.0, std=model.config.initializer_range)
        model.classifier.bias.data.zero_()
    if head_size is None:
        logger.info("%s has no classification head: training a new one for %d labels", checkpoint.name, num_labels)
    elif reinit_head:  # transformers' load report, held back, would have listed a head of another size
        logger.info("%s's classification head for %d labels is replaced by a new one for %d (--reinit-head)", checkpoint.name, head_size, num_labels)
    return model

# The parts of a checkpoint a classifier leaves unused or starts afresh, by the names' prefix.
PARTS = {
    "cls.predictions": "the MLM head",
    "cls.seq_relationship": "the NSP head",
    "bert.pooler": "the pooler",
    "classifier": "the classification head",
    "qa_outputs": "the question-answering head",
}

NEW_PARTS = ("the pooler", "the classification head", "the question-answering head")  # what a pretrained encoder may lack, and a task model starts afresh

def part_of(key: str) -> str:
    """The part of BERT a state-dict key belongs to, in words ("cls.predictions.bias" -> "the MLM
    head"), or else its module ("discriminator.dense.weight" -> "discriminator.dense")."""
    return next((part for prefix, part in PARTS.items() if key == prefix or key.startswith(prefix + ".")), key.rsplit(".", 1)[0])

def report_loaded_weights(checkpoint, loading: dict) -> None:
    """Log what `from_pretrained(output_loading_info=True)` found: the checkpoint's parts the
    classifier does not use (its pretraining heads), a pooler that starts from random weights
    and, as a warning, any other weight the checkpoint lacks but the classification head (which
    `load_sequence_classifier` speaks of): an encoder that starts partly at random is a
    checkpoint of another shape, or one cut short."""
    unused = sorted({part_of(key) for key in loading["unexpected_keys"]})
    if unused:
        logger.info("not used from %s: %s", checkpoint, ", ".join(unused))
    missing = {key: part_of(key) for key in loading["missing_keys"]}
    if "the pooler" in missing.values():
        logger.info("%s has no pooler: it starts from random weights and is trained with the head", checkpoint)
    stray = sorted(key for key, part in missing.items() if part not in NEW_PARTS)
    if stray:
        logger.warning(
            "%d weight(s) of the encoder are not in %s and start from random values (%s): it may be a checkpoint of another "
            "architecture or size, or one cut short. Fine-tuning goes on; check the checkpoint.",
            len(stray), checkpoint, ", ".join(stray[:5]) + (", ..." if len(stray) > 5 else ""),
        )  # fmt: skip

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
