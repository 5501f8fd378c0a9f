"""scratchbert: BERT written from scratch, readable line by line, as a Hugging Face model package.

Importing the package registers `model_type="scratchbert"` with transformers' Auto classes,
so `AutoModel.from_pretrained(dir)` (and every `AutoModelFor...` below) builds scratchbert
models from saved checkpoints.
"""

import transformers

from scratchbert import modeling_scratchbert
from scratchbert.configuration_scratchbert import AUTO_MAP, ScratchBertConfig
from scratchbert.modeling_scratchbert import (
    ScratchBertForMaskedLM,
    ScratchBertForMultipleChoice,
    ScratchBertForNextSentencePrediction,
    ScratchBertForPreTraining,
    ScratchBertForPreTrainingOutput,
    ScratchBertForQuestionAnswering,
    ScratchBertForSequenceClassification,
    ScratchBertForTokenClassification,
    ScratchBertModel,
    ScratchBertPreTrainedModel,
)
from scratchbert.quantization import quantize_dynamic
from scratchbert.tokenization import ScratchBertTokenizer, tokenizer_from_vocab, train_tokenizer  # registers with AutoTokenizer

__version__ = "0.1.0"


def _register_auto_classes() -> None:
    """Register every entry of AUTO_MAP with transformers, in-process and for saved checkpoints.

    `AutoX.register` makes `AutoX.from_pretrained` build scratchbert classes here;
    `register_for_auto_class` makes `save_pretrained` copy the code files beside the weights.
    """
    transformers.AutoConfig.register(ScratchBertConfig.model_type, ScratchBertConfig, exist_ok=True)
    ScratchBertConfig.register_for_auto_class("AutoConfig")
    for auto_name, target in AUTO_MAP.items():
        if auto_name == "AutoConfig":
            continue
        model_class = getattr(modeling_scratchbert, target.split(".")[-1])
        getattr(transformers, auto_name).register(ScratchBertConfig, model_class, exist_ok=True)
        model_class.register_for_auto_class(auto_name)


_register_auto_classes()

__all__ = [
    "ScratchBertConfig",
    "ScratchBertPreTrainedModel",
    "ScratchBertModel",
    "ScratchBertForPreTraining",
    "ScratchBertForPreTrainingOutput",
    "ScratchBertForMaskedLM",
    "ScratchBertForNextSentencePrediction",
    "ScratchBertForSequenceClassification",
    "ScratchBertForTokenClassification",
    "ScratchBertForQuestionAnswering",
    "ScratchBertForMultipleChoice",
    "ScratchBertTokenizer",
    "tokenizer_from_vocab",
    "train_tokenizer",
    "quantize_dynamic",
]
