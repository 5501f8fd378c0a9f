"""The one configuration object of scratchbert.

`ScratchBertConfig` holds every size and probability the model needs and is passed whole
to each sub-module. Its field names and defaults are BERT's (bert-base-uncased), so the
`config.json` of any transformers BERT checkpoint loads into it unchanged.
"""

from __future__ import annotations

from transformers import PretrainedConfig
from transformers.activations import ACT2FN

from .errors import ScratchBertError


# Which scratchbert class each transformers Auto class builds. `import scratchbert` registers
# these, and every saved config carries them as `auto_map` (with the code files beside the
# weights), so `AutoModel.from_pretrained(dir, trust_remote_code=True)` works where scratchbert
# is not installed.
AUTO_MAP = {
    "AutoConfig": "configuration_scratchbert.ScratchBertConfig",
    "AutoModel": "modeling_scratchbert.ScratchBertModel",
    "AutoModelForPreTraining": "modeling_scratchbert.ScratchBertForPreTraining",
    "AutoModelForMaskedLM": "modeling_scratchbert.ScratchBertForMaskedLM",
    "AutoModelForNextSentencePrediction": "modeling_scratchbert.ScratchBertForNextSentencePrediction",
    "AutoModelForSequenceClassification": "modeling_scratchbert.ScratchBertForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_scratchbert.ScratchBertForTokenClassification",
    "AutoModelForQuestionAnswering": "modeling_scratchbert.ScratchBertForQuestionAnswering",
    "AutoModelForMultipleChoice": "modeling_scratchbert.ScratchBertForMultipleChoice",
}
# How `ScratchBertForSequenceClassification` (and `...ForMultipleChoice`) make one vector of a text: BERT's pooler on [CLS]
# ("cls", what transformers' BertForSequenceClassification does) or the mean of the last layer
# over the real tokens ("mean", as sentence-transformers and ModernBERT's `classifier_pooling`).
CLASSIFIER_POOLINGS = ("cls", "mean")


