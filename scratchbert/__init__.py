"""scratchbert: BERT written from scratch, readable line by line, as a Hugging Face model package.

Importing the package registers `model_type="scratchbert"` with transformers' Auto classes,
so `AutoModel.from_pretrained(dir)` (and every `AutoModelFor...` below) builds scratchbert
models from saved checkpoints.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForNextSentencePrediction,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from scratchbert.configuration_scratchbert import ScratchBertConfig
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

__version__ = "0.1.0"

# Auto class -> the scratchbert model it builds for model_type "scratchbert".
AUTO_CLASSES = {
    AutoModel: ScratchBertModel,
    AutoModelForPreTraining: ScratchBertForPreTraining,
    AutoModelForMaskedLM: ScratchBertForMaskedLM,
    AutoModelForNextSentencePrediction: ScratchBertForNextSentencePrediction,
    AutoModelForSequenceClassification: ScratchBertForSequenceClassification,
    AutoModelForTokenClassification: ScratchBertForTokenClassification,
    AutoModelForQuestionAnswering: ScratchBertForQuestionAnswering,
    AutoModelForMultipleChoice: ScratchBertForMultipleChoice,
}

AutoConfig.register(ScratchBertConfig.model_type, ScratchBertConfig, exist_ok=True)
for _auto_class, _model_class in AUTO_CLASSES.items():
    _auto_class.register(ScratchBertConfig, _model_class, exist_ok=True)

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
]
