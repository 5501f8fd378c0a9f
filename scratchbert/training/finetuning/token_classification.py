"""Token classification (tagging words: named entities, parts of speech) with `transformers.Trainer`:
`finetune_token_classification(config)`, read top to bottom.

`scratchbert finetune CKPT --task token-classification --text-column tokens --label-column tags` reads,
one block each:

1. the checkpoint  `CheckpointInfo.read`, its fast tokenizer (its word ids tie pieces to words), `max_length`;
2. the data        a column of word lists and one of tag lists (JSON lines, CSV, Parquet, a `datasets` name;
                   CoNLL files, .conll, are read as columns tokens and tags) through `read_splits`;
                   `check_tagged` in the files' order; validation held out at random; the tag names
                   (`tag_names_of`); words split into pieces (`tokenize_words`): the first piece of a
                   word carries its tag and the others -100 (`label_all_pieces`: every piece, as
                   run_ner.py's label_all_tokens, B- continuing as I-), in training only; the schedule;
3. the model       the checkpoint's encoder under a token-classification head (`load_labelled_head`);
4. the Trainer     `make_trainer` with `DataCollatorForTokenClassification`; each epoch's validation
                   scored on words (`word_scores`): seqeval's figures (entity_metrics.py);
5. evaluation      the kept epoch's validation and the test split: word accuracy, and for IOB/IOB2/BIOES
                   tags the entities' precision, recall and F1, per type too;
6. saving          model (config.json's id2label names the tags), tokenizer cut where training cut,
                   metrics.json. `pipeline("token-classification", model=OUT)` then tags words as
                   scored (docs/finetuning.md).

Words past `max_length` pieces are neither trained on nor scored, as in run_ner.py; the run says how many.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from accelerate import PartialState

from scratchbert.errors import ScratchBertError
from scratchbert.modeling_scratchbert import IGNORE_INDEX
from scratchbert.tokenization import check_vocabulary, load_tokenizer
from scratchbert.training.finetuning.config import FinetuneConfig
from scratchbert.training.finetuning.data import LABEL_KINDS, carve_splits, fitted_inputs, read_splits
from scratchbert.training.finetuning.entity_metrics import is_entity_scheme, tagging_scores
from scratchbert.training.finetuning.metrics import unprefixed
from scratchbert.training.finetuning.steps import (
    CheckpointInfo,
    determinism_restored,
    fitted_schedule,
    load_labelled_head,
    make_trainer,
    refuse_text_classification_options,
    run_outcome,
    save_run,
    training_arguments,
)
from scratchbert.training.run_setup import OutputDirLock, check_output_folder

logger = logging.getLogger(__name__)


def finetune_token_classification(config: FinetuneConfig, model_class=None) -> dict[str, Any]:
    """Fine-tune as `config` says, in the module's six steps, into a `model_class` (default: scratchbert's tagger).

    Returns {"labels", "entity_scheme", "schedule", "words_cut", "train", "validation", "test" (with a test split),
    "best_checkpoint", "early_stopping", "log_history"}; also written to metrics.json."""
    from transformers import DataCollatorForTokenClassification, set_seed  # on use: importing them takes a while

    refuse_text_classification_options(config, "each sentence's first --max-length pieces")

    # 1. The checkpoint, read once; its fast tokenizer (word ids tie each piece to its word); the pieces per sentence.
    output_dir = check_output_folder(config.output_dir, config.overwrite)
    checkpoint = CheckpointInfo.read(config.checkpoint)
    tokenizer = load_tokenizer(config.tokenizer if config.tokenizer is not None else checkpoint.folder, max_length=checkpoint.positions)
    check_vocabulary(checkpoint.vocab_size or len(tokenizer), tokenizer, config.tokenizer or checkpoint.name)
    max_length = fitted_inputs(config, checkpoint.positions)["max_length"]
    if not tokenizer.is_fast:
        raise ScratchBertError(f"token classification needs a fast tokenizer (its word ids tie pieces to words); {type(tokenizer).__name__} is not one.")

    # 2. The data: sentences checked in the files' order, validation held out, tags named, words split into pieces.
    splits = read_splits(config.train_files, config.validation_files, config.test_files, config.dataset, config.dataset_config,
                         config.train_split, config.validation_split, config.test_split)  # fmt: skip
    check_tagged(splits, config.text_column, config.label_column)
    splits = {name: split.add_column("sentence", list(range(len(split)))) for name, split in splits.items()}  # one each: held out at random
    splits = carve_splits(splits, "sentence", config.validation_fraction, config.max_train_samples, config.max_eval_samples, config.seed)
    tag_names = tag_names_of(splits, config.label_column, None if config.reinit_head else checkpoint.head_labels)
    entity_scheme = is_entity_scheme(tag_names)
    best_metric = config.best_metric or ("f1" if entity_scheme else "accuracy")
    pieces = {name: split.map(partial(tokenize_words, tokenizer=tokenizer, words_column=config.text_column, tags_column=config.label_column,
                                      tag_names=tag_names, tag_name=tag_reader(splits["train"].features[config.label_column]), max_length=max_length, all_pieces=config.label_all_pieces and name == "train"),
                              batched=True, remove_columns=split.column_names, desc=f"pieces of {name}")
              for name, split in splits.items()}  # fmt: skip
    words_cut = {name: report_cut_words(split, name, max_length) for name, split in pieces.items()}
    logger.info("%d tags (%s): %s; best epoch by %s", len(tag_names), "entities scored" if entity_scheme else "words scored", ", ".join(tag_names), best_metric)

    # The data is good: only now is the folder made, and held against a second run writing there too.
    with OutputDirLock(output_dir, "scratchbert finetune") as lock:
        lock.claim(PartialState(), writing=True)
        # 3. The model: the checkpoint's encoder under a head with a row per tag (the checkpoint's own, for the same tags).
        set_seed(config.seed)
        if model_class is None:
            from scratchbert import ScratchBertForTokenClassification as model_class
        model = load_labelled_head(checkpoint, tag_names, config.reinit_head, model_class)

        with determinism_restored():  # what Trainer's full determinism switches, put back when the run ends
            # 4. The Trainer: evaluation and a checkpoint each epoch, scored on words; the best epoch reloaded at the end.
            schedule = fitted_schedule(config, checkpoint.hidden_size, len(pieces["train"]))
            args = training_arguments(config, schedule, output_dir, best_metric)
            score = partial(word_scores, tag_names=tag_names, entity_scheme=entity_scheme)
            inputs = {name: split.remove_columns(["words", "words_read"]) for name, split in pieces.items()}
            trainer = make_trainer(model, tokenizer, args, inputs["train"], inputs["validation"], data_collator=DataCollatorForTokenClassification(tokenizer),
                                   compute_metrics=score, early_stopping_patience=config.early_stopping_patience)  # fmt: skip
            train_output = trainer.train()

            # 5. Evaluation: the kept epoch's validation as logged when it was evaluated; the test split predicted and scored.
            results = {"labels": tag_names, "entity_scheme": entity_scheme, "schedule": schedule, "words_cut": words_cut,
                       **run_outcome(trainer, train_output, config.keep_checkpoints)}  # fmt: skip
            if "test" in inputs:
                results["test"] = unprefixed(trainer.predict(inputs["test"], metric_key_prefix="test").metrics, "test_")

            # 6. Saving: the tokenizer cuts where training cut, so the pipeline reads the words that were scored.
            save_run(trainer, tokenizer, max_length, output_dir, results, config.keep_checkpoints)
    logger.info("saved the fine-tuned model and tokenizer to %s", output_dir)
    for split in ("validation", "test"):
        if split in results:
            figures = results[split]
            entity = f", entity F1 {figures['f1']:.4f} (precision {figures['precision']:.4f}, recall {figures['recall']:.4f})" if entity_scheme else ""
            logger.info("%s: word accuracy %.4f%s", split, figures["accuracy"], entity)
    return results


def finetune_token_classification_folder(checkpoint: str | Path, output_dir: str | Path, *, model_class=None, **options) -> dict[str, Any]:
    """`finetune_token_classification` with `FinetuneConfig`'s fields as keyword arguments (train_files=..., epochs=...)."""
    config = FinetuneConfig(checkpoint=str(checkpoint), output_dir=str(output_dir), task="token-classification", **options)
    return finetune_token_classification(config, model_class)