class ScratchBertConfig(PretrainedConfig):
    """Configuration of a BERT encoder and its heads.

    Args:
        vocab_size: number of WordPiece tokens (rows of the word-embedding table).
        hidden_size: width `H` of every token vector between layers.
        num_hidden_layers: number of encoder layers `L`.
        num_attention_heads: number of heads `A`; `H` must be divisible by `A`.
        intermediate_size: inner width of the feed-forward block (4H in BERT).
        hidden_act: activation of the feed-forward block ("gelu" in BERT).
        hidden_dropout_prob: dropout after embeddings, attention output and feed-forward.
        attention_probs_dropout_prob: dropout on the attention weights.
        max_position_embeddings: longest sequence the position table can encode.
        type_vocab_size: number of segment (token type) ids; 2 for sentence pairs.
        initializer_range: standard deviation of the normal weight initialisation.
        layer_norm_eps: epsilon of every LayerNorm.
        pad_token_id: id of `[PAD]`; its embedding row gets no gradient.
        classifier_dropout: dropout before classification heads (defaults to
            `hidden_dropout_prob` when None).
        classifier_pooling: what the sequence-classification and multiple-choice heads classify: "cls", BERT's
            pooler on the [CLS] vector, tanh(dense(h_[CLS])); or "mean", the average of the last
            layer over the real (attention-masked) tokens, with no pooler weights. "mean" cannot be
            exported as transformers' BertForSequenceClassification (ONNX export works).
        tie_word_embeddings: share the MLM decoder's weight with the word embeddings.
        cpu_kernels: run the CPU fast path (`cpu_kernels.py`: each matrix multiply on the kernel
            measured fastest here, attention and Q/K/V choices measured per CPU); False keeps
            the modules exactly as `modeling_scratchbert.py` writes them (reading, exact parity).
            Outputs agree to floating-point rounding either way; not a property of the weights.
        padding_free: on the CPU, run the layers on a padded batch's real tokens only (`bert_padding.py`;
            zeros at padding); False computes every padded position too, as BertModel does.
        sparse_prediction: in training with labels, run the MLM head at the N labelled positions only:
            logits (N, V), the same loss, a fraction of the cost. For loops that read only the loss
            (scratchbert's pretraining sets it); off, every mode returns BertForMaskedLM's (B, S, V).
    """

    model_type = "scratchbert"

    def __init__(
        self,
        vocab_size: int = 30522,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        max_position_embeddings: int = 512,
        type_vocab_size: int = 2,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-12,
        pad_token_id: int = 0,
        classifier_dropout: float | None = None,
        classifier_pooling: str = "cls",
        tie_word_embeddings: bool = True,
        cpu_kernels: bool = True,
        padding_free: bool = True,
        sparse_prediction: bool = False,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.classifier_dropout = classifier_dropout
        self.classifier_pooling = classifier_pooling
        self.cpu_kernels = cpu_kernels
        self.padding_free = padding_free
        self.sparse_prediction = sparse_prediction
        # Keys of a transformers BERT config.json that describe decoder use (BERT as a
        # causal LM, cross-attention) or a KV cache. scratchbert is an encoder only, so
        # they are accepted for compatibility and dropped rather than stored unused.
        for key in ("use_cache", "position_embedding_type", "is_decoder", "add_cross_attention"):
            value = kwargs.pop(key, None)
            if key == "is_decoder" and value:
                raise ScratchBertError("is_decoder=True: scratchbert implements the BERT encoder only; use transformers' BertLMHeadModel for a decoder.")
            if key == "add_cross_attention" and value:
                raise ScratchBertError("add_cross_attention=True: scratchbert has no cross-attention (BERT is an encoder).")
            if key == "position_embedding_type" and value not in (None, "absolute"):
                raise ScratchBertError(f"position_embedding_type={value!r}: scratchbert implements BERT's absolute positions only.")
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        # The MLM decoder shares the word-embedding matrix, as in BERT.
        super().__init__(pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)
        # Not validated here: like BertConfig, a config may be built and then set field by field.
        # `validate_sizes` runs when a model is built from it (`ScratchBertPreTrainedModel.__init__`).

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs):
        """Read a config.json; a transformers BERT one (model_type "bert", or none as in old files) is ours to read."""
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if config_dict.get("model_type") in (None, "bert"):
            config_dict = {**config_dict, "model_type": cls.model_type}
        return config_dict, kwargs

    @property
    def head_dim(self) -> int:
        """Width `d_k` of one attention head: H / A."""
        return self.hidden_size // self.num_attention_heads

    def validate_sizes(self) -> None:
        """Raise a ValueError naming the bad value and the fix (called when a model is built from this config)."""
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ScratchBertError(f"{name}={value!r}: it must be a positive integer.")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ScratchBertError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}: each head gets hidden_size / num_attention_heads "
                "dimensions, so choose a head count that divides the hidden size (e.g. "
                f"{_divisor_hint(self.hidden_size, self.num_attention_heads)})."
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not 0.0 <= float(value) < 1.0:
                raise ScratchBertError(f"{name}={value!r}: a dropout probability must be in [0, 1).")
        if self.classifier_dropout is not None and not 0.0 <= float(self.classifier_dropout) < 1.0:
            raise ScratchBertError(f"classifier_dropout={self.classifier_dropout!r}: it must be in [0, 1) or None.")
        if self.classifier_pooling not in CLASSIFIER_POOLINGS:
            raise ScratchBertError(
                f"classifier_pooling={self.classifier_pooling!r}: use \"cls\" (BERT's pooler on the [CLS] vector) "
                "or \"mean\" (the average of the last layer over the real tokens)."
            )
        if self.hidden_act not in ACT2FN:
            known = ", ".join(sorted(k for k in ACT2FN if k.startswith(("gelu", "relu", "silu", "tanh"))))
            raise ScratchBertError(f"hidden_act={self.hidden_act!r} is not a known activation; use one of: {known}.")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ScratchBertError(
                f"pad_token_id={self.pad_token_id} is outside the vocabulary (vocab_size={self.vocab_size})."
            )


def _divisor_hint(hidden_size: int, heads: int) -> int:
    """The divisor of `hidden_size` closest to the requested head count."""
    divisors = [d for d in range(1, hidden_size + 1) if hidden_size % d == 0]
    return min(divisors, key=lambda d: abs(d - heads))


__all__ = ["AUTO_MAP", "CLASSIFIER_POOLINGS", "ScratchBertConfig"]
