"""What is in a saved model folder, and the one-line errors for what is wrong with one.

A folder written by `save_pretrained` holds `config.json` and the weights: `model.safetensors`
or `pytorch_model.bin`, or shards named by an index (`*.index.json`). This module is the one
place that knows that layout:

- `model_folder` / `read_model_config`: the folder and its config.json, or a `MissingFileError`;
  a name that is no folder here but a Hugging Face Hub repository's ("bert-base-uncased",
  "owner/name") is fetched into the Hub's cache first (`hub_snapshot`), as `from_pretrained` would;
- `weight_files`, `tensor_names`, `tensor_shape`, `check_weights`: the weights, read from the
  file headers only (safetensors headers; a `.bin` mapped from disk with
  `torch.load(weights_only=True)`), or a `CorruptCheckpointError`;
- `loading_errors`: around `from_pretrained`, the same one-line errors for what transformers
  and torch raise on a damaged file; `quiet_loading`: around it, transformers' load report held
  back, for callers that check the loaded keys themselves.

Every command that reads a checkpoint (finetune, fill-mask, attention-map, export-bert,
export-onnx) calls `check_weights` first, so a truncated or half-copied file gives the same
one-line error everywhere instead of a traceback from deep inside safetensors or torch.
The modeling file imports this module, so it imports scratchbert only relatively (the files
travel together as remote code).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import pickle
import re
from pathlib import Path

from .errors import MissingFileError, ScratchBertError, corrupt_weights

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # the unsharded forms, preferred first
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
SAVE_HINT = "pass the folder a model was saved to with save_pretrained"
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")  # "bert-base-uncased", "owner/name"
# What a BERT checkpoint needs of a Hub repository: config, weights, tokenizer; not its TF, Flax or ONNX copies.
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
HUB_FILES = ("config.json", "model.safetensors", SAFETENSORS_INDEX, "model-*.safetensors", *TOKENIZER_FILES)
HUB_BIN_FILES = ("pytorch_model.bin", BIN_INDEX, "pytorch_model-*.bin")  # only where there is no safetensors


@contextlib.contextmanager
def quiet_hub_retries():
    """Inside the block, huggingface_hub's notices of each retry ("... thrown while requesting HEAD
    ...") stay unprinted: the one-line error that follows a failed fetch says it all."""
    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub_logger.setLevel(level)


@contextlib.contextmanager
def quiet_loading():
    """Inside the block, transformers' load report (a table of every unused and new weight) and its
    "Loading weights" progress bar stay unprinted: for callers that check the loaded keys
    themselves (`from_pretrained(..., output_loading_info=True)`) and say what matters in words."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    progress = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if progress:
            hf_logging.enable_progress_bar()


def is_hub_name(name: str) -> bool:
    """Whether `name`, which is no folder here, names a Hub repository rather than a mistyped path:
    "name" or "owner/name", not starting with . / ~, and "owner" no folder here either."""
    return HUB_NAME.fullmatch(name) is not None and not Path(name.split("/")[0]).exists()


@functools.cache
def hub_snapshot(name: str, weights: bool = True) -> Path:
    """The local copy of the Hub repository `name`: its `HUB_FILES` (and `HUB_BIN_FILES` where it has
    no safetensors), or with weights=False its `TOKENIZER_FILES` alone, downloaded once into the
    Hub's cache (HF_HOME), or found there alone when offline (HF_HUB_OFFLINE=1). Once per process."""
    from huggingface_hub import snapshot_download

    try:
        with quiet_hub_retries():
            folder = Path(snapshot_download(name, allow_patterns=list(HUB_FILES if weights else TOKENIZER_FILES)))
            if weights and not any((folder / file).is_file() for file in ("model.safetensors", SAFETENSORS_INDEX)):
                folder = Path(snapshot_download(name, allow_patterns=[*HUB_FILES, *HUB_BIN_FILES]))
    except Exception as err:  # offline, no such repository, gated: one line, as for a missing folder
        first_line = str(err).splitlines()[0] if str(err) else ""
        raise MissingFileError(
            f"no such {'model' if weights else 'tokenizer'} folder: {name}, and fetching it from the Hugging Face Hub "
            f"failed ({type(err).__name__}: {first_line}); without network access, {SAVE_HINT}."
        ) from None
    return folder


def model_folder(model_dir: str | Path) -> Path:
    """`model_dir` as a saved model's folder: it exists and holds a config.json that parses; a Hub name is fetched first."""
    return _folder_and_config(model_dir)[0]


def read_model_config(model_dir: str | Path) -> dict:
    """The saved model's config.json, as a mapping."""
    return _folder_and_config(model_dir)[1]


