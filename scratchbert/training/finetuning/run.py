"""Fine-tuning BERT checkpoints with `transformers.Trainer`: `finetune(config)`, read top to bottom.

`scratchbert finetune` turns any scratchbert or transformers BERT checkpoint (with its tokenizer)
into a text classifier, reading each thing once and in this order, one block of `finetune` each:

1. the checkpoint  `CheckpointInfo.read` (steps.py): config.json, the head's size and labels; the
                   tokenizer; what the classifier reads of a text (`fitted_inputs`, data.py);
2. the data        `read_splits`, `check_columns`, `carve_splits`, the labels as ids, then
                   `tokenize_splits`: `max_length` tokens, cut at the end by default (data.py);
3. the model       `load_sequence_classifier` (steps.py);
4. the Trainer     the learning rate and epochs fitted to the model and the data (`fitted_schedule`), then
                   `make_trainer` (steps.py, shared by every task): evaluation each epoch and the best epoch
                   kept, as `load_best_model_at_end` keeps it;
5. evaluation      validation and test scored per text (metrics.py); a one-class answer is reported;
6. saving          model (its config records how it read a text), tokenizer, metrics.json; epoch
                   checkpoints removed unless `keep_checkpoints`.

`finetune_text_classification(checkpoint, out, **options)` is the same with the options as keyword
arguments; `scratchbert finetune` builds the `FinetuneConfig` (config.py) from its flags and a
--config file. Token classification and question answering run in their own files with the same
`fitted_schedule`, `training_arguments` and `make_trainer` (steps.py).
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

from accelerate import PartialState

from scratchbert.tokenization import check_vocabulary, load_tokenizer
from scratchbert.training.finetuning.config import METRICS_BY_TASK, FinetuneConfig
from scratchbert.training.finetuning.data import (
    carve_splits,
    check_columns,
    encode_labels,
    fitted_inputs,
    label_names_of,
    label_warnings,
    long_text_advice,
    read_splits,
    record_inputs,
    tokenize_splits,
)
from scratchbert.training.finetuning.metrics import document_metrics, document_predictions, report_collapse, unprefixed
from scratchbert.training.finetuning.steps import (
    CheckpointInfo,
    determinism_restored,
    fitted_schedule,
    load_sequence_classifier,
    make_trainer,
    run_outcome,
    save_run,
    training_arguments,
)
from scratchbert.training.run_setup import OutputDirLock, check_output_folder

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
    tokenizer = load_tokenizer(config.tokenizer if config.tokenizer is not None else checkpoint.folder, max_length=checkpoint.positions)
    check_vocabulary(checkpoint.vocab_size or len(tokenizer), tokenizer, config.tokenizer or checkpoint.name)
    inputs = fitted_inputs(config, checkpoint.positions)
    logger.info("%d tokens per example, %s truncation, up to %d windows per text", inputs["max_length"], inputs["truncation"], inputs["windows"])

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

    # The data is good: only now is the folder made, and held against a second run writing there too.
    with OutputDirLock(output_dir, "scratchbert finetune") as lock:
        lock.claim(PartialState(), writing=True)
        # 3. The model: the checkpoint as a classifier of these labels; a new head is drawn from the seed.
        set_seed(config.seed)
        model = load_sequence_classifier(checkpoint, label_names, config.reinit_head, model_class, config.pooling)

        with determinism_restored():  # what Trainer's full determinism switches, put back when the run ends
            # 4. The Trainer: evaluation and a checkpoint each epoch; the best epoch by `best_metric` (the first of equal ones) reloaded at the end.
            schedule = fitted_schedule(config, checkpoint.hidden_size, len(splits["train"]))
            logger.info("learning rate %g (%s), %g epochs of %d optimizer steps (%s)", schedule["learning_rate"], schedule["chosen_by"]["learning_rate"],
                        schedule["epochs"], schedule["steps_per_epoch"], schedule["chosen_by"]["epochs"])  # fmt: skip
            args = training_arguments(config, schedule, output_dir, best_metric)
            trainer = make_trainer(
                model, tokenizer, args, splits["train"], splits["validation"],
                compute_metrics=partial(document_metrics, documents=splits["validation"]["document"]), early_stopping_patience=config.early_stopping_patience,
            )  # fmt: skip
            train_output = trainer.train()

            # 5. Evaluation: the kept epoch's validation scores as logged when it was evaluated; each text's scores for the one-class check.
            state = trainer.state
            results = {"labels": label_names, "label_warnings": doubtful_labels, "schedule": schedule, "inputs": inputs,
                       "pooling": getattr(trainer.model.config, "classifier_pooling", "cls"),
                       **run_outcome(trainer, train_output, config.keep_checkpoints)}  # fmt: skip
            if results["early_stopping"]["stopped_early"]:
                logger.info("early stopping: %d evaluations without a better validation %s; stopped after %g of %g epochs (%d of %d steps)",
                            results["early_stopping"]["patience"], best_metric, state.epoch, schedule["epochs"], state.global_step, schedule["optimizer_steps"])  # fmt: skip
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
            save_run(trainer, tokenizer, inputs["max_length"], output_dir, results, config.keep_checkpoints)
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

