"""The model a pretraining run trains, built from its config: one rule for the run and for its precision trial.

`pretraining_model(config, model_config)`:
  - the packed recipe: `ScratchBertForMaskedLM`, the MLM head alone, with no pooler, so nothing
    untrained is saved and a fine-tuned classifier starts its pooler fresh (as from transformers'
    `run_mlm.py`);
  - with NSP (the paper's recipe): `ScratchBertForPreTraining`, pooler, MLM and NSP heads;
  - with `--objective electra`: `ElectraForPretraining`, a generator and the discriminator that is
    saved, sharing one embeddings module (`electra.py`).
With `--position-init sinusoidal` the position table starts from the Transformer's sines and cosines.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from scratchbert.configuration_scratchbert import ScratchBertConfig
from scratchbert.modeling_scratchbert import ScratchBertForMaskedLM, ScratchBertForPreTraining
from scratchbert.training.config import PretrainConfig
from scratchbert.training.electra import ElectraForPretraining


def pretraining_model(config: PretrainConfig, model_config: ScratchBertConfig, model_class=None) -> nn.Module:
    """A freshly initialised model of `model_config` for a run of `config` (module docstring).

    model_class: a subclass to build instead of the MLM or NSP class (ignored with ELECTRA, whose
    discriminator is always a plain `ScratchBertModel`).
    """
    if config.objective == "electra":
        model = ElectraForPretraining(model_config, config.generator_layers, config.discriminator_weight)
        embeddings = model.discriminator.embeddings  # the generator's too
    else:
        model_class = model_class or (ScratchBertForPreTraining if config.nsp else ScratchBertForMaskedLM)
        model = model_class(model_config)
        embeddings = model.base_model.embeddings
    if config.position_init == "sinusoidal":
        init_positions_sinusoidal(embeddings.position_embeddings, std=model_config.initializer_range)
    return model


@torch.no_grad()
def init_positions_sinusoidal(table: torch.nn.Embedding, std: float) -> None:
    """Start BERT's learned position table from the Transformer's sines and cosines.

    Row p, columns 2i and 2i+1: sin and cos of p / 10000^(2i/H) (Vaswani et al. 2017), scaled
    to amplitude std·√2 so each column has the spread of BERT's N(0, std) start. The table
    stays a learned parameter under the same name; only its starting values change. At the
    start every position is then a rotation of its neighbours (a linear map takes row p to row
    p+k), so attention can look "one to the left" from the first steps, where from N(0, std)
    noise the model has to discover that order first. What that bought and cost when measured
    (docs/pretraining.md, "The second plateau") is why this is `--position-init sinusoidal`,
    not the default.
    """
    rows, width = table.weight.shape
    position = torch.arange(rows, dtype=torch.float32)[:, None]  # (P, 1)
    frequency = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))  # (H/2,)
    angles = position * frequency  # (P, H/2)
    amplitude = std * math.sqrt(2.0)
    table.weight[:, 0::2] = amplitude * torch.sin(angles)
    table.weight[:, 1::2] = amplitude * torch.cos(angles[:, : width // 2])