def _folder_and_config(model_dir: str | Path) -> tuple[Path, dict]:
    folder = Path(model_dir)
    if not folder.exists() and is_hub_name(str(model_dir)):
        folder = hub_snapshot(str(model_dir))
    if not folder.is_dir():
        raise MissingFileError(f"no such model folder: {folder}; {SAVE_HINT}.")
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise MissingFileError(f"no model in {folder}: it has no config.json; {SAVE_HINT}.")
    # A damaged config.json: one line here, not transformers' OSError later.
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ScratchBertError(f"{path} is not valid JSON ({err}): the model's config is damaged; save the model again.") from None
    if not isinstance(config, dict):
        raise ScratchBertError(f"{path} holds a JSON {type(config).__name__}, not a model config; save the model again.")
    return folder, config


def weight_files(model_dir: str | Path) -> list[Path]:
    """The weight files of a saved model: one file, or every shard its index names."""
    folder = model_folder(model_dir)
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
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return [folder / name]
    raise ScratchBertError(f"{folder} has a config.json but no weights (model.safetensors or pytorch_model.bin): save the model again.")


def tensor_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """The name and shape of every tensor in one weight file; the corrupt-weights error if it cannot be read whole.

    A safetensors header records every tensor's byte range, so reading it also proves the
    file is complete (a cut file fails with "incomplete metadata"). A `.bin` is a zip whose
    directory sits at its end, so a cut one fails to open.
    """
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as weights:
                return {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
        import torch

        try:  # mapped from disk: the tensors are not read
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as err:
            if "mmap can only be used" not in str(err):
                raise
            # The legacy (pre-zip) format cannot be mapped: read it whole, as from_pretrained will.
            state = torch.load(path, map_location="cpu", weights_only=True)
        return {name: tuple(tensor.shape) for name, tensor in state.items()}
    except Exception as err:  # safetensors, zip and unpickling errors have no common base class
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise corrupt_weights(path, reason) from None


def tensor_names(path: str | Path) -> list[str]:
    """The tensor names in one weight file (see `tensor_shapes`)."""
    return list(tensor_shapes(path))


def tensor_shape(model_dir: str | Path, name: str) -> tuple[int, ...] | None:
    """The shape of the saved model's tensor `name`, or None if it has none of that name."""
    for path in weight_files(model_dir):
        shapes = tensor_shapes(path)
        if name in shapes:
            return shapes[name]
    return None


def check_weights(model_dir: str | Path) -> list[str]:
    """Check that every weight file of the model in `model_dir` reads; return all tensor names."""
    return [name for path in weight_files(model_dir) for name in tensor_names(path)]


def _named_weights(checkpoint: str) -> str:
    """The weights file of a local checkpoint folder, to name in an error (else the folder)."""
    for name in WEIGHT_FILES:
        if os.path.isfile(os.path.join(checkpoint, name)):
            return os.path.join(checkpoint, name)
    return checkpoint


@contextlib.contextmanager
def loading_errors(pretrained_model_name_or_path):
    """Around `PreTrainedModel.from_pretrained`: a missing local folder, a `.bin` holding more than
    tensors, and a damaged weights file become one-line `ScratchBertError`s.

    Other errors keep their own message (e.g. a shape mismatch, which says what to do).
    """
    from safetensors import SafetensorError

    path = str(pretrained_model_name_or_path)
    if path.startswith((os.sep, ".", "~")) and not os.path.isdir(os.path.expanduser(path)):
        raise MissingFileError(f"no such model folder: {path}; {SAVE_HINT}.")
    try:
        yield
    except pickle.UnpicklingError as err:
        raise ScratchBertError(
            f"Refused to load {path}: its .bin weights hold Python objects other than tensors, and scratchbert "
            f"only unpickles tensors (torch.load(weights_only=True)). Re-save it as safetensors. ({err.__class__.__name__})"
        ) from None
    except (SafetensorError, RuntimeError, EOFError) as err:
        # torch reports a cut or damaged .bin as a RuntimeError from its zip reader (PytorchStreamReader).
        if isinstance(err, RuntimeError) and "PytorchStreamReader" not in str(err):
            raise
        raise corrupt_weights(_named_weights(path), f"{err.__class__.__name__}: {err}") from None


__all__ = [
    "CONFIG_FILE",
    "check_weights",
    "hub_snapshot",
    "is_hub_name",
    "quiet_loading",
    "loading_errors",
    "model_folder",
    "quiet_hub_retries",
    "read_model_config",
    "tensor_names",
    "tensor_shape",
    "tensor_shapes",
    "weight_files",
]
