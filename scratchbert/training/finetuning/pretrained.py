"""What a checkpoint is, read once (`CheckpointInfo.read`), and the classifier loaded from it.

`finetune` reads the checkpoint folder here and nowhere else: its config.json and the size and
labels of its classification head (from the weight files' headers), once; the pooling a classifier
keeps follows from them, and `load_sequence_classifier` builds the model from the same object.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from scratchbert.configuration_scratchbert import CLASSIFIER_POOLINGS
from scratchbert.errors import ScratchBertError
from scratchbert.modeling_scratchbert import ScratchBertPreTrainedModel
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