def check_tagged(splits: dict, words_column: str, tags_column: str) -> None:
    """Fail in one line, naming the row and the fix, on a missing column, a sentence without words, a word
    that is not a string, or a tag list whose length differs from its word list."""
    for name, split in splits.items():
        for column, flag in ((words_column, "--text-column"), (tags_column, "--label-column")):
            if column not in split.column_names:
                raise ScratchBertError(
                    f"the {name} data has no column {column!r} (its columns: {', '.join(split.column_names)}); name the column of word lists "
                    f"with --text-column and of tag lists with --label-column ({flag} here), e.g. --text-column tokens --label-column tags."
                )
        for row, (words, tags) in enumerate(zip(split[words_column], split[tags_column]), start=1):
            where = f"row {row} of the {name} data (the first row is 1)"
            if not isinstance(words, list) or not words:
                raise ScratchBertError(f"{where}: column {words_column!r} must hold a non-empty list of words, got {words!r}.")
            if not all(isinstance(word, str) and word.strip() for word in words):
                raise ScratchBertError(f"{where}: every word of column {words_column!r} must be a non-empty string, got {words!r}.")
            if not isinstance(tags, list) or len(tags) != len(words):
                count = len(tags) if isinstance(tags, list) else "no list of"
                raise ScratchBertError(f"{where} has {len(words)} words but {count} tags in column {tags_column!r}: give one tag per word.")
            if any(tag is None for tag in tags):
                raise ScratchBertError(f"{where}: a word has no tag in column {tags_column!r} (found None); give every word a tag.")


