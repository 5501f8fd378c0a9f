"""Export a scratchbert checkpoint as a plain transformers BERT checkpoint.

scratchbert keeps transformers' BERT state-dict names, so the export only rewrites the
configuration (`model_type "bert"`, `Bert*` architectures) and copies the weights; the
result loads in `BertForPreTraining` / `BertModel` / `BertFor...` with no missing keys and
needs no scratchbert at all.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from transformers import BertConfig

from scratchbert.configuration_scratchbert import ScratchBertConfig

# Configuration keys that only scratchbert (or its remote-code loading) uses.
_SCRATCHBERT_ONLY_KEYS = ("auto_map", "model_type", "architectures", "transformers_version")


def export_to_transformers_bert(checkpoint_dir: str | Path, out_dir: str | Path) -> Path:
    """Write `checkpoint_dir` (a scratchbert checkpoint) to `out_dir` as a transformers BERT checkpoint.

    Weights are copied byte for byte (safetensors, or a `.bin` file as it is); the config
    becomes a `BertConfig`. A tokenizer saved beside the model is written back as
    transformers' `BertTokenizer` with the same vocabulary and casing.
    Returns the output directory.
    """
    src, out = Path(checkpoint_dir), Path(out_dir)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} holds no config.json: pass the directory a scratchbert model was saved to.")
    weights = sorted(src.glob("*.safetensors")) + sorted(src.glob("*.bin")) + sorted(src.glob("*.index.json"))
    weights = [w for w in weights if w.name != "training_args.bin"]
    if not weights:
        raise FileNotFoundError(f"{src} holds no model weights (model.safetensors or pytorch_model.bin).")
    if out.resolve() == src.resolve():
        raise ValueError("The export directory must differ from the checkpoint directory.")

    config = ScratchBertConfig.from_pretrained(src)
    fields = {k: v for k, v in config.to_dict().items() if k not in _SCRATCHBERT_ONLY_KEYS}
    bert_config = BertConfig(**fields)
    bert_config.architectures = [name.replace("ScratchBert", "Bert") for name in (config.architectures or ["ScratchBertModel"])]

    out.mkdir(parents=True, exist_ok=True)
    bert_config.save_pretrained(out)
    for path in weights:
        shutil.copyfile(path, out / path.name)
    _export_tokenizer(src, out)
    return out


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


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export-bert",
        help="write a scratchbert checkpoint as a plain transformers BERT checkpoint",
        description="Copy a scratchbert checkpoint to OUT as model_type 'bert', loadable by transformers' Bert* classes.",
    )
    parser.add_argument("checkpoint", help="directory of a saved scratchbert model")
    parser.add_argument("out", help="directory to write the transformers BERT checkpoint to")
    parser.set_defaults(func=lambda args: print(f"exported to {export_to_transformers_bert(args.checkpoint, args.out)}"))


__all__ = ["export_to_transformers_bert"]
