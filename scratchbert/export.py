"""Export a scratchbert checkpoint as a plain transformers BERT checkpoint.

scratchbert keeps transformers' BERT state-dict names, so the export only rewrites the
configuration (`model_type "bert"`, `Bert*` architectures) and copies the weights; the
result loads in `BertForPreTraining` / `BertModel` / `BertFor...` with no missing keys and
needs no scratchbert at all. A classifier that pools its tokens by their mean
(`classifier_pooling="mean"`) is refused: BERT's classifier reads the [CLS] vector.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from transformers import BertConfig

from scratchbert.configuration_scratchbert import ScratchBertConfig
from scratchbert.errors import ScratchBertError
from scratchbert.weights import BIN_INDEX, SAFETENSORS_INDEX, check_weights, model_folder, weight_files

# Configuration keys that only scratchbert (or its remote-code loading) uses. BERT's heads always
# pool on [CLS] ("cls" is what a BERT checkpoint means), and a "mean" classifier is refused.
_SCRATCHBERT_ONLY_KEYS = ("auto_map", "model_type", "architectures", "transformers_version", "classifier_pooling")


def export_to_transformers_bert(checkpoint_dir: str | Path, out_dir: str | Path) -> Path:
    """Write `checkpoint_dir` (a scratchbert checkpoint) to `out_dir` as a transformers BERT checkpoint.

    Weights are copied byte for byte (safetensors, or a `.bin` file as it is); the config
    becomes a `BertConfig`. A tokenizer saved beside the model is written back as
    transformers' `BertTokenizer` with the same vocabulary and casing.
    Returns the output directory.
    """
    src, out = model_folder(checkpoint_dir), Path(out_dir)  # a Hub name: its copy in the Hub's cache
    names = check_weights(src)  # every weight file reads whole, or one line says which does not
    weights = weight_files(src)
    weights += [src / index for index in (SAFETENSORS_INDEX, BIN_INDEX) if (src / index).is_file()]
    check_export_folder(src, out)

    config = ScratchBertConfig.from_pretrained(src)
    _check_bert_can_express(config, src)
    fields = {k: v for k, v in config.to_dict().items() if k not in _SCRATCHBERT_ONLY_KEYS}
    bert_config = BertConfig(**fields)
    bert_config.architectures = [name.replace("ScratchBert", "Bert") for name in (config.architectures or ["ScratchBertModel"])]

    out.mkdir(parents=True, exist_ok=True)
    bert_config.save_pretrained(out)
    for path in weights:
        shutil.copyfile(path, out / path.name)
    _export_tokenizer(src, out)
    _verify_export(out, names)
    return out


def check_export_folder(src: Path, out: Path) -> None:
    """Refuse, in one line, an export folder that would overwrite the model or cannot be a folder."""
    if out.resolve() == src.resolve():
        raise ScratchBertError(f"the export folder {out} is the model's own folder: name another, e.g. {out.name}-export.")
    if out.exists() and not out.is_dir():
        raise ScratchBertError(f"cannot export to {out}: it is a file, not a folder; name a folder (it is created).")
    parent = next((folder for folder in (out, *out.parents) if folder.exists()), Path("."))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ScratchBertError(f"cannot export to {out}: {parent} is not writable; name a folder you can write to.")


def _check_bert_can_express(config: ScratchBertConfig, src: Path) -> None:
    """Refuse a classifier that BERT's classes would load without error and then compute differently."""
    architectures = config.architectures or []
    head = next((name for name in architectures if name.endswith(("ForSequenceClassification", "ForMultipleChoice"))), None)
    if config.classifier_pooling != "cls" and head is not None:
        bert_class = "BertFor" + head.split("For", 1)[1]
        raise ScratchBertError(
            f"{src} is a {head} with classifier_pooling={config.classifier_pooling!r} (it classifies the "
            f"{config.classifier_pooling} of the last layer over the real tokens), which transformers' {bert_class} cannot "
            "express: it classifies the pooled [CLS] vector, so the "
            "export would load with an untrained pooler and give other answers. Export it with `scratchbert export-onnx "
            f"{src} OUT` (sequence classifiers), load it with scratchbert (its Auto classes), or fine-tune with "
            "`--pooling cls` for a checkpoint that exports as BERT."
        )


def _verify_export(out: Path, names: list[str]) -> None:
    """Read back what was written: a BERT config, and weights that read whole with the same tensors."""
    BertConfig.from_pretrained(out)
    written = check_weights(out)
    if sorted(written) != sorted(names):
        raise ScratchBertError(f"the weights written to {out} do not hold the checkpoint's tensors; the disk may be full. Export again.")


def _export_tokenizer(src: Path, out: Path) -> None:
    """Save the checkpoint's tokenizer, if it has one, as transformers' `BertTokenizer`."""
    if not (src / "tokenizer.json").is_file() and not (src / "vocab.txt").is_file():
        return
    from transformers import AutoTokenizer, BertTokenizer

    import scratchbert  # noqa: F401  (registers scratchbert's tokenizer with AutoTokenizer)

    ours = AutoTokenizer.from_pretrained(src)
    normalizer = json.loads(ours.backend_tokenizer.to_str()).get("normalizer") or {}
    bert = BertTokenizer(
        vocab=ours.get_vocab(),
        do_lower_case=normalizer.get("lowercase", True),
        strip_accents=normalizer.get("strip_accents"),
        tokenize_chinese_chars=normalizer.get("handle_chinese_chars", True),
        model_max_length=ours.model_max_length,
    )
    bert.save_pretrained(out)


__all__ = ["export_to_transformers_bert"]
