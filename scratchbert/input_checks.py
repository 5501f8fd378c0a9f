"""Input validation for `ScratchBertModel.forward`: mistakes read as sentences, not torch index errors.

Kept out of the modeling file's reading order: the model calls `check_inputs` once per forward
pass, and `values_checkable` decides where reading a tensor's values costs nothing.
"""

from __future__ import annotations

import torch

from .bert_padding import is_tracing
from .configuration_scratchbert import ScratchBertConfig


def values_checkable(tensor: torch.Tensor | None) -> bool:
    """Whether reading `tensor`'s values costs nothing: a non-empty CPU tensor, run eagerly.

    On a GPU, reading a value makes the host wait for the device (a sync); under a tracer
    (`is_tracing`) it would freeze this batch's values into the recorded graph.
    """
    return tensor is not None and not is_tracing() and tensor.device.type == "cpu" and tensor.numel() > 0


def check_inputs(
    config: ScratchBertConfig,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    position_ids: torch.Tensor | None,
) -> tuple[int, int]:
    """Validate the inputs up front and return (B, S), so mistakes read as sentences, not torch index errors.

    Shapes are always checked (free). The ids' values are checked where that is free too
    (`values_checkable`: CPU tensors, run eagerly); elsewhere an id out of range fails in the
    embedding lookup instead, as it does in transformers.
    """
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
    shape = tuple(input_ids.shape) if input_ids is not None else tuple(inputs_embeds.shape[:-1])
    if len(shape) != 2:
        raise ValueError(f"input_ids must have shape (batch, sequence), got {shape}; add a batch dimension with [None].")
    batch, seq = shape
    if seq > config.max_position_embeddings:
        raise ValueError(
            f"Sequence length {seq} is longer than max_position_embeddings={config.max_position_embeddings}; "
            f"truncate inputs (tokenizer(..., truncation=True, max_length={config.max_position_embeddings}))."
        )
    if values_checkable(input_ids):
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= config.vocab_size:
            raise ValueError(
                f"input_ids contain id {high if high >= config.vocab_size else low}, outside the vocabulary "
                f"[0, {config.vocab_size}); the tokenizer and the model disagree: use the checkpoint's own "
                "tokenizer, or model.resize_token_embeddings(len(tokenizer))."
            )
    if inputs_embeds is not None and inputs_embeds.size(-1) != config.hidden_size:
        raise ValueError(f"inputs_embeds have width {inputs_embeds.size(-1)}, the model's hidden_size is {config.hidden_size}.")
    for name, tensor in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids), ("position_ids", position_ids)):
        if tensor is not None and tuple(tensor.shape) != shape and not (name == "position_ids" and tuple(tensor.shape) == (1, seq)):
            raise ValueError(f"{name} has shape {tuple(tensor.shape)} but input_ids has shape {shape}; they must match.")
    if values_checkable(token_type_ids):
        high = int(token_type_ids.max())
        if high >= config.type_vocab_size or int(token_type_ids.min()) < 0:
            raise ValueError(
                f"token_type_ids contain {high}, but type_vocab_size={config.type_vocab_size} allows ids 0.."
                f"{config.type_vocab_size - 1} (0 for the first segment, 1 for the second)."
            )
    if values_checkable(position_ids) and int(position_ids.max()) >= config.max_position_embeddings:
        raise ValueError(f"position_ids reach {int(position_ids.max())}; max_position_embeddings={config.max_position_embeddings}.")
    return batch, seq
