"""Finding and checking a saved model's weight files, before anything loads them.

Every command that reads a checkpoint (finetune, fill-mask, attention-map, export-bert,
export-onnx) calls `check_weights` first, so a truncated or half-copied file gives the same
one-line error everywhere instead of a traceback from deep inside safetensors or torch.

Reading is safe: safetensors headers, and `torch.load(weights_only=True)` for a `.bin`.
"""

from __future__ import annotations

import json
from pathlib import Path

from scratchbert.errors import ScratchBertError, corrupt_weights

SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"


def weight_files(model_dir: str | Path) -> list[Path]:
    """The weight files of a saved model: one file, or every shard its index names."""
    folder = Path(model_dir)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"no model in {folder}: expected a folder with config.json and the model weights.")
    for index_name in (SAFETENSORS_INDEX, BIN_INDEX):
        index = folder / index_name
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            except (ValueError, KeyError) as err:
                raise corrupt_weights(index, f"unreadable index: {err}") from None
            missing = [name for name in shards if not (folder / name).is_file()]
            if missing:
                raise corrupt_weights(index, f"shard {missing[0]} is missing")
            return [folder / name for name in shards]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return [folder / name]
    raise ScratchBertError(f"{folder} has a config.json but no weights (model.safetensors or pytorch_model.bin): save the model again.")


def tensor_names(path: str | Path) -> list[str]:
    """The tensor names in one weight file; raises the corrupt-weights error if it cannot be read whole.

    A safetensors header records every tensor's byte range, so reading it also proves the
    file is complete (a cut file fails with "incomplete metadata"). A `.bin` is a zip whose
    directory sits at its end, so a cut one fails to open.
    """
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as weights:
                return list(weights.keys())
        import torch

        try:  # mapped from disk: the tensors are not read
            return list(torch.load(path, map_location="cpu", weights_only=True, mmap=True).keys())
        except RuntimeError as err:
            if "mmap can only be used" not in str(err):
                raise
            # The legacy (pre-zip) format cannot be mapped: read it whole, as from_pretrained will.
            return list(torch.load(path, map_location="cpu", weights_only=True).keys())
    except Exception as err:  # safetensors, zip and unpickling errors have no common base class
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise corrupt_weights(path, reason) from None


def check_weights(model_dir: str | Path) -> list[str]:
    """Check that every weight file of the model in `model_dir` reads; return all tensor names."""
    return [name for path in weight_files(model_dir) for name in tensor_names(path)]


__all__ = ["weight_files", "tensor_names", "check_weights"]
