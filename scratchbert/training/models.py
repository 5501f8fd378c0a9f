"""The model a pretraining run trains, built from its config: one rule for the run and for its precision trial.

`pretraining_model(config, model_config)`:
  - the packed recipe: `ScratchBertForMaskedLM`, the MLM head alone, with no pooler, so nothing
    untrained is saved and a fine-tuned classifier starts its pooler fresh (as from transformers'
    `run_mlm.py`);
  - with NSP (the paper's recipe): `ScratchBertForPreTraining`, pooler, MLM and NSP heads.
"""

from __future__ import annotations

from torch import nn

from scratchbert.configuration_scratchbert import ScratchBertConfig
from scratchbert.modeling_scratchbert import ScratchBertForMaskedLM, ScratchBertForPreTraining
from scratchbert.training.config import PretrainConfig


def pretraining_model(config: PretrainConfig, model_config: ScratchBertConfig) -> nn.Module:
    """A freshly initialised model of `model_config` for a run of `config` (module docstring)."""
    return (ScratchBertForPreTraining if config.nsp else ScratchBertForMaskedLM)(model_config)
