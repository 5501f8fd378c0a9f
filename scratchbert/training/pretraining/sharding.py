"""FSDP2 (`accelerate launch --use_fsdp --fsdp_version 2`): sharding a BERT, and saving it as a plain model folder.

`fully_shard` shards a module in place: its parameters become DTensors holding this process's
slice, gathered whole only while the module computes, and its class is swapped for a generated
subclass (`FSDPScratchBertLayer` for `ScratchBertLayer`). Each call makes one unit: the
parameters it gathers and frees together.

    root unit        the rest: position and type embeddings, their LayerNorm, the pooler, NSP
    layer unit x L   one per ScratchBertLayer
    tied unit        the word embeddings and the whole MLM head (`cls.predictions`)

The tied unit is why scratchbert shards the model itself: accelerate's own FSDP2 preparation
(`fsdp2_prepare_model`) puts the word embeddings and the MLM decoder, which share one weight,
into a unit but leaves the head that holds the decoder's bias (BERT's `cls.predictions.bias`,
the same parameter as `decoder.bias`) to the root unit, and torch refuses a parameter seen by
two units at the first forward. It does so for transformers' BertForMaskedLM as well. A model
that `shard` returned is already an FSDP module, so `accelerator.prepare` keeps its units and
only swaps the optimizer's parameters for the sharded ones, as it does for its own.

`save_pretrained` on a sharded model would write the generated class into `config.json`'s
`auto_map` and copy torch's FSDP source files, not scratchbert's, beside the weights:
`unsharded_copy` is the model to save instead, holding the full weights that
`accelerator.get_state_dict` gathers onto the main process.

tests/test_fsdp2.py runs both on 2 CPU processes (gloo) under accelerate's FSDP2 code.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers import PreTrainedModel

from scratchbert.errors import ScratchBertError


def shard(model: PreTrainedModel, accelerator: Accelerator) -> PreTrainedModel:
    """Shard a scratchbert model in place with FSDP2, in the units above, with the launch's FSDP settings.

    model:       a scratchbert model (any head), not yet sharded and not yet through `prepare`.
    accelerator: an Accelerator of an FSDP2 launch; its plugin gives `reshard_after_forward`,
                 the mixed-precision policy and CPU offload, and its device mesh where one is set.
    Call it before building the optimizer (which then holds the sharded parameters) and before
    `accelerator.prepare`. Returns `model`. Raises a ScratchBertError when the launch is not
    FSDP2, asks for FSDP's activation checkpointing (which would wrap the layers after they were
    sharded), or for a wrap policy other than what `shard` does (`take_over_wrapping`).
    """
    if not accelerator.is_fsdp2:
        raise ScratchBertError(
            f"sharding.shard needs an FSDP2 launch (accelerate launch --use_fsdp --fsdp_version 2); this one is {accelerator.distributed_type}."
        )
    plugin = accelerator.state.fsdp_plugin
    if plugin.activation_checkpointing:
        raise ScratchBertError(
            "--fsdp_activation_checkpointing would wrap the layers after scratchbert sharded them, which this "
            "FSDP2 path does not support: drop the flag."
        )
    take_over_wrapping(plugin, model)
    mesh = getattr(accelerator, "torch_device_mesh", None)  # as accelerate's fsdp2_prepare_model takes it
    settings = {
        "offload_policy": plugin.cpu_offload,
        "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
        "mesh": mesh[tuple(accelerator.parallelism_config.fsdp_dim_names)] if mesh is not None else None,
    }
    for layer in model.base_model.encoder.layer:
        fully_shard(layer, reshard_after_forward=plugin.reshard_after_forward, **settings)
    tied = [model.get_input_embeddings()]
    if getattr(model, "cls", None) is not None and hasattr(model.cls, "predictions"):
        tied.append(model.cls.predictions)  # the decoder (its weight is the word embeddings) and the head's bias
    # Used at the start of the forward and again at its end: kept whole in between, as accelerate keeps its tied unit.
    fully_shard(tied, reshard_after_forward=False, **settings)
    fully_shard(model, **settings)  # the root: torch's default keeps it whole from forward to backward
    return model


def take_over_wrapping(plugin, model: PreTrainedModel) -> None:
    """Accept the launch's `--fsdp_auto_wrap_policy` where it asks for what `shard` does, and clear it.

    TRANSFORMER_BASED_WRAP over the model's own block classes (`_no_split_modules`, the default) is
    what `shard` does; left set, `prepare` would look those classes up by name and not find them
    under their FSDP subclasses. A size-based policy or other classes are refused, not ignored.
    """
    policy = getattr(plugin.auto_wrap_policy, "func", plugin.auto_wrap_policy)
    if policy is None:
        return
    names = set(plugin.transformer_cls_names_to_wrap or model._no_split_modules)
    if policy is not transformer_auto_wrap_policy or not names <= set(model._no_split_modules):
        raise ScratchBertError(
            "scratchbert makes its own FSDP units, one per ScratchBertLayer (scratchbert/training/pretraining/sharding.py): drop "
            "--fsdp_auto_wrap_policy, or use TRANSFORMER_BASED_WRAP with no --fsdp_transformer_layer_cls_to_wrap "
            f"classes but {','.join(sorted(model._no_split_modules))}."
        )
    plugin.auto_wrap_policy = None


def original_class(model: torch.nn.Module) -> type:
    """The class `model` was built as: under `fully_shard`, the one its FSDP subclass was made from."""
    return next(cls for cls in type(model).__mro__ if not issubclass(cls, FSDPModule))


def unsharded_copy(model: PreTrainedModel, full_state_dict: dict[str, torch.Tensor]) -> PreTrainedModel:
    """A model of `model`'s own class and config (the same object) holding `full_state_dict`.

    model:           a model `fully_shard` sharded (or any model: it is then copied as well).
    full_state_dict: every weight of `model`, whole, e.g. `accelerator.get_state_dict(model)`
                     on the main process (which alone receives it under FSDP2).
    Built on the meta device and then handed the gathered tensors, so no second set of weights
    is initialised; the tied MLM decoder is tied again. Raises a RuntimeError when
    `full_state_dict` lacks a weight or holds one the model has not.
    """
    with torch.device("meta"):
        copy = original_class(model)(model.config)
    copy.load_state_dict(full_state_dict, strict=True, assign=True)
    copy.tie_weights()
    return copy