def tag_reader(feature):
    """The name of a tag as a tags column holds it: a `Sequence(ClassLabel)`'s id -> its name, an integer -> its value."""
    from datasets import ClassLabel

    inner = getattr(feature, "feature", None)
    return inner.int2str if isinstance(inner, ClassLabel) else str


def tag_names_of(splits, tags_column: str, head_labels=None) -> list[str]:
    """The tag names in id order: a `Sequence(ClassLabel)` column's own names (the `conll2003` dataset's), else every
    split's tags sorted (integers by value, named by it); a checkpoint's trained head keeps its order for the same tags."""
    from datasets import ClassLabel

    feature = splits["train"].features[tags_column]
    inner = getattr(feature, "feature", None)
    if isinstance(inner, ClassLabel):
        names = list(inner.names)
    else:
        dtype = getattr(inner, "dtype", None)
        if LABEL_KINDS.get(dtype) is None:
            raise ScratchBertError(f"tags must be strings or integers, but column {tags_column!r} holds {feature}; map them to tag names first.")
        values = {tag for split in splits.values() for tags in split[tags_column] for tag in tags}
        names = [str(value) for value in sorted(values)]
    if len(names) < 2:
        raise ScratchBertError(f"the data has a single tag ({names[0]!r}); a tagger needs at least two.")
    if head_labels is not None and len(head_labels) == len(names) and set(head_labels) == set(names):
        names = list(head_labels)  # continuing to fine-tune a tagger keeps each tag on the head row that learned it
    return names


def tokenize_words(batch: dict, tokenizer, words_column: str, tags_column: str, tag_names, tag_name, max_length: int, all_pieces: bool) -> dict:
    """`datasets.map` over sentences -> input ids, and `labels` (T,): each word's tag (`tag_name(value)`, `tag_reader`) id on its first piece and
    -100 elsewhere (with `all_pieces`, on every piece of the word, a B- tag continuing as its I-), special
    tokens -100; `words` (the sentence's word count) and `words_read` (those inside `max_length`)."""
    tag_id = {name: i for i, name in enumerate(tag_names)}
    continuing = [tag_id.get("I-" + name[2:], i) if name.startswith("B-") else i for i, name in enumerate(tag_names)]  # run_ner.py's b_to_i_label
    encoded = tokenizer(batch[words_column], is_split_into_words=True, truncation=True, max_length=max_length)
    encoded["labels"], encoded["words"], encoded["words_read"] = [], [], []
    for row, tags in enumerate(batch[tags_column]):
        ids = [tag_id[tag_name(tag)] for tag in tags]
        word_ids = encoded.word_ids(row)  # (T,): the word of each piece, None for [CLS], [SEP]
        labels, previous = [], None
        for word in word_ids:
            if word is None:
                labels.append(IGNORE_INDEX)
            elif word != previous:
                labels.append(ids[word])
            else:
                labels.append(continuing[ids[word]] if all_pieces else IGNORE_INDEX)
            previous = word
        encoded["labels"].append(labels)
        encoded["words"].append(len(tags))
        encoded["words_read"].append(1 + max((word for word in word_ids if word is not None), default=-1))
    return encoded


def report_cut_words(split, name: str, max_length: int) -> dict[str, int]:
    """Say how many sentences are longer than `max_length` pieces and how many words that cuts (neither trained
    on nor scored); returns {"sentences", "words"}."""
    words, read = np.asarray(split["words"]), np.asarray(split["words_read"])
    cut = {"sentences": int((read < words).sum()), "words": int((words - read).sum())}
    if cut["sentences"]:
        logger.info("%d of the %d %s sentences are longer than %d pieces: %d of their words are cut, so neither trained on nor scored "
                    "(raise --max-length to read them)", cut["sentences"], len(split), name, max_length, cut["words"])  # fmt: skip
    return cut


def word_scores(eval_prediction, tag_names, entity_scheme: bool) -> dict[str, float]:
    """`compute_metrics` on words: the tag the model gives each word's first piece against its gold tag (the
    evaluated splits carry labels on first pieces only), then seqeval's figures (`tagging_scores`).
    logits (N, T, K), labels (N, T)."""
    logits = eval_prediction.predictions
    logits = logits[0] if isinstance(logits, tuple) else logits
    predicted, labels = logits.argmax(-1), eval_prediction.label_ids  # (N, T) each
    gold_tags, predicted_tags = [], []
    for predicted_row, label_row in zip(predicted, labels):
        scored = label_row != IGNORE_INDEX  # (T,): the first piece of every word read
        gold_tags.append([tag_names[i] for i in label_row[scored]])
        predicted_tags.append([tag_names[i] for i in predicted_row[scored]])
    scores = tagging_scores(gold_tags, predicted_tags, entity_scheme)
    per_type = scores.pop("per_type", {})
    for kind, figures in per_type.items():  # Trainer logs flat numbers: "PER_f1", as run_ner.py's return_entity_level_metrics
        scores.update({f"{kind}_{key}": value for key, value in figures.items()})
    return scores
