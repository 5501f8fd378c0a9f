"""BERT, written out by hand, as a Hugging Face `PreTrainedModel`.

The file reads top to bottom in the order data flows through the model:

    token ids -> embeddings -> [ self-attention -> add & norm -> feed-forward -> add & norm ] x L
              -> pooler ([CLS], or the mean of real tokens) -> heads (MLM, NSP, classification, tagging, spans, choices)

Notation used in shape comments:
    B  batch size              S  sequence length (padded)       H  hidden size
    A  attention heads         D  head size, H / A               I  intermediate (feed-forward) size
    V  vocabulary size         C  answer choices (multiple choice)   L  layers

Every sub-module keeps the attribute names of transformers' BERT (`embeddings.word_embeddings`,
`encoder.layer.N.attention.self.query`, `LayerNorm`, `cls.predictions`, ...), so the state dict
of any transformers BERT checkpoint loads here key for key, with no conversion step.

Everything here is plain PyTorch: `self.dense(x)` is an `nn.Linear`. Attention is picked by name
from transformers' registry (`ALL_ATTENTION_FUNCTIONS`: "sdpa", "flash_attention_2/3", "flex_attention",
Hub kernels), as transformers' own BERT does; "eager" is the math written out below. The CPU fast
path lives outside this file: with `config.cpu_kernels` (the default) one named step,
`use_cpu_kernels` (section 11), swaps in `cpu_kernels.py`'s modules (see section 4);
`cpu_kernels=False` keeps the model exactly as written here, for reading and exact parity.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    NextSentencePredictorOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import ModelOutput, TransformersKwargs, can_return_tuple
from transformers.utils.output_capturing import capture_outputs
from typing_extensions import Unpack

from .bert_padding import (
    PackedSequences,
    autocast_dtype,
    default_call_cost,
    is_tracing,
    labelled_tokens,
    pack_sequences,
    packed_attention,
    pad,
    unpad,
)
from .configuration_scratchbert import ScratchBertConfig
from .input_checks import check_inputs, values_checkable
from .weights import loading_errors

IGNORE_INDEX = -100  # label value that contributes no loss, everywhere in scratchbert


# ---------------------------------------------------------------------------------------------
# 1. Embeddings: what each input position *is* before any attention happens.
# ---------------------------------------------------------------------------------------------
class ScratchBertEmbeddings(nn.Module):
    """Token + position + segment embeddings, summed, then LayerNorm and dropout.

    BERT learns all three tables. The word table says which token sits at a position, the
    position table where it sits (attention itself is order-blind), and the token-type table
    which segment (sentence A = 0, sentence B = 1) it belongs to.

    Shapes: input_ids, token_type_ids, position_ids (B, S) -> embeddings (B, S, H). Each position
    is embedded on its own, so the padding-free path passes its packed (R,) rows the same way.
    """

    def __init__(self, config: ScratchBertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)  # (B, S, H)
        embeddings = inputs_embeds + self.token_type_embeddings(token_type_ids) + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))


# ---------------------------------------------------------------------------------------------
# 2. The padding mask, built once per forward pass and shared by every layer.
# ---------------------------------------------------------------------------------------------
# What the layers receive as `mask`: the (B, 1, 1, S) additive bias on the padded path, a
# `PackedSequences` on the padding-free path (`bert_padding.py`), or None when nothing is padded.
AttentionMask = torch.Tensor | PackedSequences | None


def additive_attention_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Turn a (B, S) keep-mask of 1s (real token) and 0s (padding) into a (B, 1, 1, S) bias.

    The bias is 0 where a key may be attended and the most negative finite number of `dtype`
    where it is padding, so after softmax a padded key gets (numerically) zero weight. A finite
    minimum rather than -inf keeps a fully padded row finite: its softmax is uniform, not NaN.
    """
    keep = attention_mask[:, None, None, :].to(dtype)  # (B, 1, 1, S): broadcasts over heads and queries
    return (1.0 - keep) * torch.finfo(dtype).min


# ---------------------------------------------------------------------------------------------
# 3. Scaled dot-product attention, written out, beside the registry's fused kernels.
# ---------------------------------------------------------------------------------------------
def eager_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
    scaling: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T / sqrt(D) + mask) V, step by step.

    Shapes: query, key, value (B, A, S, D); mask (B, 1, 1, S) additive or None.
    Returns the context (B, A, S, D) and the attention probabilities (B, A, S, S).
    """
    scaling = query.size(-1) ** -0.5 if scaling is None else scaling
    scores = query @ key.transpose(-1, -2)  # (B, A, S, S): how well each query matches each key
    scores = scores * scaling  # divide by sqrt(D): keeps the logits' variance ~1 whatever D is
    if mask is not None:
        scores = scores + mask  # padded keys -> most negative number
    probs = scores.softmax(dim=-1)  # each query's weights over keys sum to 1
    context = F.dropout(probs, p=dropout_p) @ value  # (B, A, S, D): weighted sum of values
    return context, probs


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`eager_attention` in the calling convention of transformers' attention registry.

    Every entry of `ALL_ATTENTION_FUNCTIONS` ("sdpa": `F.scaled_dot_product_attention`, fused, no
    S x S tensor kept; flash attention; flex attention; Hub kernels) takes these arguments and
    returns the context as (B, S, A, D), heads last, with the probabilities or None.
    """
    context, probs = eager_attention(query, key, value, attention_mask, dropout, scaling)  # (B, A, S, D)
    return context.transpose(1, 2), probs  # (B, S, A, D)


# The implementations whose mask is the additive (B, 1, 1, S) bias built here, and which the
# padding-free path runs (`bert_padding.packed_attention`). Flash, flex and kernel attention get
# the mask transformers builds for them (`create_bidirectional_mask`), on the padded layout.
ADDITIVE_MASK_IMPLEMENTATIONS = ("eager", "sdpa")


# ---------------------------------------------------------------------------------------------
# 4. Multi-head self-attention: A heads, each attending in its own D-dimensional subspace.
# ---------------------------------------------------------------------------------------------
# Where the kernels come from: with `config.cpu_kernels` (the default) the built model's `use_cpu_kernels`
# (section 11) swaps every `nn.Linear` below for `cpu_gemm.MeasuredLinear` (each product on the kernel
# measured fastest on this CPU) and the self-attention, feed-forward and add & norm modules for
# `cpu_kernels.py`'s subclasses: the same parameters, outputs equal to rounding; `print(model)` names them.
class ScratchBertSelfAttention(nn.Module):
    """Project to queries, keys and values, split into heads, attend, merge the heads back.

    Shapes: hidden_states (B, S, H), mask (B, 1, 1, S) -> context (B, S, H),
    and attention probabilities (B, A, S, S) when asked for (else None). On the padding-free
    path (see `bert_padding.py`) hidden_states are the batch's packed rows, (R, H): its real
    tokens grouped by length, and `mask` is a `PackedSequences` saying where each sequence lies.
    """

    def __init__(self, config: ScratchBertConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads  # D
        self.scaling = self.head_dim**-0.5
        self.is_causal = False  # every token sees every other: read by the registry's functions
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def project(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values: three linear maps of the same input, (..., H) -> 3 x (..., H)."""
        return self.query(hidden_states), self.key(hidden_states), self.value(hidden_states)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """Give each head its own D-wide slice of the projection: (B, S, H) -> (B, A, S, D)."""
        batch, seq, _ = x.shape
        x = x.view(batch, seq, self.num_heads, self.head_dim)  # (B, S, A, D)
        return x.transpose(1, 2)  # (B, A, S, D)

    def attention_function(self, output_attentions: bool) -> Callable:
        """The registry's function for `config._attn_implementation`, as transformers' BERT picks it.

        "eager" is `eager_attention_forward` above. The fused kernels cannot return probabilities,
        so a call that asks for them runs the written-out math whatever the implementation.
        """
        if output_attentions:
            return eager_attention_forward
        return ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)

    def forward(
        self, hidden_states: torch.Tensor, mask: AttentionMask, **kwargs: Unpack[TransformersKwargs]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attend = self.attention_function(bool(kwargs.get("output_attentions")))
        dropout = self.dropout_p if self.training else 0.0
        query, key, value = self.project(hidden_states)  # 3 x (B, S, H), or 3 x (R, H) packed
        if isinstance(mask, PackedSequences):  # padding-free path: (R, H) in, (R, H) out
            return packed_attention(self, query, key, value, mask, attend, dropout), None

        query, key, value = self.split_heads(query), self.split_heads(key), self.split_heads(value)  # (B, A, S, D)
        context, probs = attend(self, query, key, value, mask, scaling=self.scaling, dropout=dropout, **kwargs)  # (B, S, A, D)
        batch, seq = context.shape[:2]
        return context.reshape(batch, seq, self.num_heads * self.head_dim), probs  # (B, S, H)


# ---------------------------------------------------------------------------------------------
# 5. Add & norm: project, dropout, add the residual, LayerNorm (BERT is post-LN).
# ---------------------------------------------------------------------------------------------
class ScratchBertAddNorm(nn.Module):
    """LayerNorm(residual + dropout(dense(x))): closes both the attention and the feed-forward block.

    Shapes: x (B, S, in_features), residual (B, S, H) -> (B, S, H). Used twice per layer, as
    `attention.output` (in_features = H) and `output` (in_features = I), the names BERT's
    checkpoints use for these two places.
    """

    def __init__(self, config: ScratchBertConfig, in_features: int):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dropout(self.dense(x)))


class ScratchBertAttention(nn.Module):
    """Multi-head self-attention followed by its add & norm. (B, S, H) -> (B, S, H)."""

    def __init__(self, config: ScratchBertConfig):
        super().__init__()
        self.self = ScratchBertSelfAttention(config)
        self.output = ScratchBertAddNorm(config, config.hidden_size)

    def forward(
        self, hidden_states: torch.Tensor, mask: AttentionMask, **kwargs: Unpack[TransformersKwargs]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        context, probs = self.self(hidden_states, mask, **kwargs)
        return self.output(context, hidden_states), probs


# ---------------------------------------------------------------------------------------------
# 6. Position-wise feed-forward: the same two-layer MLP applied to every token on its own.
# ---------------------------------------------------------------------------------------------
class ScratchBertIntermediate(nn.Module):
    """First half of the feed-forward block: expand H -> I and apply GELU. (B, S, H) -> (B, S, I)."""

    def __init__(self, config: ScratchBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden_states))


# ---------------------------------------------------------------------------------------------
# 7. One encoder layer, and the stack of L of them.
# ---------------------------------------------------------------------------------------------
class ScratchBertLayer(GradientCheckpointingLayer):
    """attention -> add & norm -> feed-forward (H -> I -> H) -> add & norm. (B, S, H) -> (B, S, H).

    `GradientCheckpointingLayer` is transformers' hook for activation checkpointing: after
    `model.activation_checkpointing_enable()` a layer in training stores only its input and
    recomputes the rest in the backward pass. The hidden states stay positional for that reason.
    """

    def __init__(self, config: ScratchBertConfig):
        super().__init__()
        self.attention = ScratchBertAttention(config)
        self.intermediate = ScratchBertIntermediate(config)
        self.output = ScratchBertAddNorm(config, config.intermediate_size)  # second half of the feed-forward

    def forward(
        self, hidden_states: torch.Tensor, mask: AttentionMask, **kwargs: Unpack[TransformersKwargs]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, probs = self.attention(hidden_states, mask, **kwargs)
        return self.output(self.intermediate(attended), attended), probs


class ScratchBertEncoder(nn.Module):
    """L identical layers applied in turn. (B, S, H) -> (B, S, H), or packed (R, H) -> (R, H)."""

    def __init__(self, config: ScratchBertConfig):
        super().__init__()
        self.layer = nn.ModuleList(ScratchBertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, hidden_states: torch.Tensor, mask: AttentionMask, **kwargs: Unpack[TransformersKwargs]) -> torch.Tensor:
        for layer in self.layer:
            hidden_states, _ = layer(hidden_states, mask, **kwargs)  # probs reach the output through `capture_outputs`' hooks
        return hidden_states


# ---------------------------------------------------------------------------------------------
# 8. Pooler: one vector for the whole input, from the [CLS] position (or the mean of the tokens).
# ---------------------------------------------------------------------------------------------
class ScratchBertPooler(nn.Module):
    """tanh(dense(h_[CLS])): the sequence summary that NSP and sentence classifiers read. (B, S, H) -> (B, H)."""

    def __init__(self, config: ScratchBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden_states[:, 0]))  # [CLS] is always position 0


def mean_pooling(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The average token vector of each sequence over its real tokens: (B, S, H), mask (B, S) -> (B, H).

    The other sequence summary (`config.classifier_pooling = "mean"`): it needs no trained weights,
    and every token's gradient reaches the encoder. Padded positions hold zeros on the
    padding-free path and vectors on the padded one (and in exported graphs); the mask weighs
    them out either way.
    """
    if attention_mask is None:
        return hidden_states.mean(dim=1)  # every token real
    weights = attention_mask.to(hidden_states.dtype).unsqueeze(-1)  # (B, S, 1)
    return (hidden_states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)  # (B, H); a fully padded row gives 0


# ---------------------------------------------------------------------------------------------
# 9. Pretraining heads: masked-language-model (MLM) and next-sentence prediction (NSP).
# ---------------------------------------------------------------------------------------------
class ScratchBertPredictionHeadTransform(nn.Module):
    """dense -> GELU -> LayerNorm on each token before the vocabulary projection. (..., H) -> (..., H)."""

    def __init__(self, config: ScratchBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden_states)))


class ScratchBertLMPredictionHead(nn.Module):
    """Scores over the vocabulary for each token: transform, then the decoder. (..., H) -> (..., V).

    The decoder's weight *is* the word-embedding table (tied through `_tied_weights_keys`): the
    same vector represents a token going in and is matched against coming out. Only the
    output bias is the head's own.
    """

    def __init__(self, config: ScratchBertConfig):
        super().__init__()
        self.transform = ScratchBertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))  # tied to decoder.bias, BERT's checkpoint name

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden_states))


class ScratchBertPreTrainingHeads(nn.Module):
    """The pretraining heads under the checkpoint name `cls`: MLM (`predictions`) and/or NSP (`seq_relationship`).

    `ForPreTraining` has both, `ForMaskedLM` only the MLM head, `ForNextSentencePrediction`
    only the NSP head (a linear layer over the pooled [CLS] vector: IsNext = 0, NotNext = 1).
    """

    def __init__(self, config: ScratchBertConfig, mlm: bool = True, nsp: bool = True):
        super().__init__()
        if mlm:
            self.predictions = ScratchBertLMPredictionHead(config)
        if nsp:
            self.seq_relationship = nn.Linear(config.hidden_size, 2)


# ---------------------------------------------------------------------------------------------
# 10. Losses shared by the heads.
# ---------------------------------------------------------------------------------------------
def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None):
    """Cross-entropy over the last dimension, ignoring labels equal to -100.

    With `num_items_in_batch` (the labelled count of the whole accumulated batch, which
    `Trainer` passes under gradient accumulation) the per-token losses are summed and divided
    by it, so k micro-batches add up to exactly the loss of one big batch. Without it: the mean.
    Shapes: logits (..., K), labels (...) -> scalar.
    """
    logits = logits.reshape(-1, logits.size(-1)).float()  # (N, K); fp32 for a stable log-softmax
    labels = labels.reshape(-1).to(logits.device)  # (N,)
    if num_items_in_batch is None:
        return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)
    total = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def sequence_classification_loss(logits: torch.Tensor, labels: torch.Tensor, config: ScratchBertConfig) -> torch.Tensor:
    """Regression (MSE), single-label (cross-entropy) or multi-label (BCE) loss, by `config.problem_type`.

    When `problem_type` is unset it is inferred once, as transformers does: one label means
    regression, integer labels single-label, float labels multi-label.
    Shapes: logits (B, num_labels); labels (B,) or (B, num_labels).
    """
    if config.problem_type is None:
        if config.num_labels == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    if config.problem_type == "regression":
        if config.num_labels == 1:
            logits, labels = logits.squeeze(-1), labels.reshape(-1)  # (B,) each
        return F.mse_loss(logits.float(), labels.float())
    if config.problem_type == "single_label_classification":
        return cross_entropy(logits, labels)
    if config.problem_type == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
    raise ValueError(
        f"problem_type={config.problem_type!r} is unknown; use 'regression', 'single_label_classification' "
        "or 'multi_label_classification'."
    )


# ---------------------------------------------------------------------------------------------
# 11. The Hugging Face base class: configuration, weight initialisation, loading rules.
# ---------------------------------------------------------------------------------------------
class ScratchBertPreTrainedModel(PreTrainedModel):
    """Shared plumbing of every scratchbert model: `from_pretrained`, `save_pretrained`, initialisation.

    `base_model_prefix = "bert"` is what lets a head model load a bare encoder checkpoint (and a
    bare encoder load a head checkpoint): transformers adds or strips that prefix on the keys.
    """

    config_class = ScratchBertConfig
    base_model_prefix = "bert"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True  # through `ScratchBertLayer`, a `GradientCheckpointingLayer`
    # Attention goes through transformers' registry with its calling convention and mask builder,
    # and every forward passes its keyword arguments down to the attention call, as BertModel does.
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    # What `capture_outputs` records with forward hooks: each layer's output (after the embeddings,
    # the first layer's input) as hidden_states, each self-attention's probabilities as attentions.
    _can_record_outputs = {"hidden_states": ScratchBertLayer, "attentions": ScratchBertSelfAttention}
    _no_split_modules = ["ScratchBertEmbeddings", "ScratchBertLayer"]  # device_map="auto" keeps each whole
    # Older transformers versions saved the position-id buffer; scratchbert computes positions.
    _keys_to_ignore_on_load_unexpected = [r"embeddings\.position_ids"]

    def __init__(self, config: ScratchBertConfig, *inputs, part_of_task_model: bool = False, **kwargs):
        # A config may be built field by field (as BertConfig may); its sizes must add up once a model is
        # built. The whole model checks them once (and swaps kernels once): its encoder is `part_of_task_model`.
        if not part_of_task_model:
            config.validate_sizes()
        super().__init__(config, *inputs, **kwargs)
        self.part_of_task_model = part_of_task_model

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, with missing and corrupt checkpoints reported plainly.

        Weights load from safetensors when present, else from `.bin` through
        `torch.load(weights_only=True)`: a pickle holding anything but tensors is refused.
        """
        with loading_errors(pretrained_model_name_or_path):  # one-line errors: scratchbert.weights
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    def post_init(self) -> None:
        """transformers' end-of-`__init__` step (initialisation, tying); then, the whole model built, `use_cpu_kernels` if configured."""
        super().post_init()
        if self.config.cpu_kernels and not self.part_of_task_model:
            self.use_cpu_kernels()

    def use_cpu_kernels(self, enabled: bool = True) -> "ScratchBertPreTrainedModel":
        """Swap the CPU fast path in (`enabled`) or out, in place; returns the model.

        In: every `nn.Linear` becomes a `cpu_gemm.MeasuredLinear` and the other modules their
        `cpu_kernels.FAST_MODULES` subclass (the same parameters and state dict, outputs equal to
        rounding; off the CPU, under a tracer or for small products they run torch's own calls).
        Out: the modules are again the plain ones this file defines. Saved as `config.cpu_kernels`.
        """
        from .cpu_kernels import use_cpu_kernels  # the fast path lives outside the model's reading path

        use_cpu_kernels(self, enabled)
        self.config.cpu_kernels = enabled
        return self

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """BERT's initialisation: N(0, initializer_range) weights, zero biases, LayerNorm at identity.

        The `transformers.initialization` helpers skip tensors already loaded from a checkpoint,
        which is why every model ends its `__init__` with `post_init()`.
        """
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            # A slice loses the "already loaded" flag, so check it before zeroing the [PAD] row.
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, ScratchBertLMPredictionHead):
            init.zeros_(module.bias)


# ---------------------------------------------------------------------------------------------
# 12. The bare encoder.
# ---------------------------------------------------------------------------------------------
class ScratchBertModel(ScratchBertPreTrainedModel):
    """The BERT encoder: embeddings, L layers, and (optionally) the pooler.

    Shapes: input_ids, attention_mask, token_type_ids (B, S) ->
    last_hidden_state (B, S, H), pooler_output (B, H),
    hidden_states L + 1 x (B, S, H) and attentions L x (B, A, S, S) when asked for.

    When a batch on the CPU has padding, the layers run on its real tokens only (`bert_padding.py`):
    the outputs at real positions are the padded computation's, and padded positions hold
    zeros. On other devices the padded path runs (planning the packed layout reads the mask's
    values, which would make the host wait for the device on every call). A call with
    output_attentions or output_hidden_states, with `config.padding_free = False`, or with an attention
    implementation other than "eager" and "sdpa" takes the padded path, which also computes a
    (meaningless) vector at every padded position, as BertModel does.

    Compiled, exported or traced (torch.compile, torch.export, torch.jit.trace, ONNX export;
    `bert_padding.is_tracing`), every call takes the padded path, whatever `config.padding_free` says:
    the packed layout and the all-real shortcut are decided from the mask's values on the host,
    and a recorded graph would replay this batch's decisions on every other batch. The padded
    graph holds no such decision, so one graph (compiled with dynamic shapes) serves every batch
    size and length; its padded positions hold vectors, not zeros, as with `config.padding_free = False`.
    """

    def __init__(self, config: ScratchBertConfig, add_pooling_layer: bool = True, part_of_task_model: bool = False):
        super().__init__(config, part_of_task_model=part_of_task_model)
        self.embeddings = ScratchBertEmbeddings(config)
        self.encoder = ScratchBertEncoder(config)
        self.pooler = ScratchBertPooler(config) if add_pooling_layer else None
        self.gradient_checkpointing = False  # as BertModel's: set with its layers' by `activation_checkpointing_enable`
        self.attention_call_cost = default_call_cost  # (dtype, device) -> the bucket planner's cost of one attention call
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        """The word-embedding table, (V, H); transformers resizes it in `resize_token_embeddings`."""
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """Replace the word-embedding table with `value`, an `nn.Embedding(V', H)`."""
        self.embeddings.word_embeddings = value

    @capture_outputs
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPooling | tuple:
        """Encode a batch.

        Args:
            input_ids: (B, S) token ids, or `inputs_embeds` (B, S, H) instead.
            attention_mask: (B, S), 1 for real tokens and 0 for padding (default: all real).
            token_type_ids: (B, S), 0 for segment A, 1 for segment B (default: all 0).
            position_ids: (B, S) or (1, S) (default: 0 .. S-1).
            output_attentions / output_hidden_states (keywords, taken by `@capture_outputs`,
                transformers' decorator, as in BertModel): also return every layer's attention
                probabilities (B, A, S, S) / hidden states (B, S, H); `output_hidden_states` may
                also select layers by index (`[0, 2]` returns `(h0, None, h2)`).
            return_dict (keyword, taken by `@capture_outputs`): False returns a plain tuple.
        Returns:
            `BaseModelOutputWithPooling`: last_hidden_state (B, S, H), pooler_output (B, H).
        """
        batch, seq = check_inputs(self.config, input_ids, inputs_embeds, attention_mask, token_type_ids, position_ids)
        device = input_ids.device if input_ids is not None else inputs_embeds.device
        # The attention functions see the caller's positions, as BertModel passes them: flash attention
        # reads sequence starts from them in a flattened batch (`DataCollatorWithFlattening`).
        kwargs["position_ids"] = position_ids
        # Defaults: one segment (all 0s), positions 0..S-1, every token real.
        if token_type_ids is None:
            token_type_ids = torch.zeros(batch, seq, dtype=torch.long, device=device)
        if position_ids is None:
            position_ids = torch.arange(seq, device=device)[None, :]  # (1, S): broadcasts over the batch

        packed = self.plan_packing(attention_mask, self.score_dtype(device, inputs_embeds), recording(self.config, kwargs))
        if packed is not None:
            sequence_output = self.encode_packed(packed, input_ids, token_type_ids, position_ids, inputs_embeds)
        else:
            hidden_states = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)  # (B, S, H)
            mask = self.padded_mask(attention_mask, hidden_states)
            kwargs.setdefault("output_attentions", self.config.output_attentions)  # the layers pick eager to return them
            sequence_output = self.encoder(hidden_states, mask, **kwargs)  # (B, S, H)
        pooled_output = self.pooler(sequence_output) if self.pooler is not None else None
        return BaseModelOutputWithPooling(last_hidden_state=sequence_output, pooler_output=pooled_output)

    def score_dtype(self, device: torch.device, inputs_embeds: torch.Tensor | None) -> torch.dtype:
        """The dtype the attention scores will have: autocast's, else the embeddings' (bf16/fp16 masks for bf16/fp16 models)."""
        return autocast_dtype(device) or (inputs_embeds if inputs_embeds is not None else self.embeddings.word_embeddings.weight).dtype

    def plan_packing(self, attention_mask: torch.Tensor | None, dtype: torch.dtype, recording: bool) -> PackedSequences | None:
        """The padding-free layout of this batch (`bert_padding.pack_sequences`), or None for the padded path.

        Packed: a CPU batch run eagerly (`values_checkable`: reading the mask's values is free
        only there; on a GPU each read makes the host wait, a tracer would freeze this batch's
        answers into its graph), with padding, attention "eager" or "sdpa", `config.padding_free` on,
        and no hidden states or attentions recorded: those are the padded layout's, as BertModel's.
        """
        if attention_mask is None or recording or not self.config.padding_free:
            return None
        if self.config._attn_implementation not in ADDITIVE_MASK_IMPLEMENTATIONS or not values_checkable(attention_mask):
            return None
        if bool(attention_mask.all()):
            return None
        call_cost = self.attention_call_cost(dtype, attention_mask.device)
        return pack_sequences(attention_mask, self.config, lambda keep: additive_attention_mask(keep, dtype), call_cost)

    def padded_mask(self, attention_mask: torch.Tensor | None, embeddings: torch.Tensor) -> torch.Tensor | None:
        """The mask of the padded path: None when nothing is padded, else what the implementation takes.

        "eager" and "sdpa" get the additive (B, 1, 1, S) bias built once here (`additive_attention_mask`);
        flash, flex and kernel attention the form transformers builds for each (`create_bidirectional_mask`).
        """
        if attention_mask is None:
            return None
        if self.config._attn_implementation not in ADDITIVE_MASK_IMPLEMENTATIONS:
            return create_bidirectional_mask(self.config, embeddings, attention_mask)
        if values_checkable(attention_mask) and bool(attention_mask.all()):
            return None  # every token real
        return additive_attention_mask(attention_mask, self.score_dtype(embeddings.device, embeddings))  # (B, 1, 1, S)

    def encode_packed(
        self,
        packed: PackedSequences,
        input_ids: torch.Tensor | None,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        inputs_embeds: torch.Tensor | None,
    ) -> torch.Tensor:
        """Embed and encode only the real tokens, then scatter them back: (B, S, H) with zeros at padding."""
        position_ids = position_ids.expand(packed.batch, packed.seq)
        packed_inputs = (None if t is None else unpad(t, packed) for t in (input_ids, token_type_ids, position_ids, inputs_embeds))
        hidden_states = self.embeddings(*packed_inputs)  # (R, H)
        return pad(self.encoder(hidden_states, packed), packed)  # (R, H) -> (B, S, H)


def recording(config: ScratchBertConfig, kwargs: dict) -> bool:
    """Whether this call records hidden states or attentions (`capture_outputs` reads the same keys, the config as default)."""
    return any(bool(kwargs.get(key, getattr(config, key, False))) for key in ("output_hidden_states", "output_attentions"))


# ---------------------------------------------------------------------------------------------
# 13. Task models: the encoder plus one head each. They share the blocks above.
# ---------------------------------------------------------------------------------------------
class EncoderOptions(TypedDict, total=False):
    """What a task model's `forward` passes on to its encoder as it came (see `ScratchBertModel.forward`).

    Each task model names the encoder's inputs and its own labels in `forward`, because `Trainer`
    keeps the dataset columns `forward` names and finds the label columns there. `return_dict`
    is taken by `@can_return_tuple` (transformers' decorator): False, or `config.return_dict = False`,
    returns a plain tuple. The task model itself asks its encoder for `return_dict=True`: it reads
    the encoder's outputs by name, whatever the configuration says.
    """

    output_attentions: bool | None
    output_hidden_states: bool | None


class _MaskedLMMixin:
    """Input/output embedding accessors for models whose decoder is tied to the word embeddings."""

    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def get_output_embeddings(self) -> nn.Linear:
        """The MLM decoder, `nn.Linear(H, V)`, whose weight is tied to the word embeddings."""
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        """Replace the MLM decoder (and its bias, which the checkpoint stores as `cls.predictions.bias`)."""
        self.cls.predictions.decoder = new_embeddings
        self.cls.predictions.bias = new_embeddings.bias

    def mlm_logits(self, sequence_output: torch.Tensor, labels: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """MLM scores, and the labels lined up with them.

        Every position -> logits (B, S, V), labels as given, as BertForMaskedLM. With
        `config.sparse_prediction`, in training with labels (run eagerly: N is read from the labels'
        values, `is_tracing`), the head runs only at the N labelled positions
        (`bert_padding.labelled_tokens`) -> logits (N, V), labels (N,); the loss is the dense one's.
        """
        if self.config.sparse_prediction and self.training and labels is not None and not is_tracing():
            hidden, labels = labelled_tokens(sequence_output, labels, IGNORE_INDEX)  # (N, H), (N,)
        else:
            hidden = sequence_output
        return self.cls.predictions(hidden), labels


@dataclass
class ScratchBertForPreTrainingOutput(ModelOutput):
    """Output of `ScratchBertForPreTraining`.

    loss: MLM loss + NSP loss (when both label sets are given), prediction_logits (B, S, V),
    seq_relationship_logits (B, 2), hidden_states and attentions as in `ScratchBertModel`.
    With `config.sparse_prediction`, in training mode with labels (run eagerly), prediction_logits holds
    only the labelled positions, (N, V), in row-major order (`labels[labels != -100]` are their targets): see `mlm_logits`.
    """

    loss: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None
    seq_relationship_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class ScratchBertForPreTraining(_MaskedLMMixin, ScratchBertPreTrainedModel):
    """BERT as pretrained: masked-language-model and next-sentence-prediction heads together.

    labels (B, S): the original token at masked positions, -100 elsewhere.
    next_sentence_label (B,): 0 if segment B follows segment A in the source text, 1 if random.
    The loss is their sum, as in the BERT paper. Under `Trainer`'s gradient accumulation it
    divides each micro-batch mean by the accumulation steps (`accepts_loss_kwargs = False`),
    as for transformers' own BERT. Given `num_items_in_batch` and `num_sentence_pairs_in_batch`
    (the counts of MLM labels and NSP labels in a whole global batch, which scratchbert's own
    pretraining loop passes: `training/pretraining/optimization.py`), each loss is summed and divided by its count.
    """

    accepts_loss_kwargs = False

    def __init__(self, config: ScratchBertConfig):
        super().__init__(config)
        self.bert = ScratchBertModel(config, part_of_task_model=True)
        self.cls = ScratchBertPreTrainingHeads(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        num_sentence_pairs_in_batch: int | torch.Tensor | None = None,
        **kwargs: Unpack[EncoderOptions],
    ) -> ScratchBertForPreTrainingOutput | tuple:
        """Inputs as in `ScratchBertModel.forward`; labels (B, S) are the original ids at masked
        positions (-100 elsewhere), next_sentence_label (B,) is 0 for IsNext and 1 for NotNext;
        num_items_in_batch / num_sentence_pairs_in_batch: the divisors of the summed MLM / NSP losses."""
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs)
        prediction_logits, mlm_labels = self.mlm_logits(encoded.last_hidden_state, labels)  # (B, S, V) or (N, V)
        seq_relationship_logits = self.cls.seq_relationship(encoded.pooler_output)  # (B, 2)

        loss = None
        if labels is not None and next_sentence_label is not None:
            loss = cross_entropy(prediction_logits, mlm_labels, num_items_in_batch) + cross_entropy(
                seq_relationship_logits, next_sentence_label, num_sentence_pairs_in_batch
            )
        elif labels is not None or next_sentence_label is not None:
            raise ValueError(
                "ScratchBertForPreTraining needs both labels (MLM) and next_sentence_label (NSP) for a loss; "
                "use ScratchBertForMaskedLM or ScratchBertForNextSentencePrediction to train one task alone."
            )
        return ScratchBertForPreTrainingOutput(
            loss=loss,
            prediction_logits=prediction_logits,
            seq_relationship_logits=seq_relationship_logits,
            hidden_states=encoded.hidden_states,
            attentions=encoded.attentions,
        )


class ScratchBertForMaskedLM(_MaskedLMMixin, ScratchBertPreTrainedModel):
    """The MLM head alone (no pooler): fill in `[MASK]` tokens. logits (B, S, V) (see `mlm_logits` for `config.sparse_prediction`).

    Its loss is token-level, so under `Trainer`'s gradient accumulation it normalises by the
    labelled-token count of the whole accumulated batch (`num_items_in_batch`).
    """

    accepts_loss_kwargs = True

    def __init__(self, config: ScratchBertConfig):
        super().__init__(config)
        self.bert = ScratchBertModel(config, add_pooling_layer=False, part_of_task_model=True)
        self.cls = ScratchBertPreTrainingHeads(config, nsp=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs: Unpack[EncoderOptions],
    ) -> MaskedLMOutput | tuple:
        """Inputs as in `ScratchBertModel.forward`; labels (B, S): original ids at masked positions,
        -100 elsewhere; num_items_in_batch: labelled tokens of the whole accumulated batch (Trainer)."""
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs)
        logits, mlm_labels = self.mlm_logits(encoded.last_hidden_state, labels)  # (B, S, V) or (N, V)
        loss = cross_entropy(logits, mlm_labels, num_items_in_batch) if labels is not None else None
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=encoded.hidden_states, attentions=encoded.attentions)


class ScratchBertForNextSentencePrediction(ScratchBertPreTrainedModel):
    """The NSP head alone: does segment B follow segment A? logits (B, 2); label 0 = IsNext, 1 = NotNext."""

    accepts_loss_kwargs = False

    def __init__(self, config: ScratchBertConfig):
        super().__init__(config)
        self.bert = ScratchBertModel(config, part_of_task_model=True)
        self.cls = ScratchBertPreTrainingHeads(config, mlm=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[EncoderOptions],
    ) -> NextSentencePredictorOutput | tuple:
        """Inputs as in `ScratchBertModel.forward`; labels (B,): 0 if B follows A, 1 if B is random."""
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs)
        logits = self.cls.seq_relationship(encoded.pooler_output)  # (B, 2)
        loss = cross_entropy(logits, labels) if labels is not None else None
        return NextSentencePredictorOutput(loss=loss, logits=logits, hidden_states=encoded.hidden_states, attentions=encoded.attentions)


def classifier_dropout(config: ScratchBertConfig) -> nn.Dropout:
    """Dropout in front of a task classifier: `classifier_dropout`, else the hidden dropout."""
    p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    return nn.Dropout(p)


def text_vector(encoded: BaseModelOutputWithPooling, attention_mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """The one vector per text a classifier reads (`config.classifier_pooling`). -> (B, H)

    `"cls"`: BERT's pooled [CLS] vector. `"mean"` (the encoder was built with no pooler):
    `mean_pooling` of the last layer over the real tokens.
    """
    if pooling == "cls":
        return encoded.pooler_output
    return mean_pooling(encoded.last_hidden_state, attention_mask)


class ScratchBertForSequenceClassification(ScratchBertPreTrainedModel):
    """A linear classifier on one vector per text. logits (B, num_labels).

    The vector is BERT's pooled [CLS] vector, or with `config.classifier_pooling = "mean"` the
    mean of the last layer over the real tokens (`mean_pooling`; the encoder then has no pooler).
    Regression, single-label or multi-label by `config.problem_type` (see
    `sequence_classification_loss`). The loss is a per-example mean, so under gradient
    accumulation `Trainer` divides it by the number of steps (`accepts_loss_kwargs = False`).
    """

    accepts_loss_kwargs = False

    def __init__(self, config: ScratchBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = ScratchBertModel(config, add_pooling_layer=config.classifier_pooling == "cls", part_of_task_model=True)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[EncoderOptions],
    ) -> SequenceClassifierOutput | tuple:
        """Inputs as in `ScratchBertModel.forward`; labels (B,) class ids or values, or (B, num_labels) multi-hot."""
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs)
        logits = self.classifier(self.dropout(text_vector(encoded, attention_mask, self.config.classifier_pooling)))  # (B, num_labels)
        loss = sequence_classification_loss(logits, labels, self.config) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=encoded.hidden_states, attentions=encoded.attentions)


class ScratchBertForTokenClassification(ScratchBertPreTrainedModel):
    """A linear classifier on every token (tagging, e.g. named entities). logits (B, S, num_labels).

    Token-level loss: normalised by `num_items_in_batch` under `Trainer`'s gradient accumulation.
    """

    accepts_loss_kwargs = True

    def __init__(self, config: ScratchBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = ScratchBertModel(config, add_pooling_layer=False, part_of_task_model=True)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs: Unpack[EncoderOptions],
    ) -> TokenClassifierOutput | tuple:
        """Inputs as in `ScratchBertModel.forward`; labels (B, S): a class per token, -100 where none
        (padding, special tokens, word continuations); num_items_in_batch as in `ScratchBertForMaskedLM`."""
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs)
        logits = self.classifier(self.dropout(encoded.last_hidden_state))  # (B, S, num_labels)
        loss = cross_entropy(logits, labels, num_items_in_batch) if labels is not None else None
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=encoded.hidden_states, attentions=encoded.attentions)


def _span_targets(positions: torch.Tensor, attention_mask: torch.Tensor | None, seq: int) -> torch.Tensor:
    """Span boundary targets (B,): a position past the end or on padding (the answer was truncated away) is ignored."""
    positions = positions.reshape(-1).clamp(min=0)  # (B,)
    inside = positions < seq
    if attention_mask is not None:
        inside &= attention_mask[torch.arange(len(positions)), positions.clamp(max=seq - 1)].bool()
    return positions.masked_fill(~inside, IGNORE_INDEX)


class ScratchBertForQuestionAnswering(ScratchBertPreTrainedModel):
    """Extractive QA: for every token, a score for starting and for ending the answer span.

    start_logits, end_logits (B, S). The loss averages the cross-entropies of the true start
    and end positions; positions outside the real tokens (answer truncated away) are ignored.
    Padding is never part of the answer: its logits are the dtype's minimum, on either layout. At
    real positions the logits are BertForQuestionAnswering's; its softmax also counts padding.
    """

    accepts_loss_kwargs = False

    def __init__(self, config: ScratchBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = ScratchBertModel(config, add_pooling_layer=False, part_of_task_model=True)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        **kwargs: Unpack[EncoderOptions],
    ) -> QuestionAnsweringModelOutput | tuple:
        """Inputs as in `ScratchBertModel.forward`; start_positions, end_positions (B,): the answer
        span's first and last token; a position >= S or on padding (answer outside the window) is ignored."""
        encoded = self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs)
        logits = self.qa_outputs(encoded.last_hidden_state)  # (B, S, 2)
        if attention_mask is not None:  # the span softmax runs over real positions only
            logits = logits.masked_fill(attention_mask[..., None] == 0, torch.finfo(logits.dtype).min)
        start_logits, end_logits = (t.squeeze(-1).contiguous() for t in logits.split(1, dim=-1))  # (B, S) each

        loss = None
        if start_positions is not None and end_positions is not None:
            seq = start_logits.size(1)
            start_loss = cross_entropy(start_logits, _span_targets(start_positions, attention_mask, seq))
            end_loss = cross_entropy(end_logits, _span_targets(end_positions, attention_mask, seq))
            loss = (start_loss + end_loss) / 2
        return QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=encoded.hidden_states,
            attentions=encoded.attentions,
        )


def _fold_choices(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """Fold the choices into the batch: (B, C, S) -> (B * C, S), or (B, C, S, H) -> (B * C, S, H)."""
    return None if tensor is None else tensor.reshape(-1, *tensor.shape[2:])


class ScratchBertForMultipleChoice(ScratchBertPreTrainedModel):
    """Pick one of C candidate continuations: each (prompt, choice) pair is encoded, scored, softmaxed over C.

    Shapes: input_ids (B, C, S) -> logits (B, C); labels (B,) index the right choice. Each pair is
    scored from its pooled [CLS] vector or, with `config.classifier_pooling = "mean"`, from the mean
    of its real tokens (`text_vector`), as in `ScratchBertForSequenceClassification`.
    """

    accepts_loss_kwargs = False

    def __init__(self, config: ScratchBertConfig):
        super().__init__(config)
        self.bert = ScratchBertModel(config, add_pooling_layer=config.classifier_pooling == "cls", part_of_task_model=True)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[EncoderOptions],
    ) -> MultipleChoiceModelOutput | tuple:
        """Inputs as in `ScratchBertModel.forward` with a choice axis: (B, C, S); labels (B,) the right choice."""
        reference = input_ids if input_ids is not None else inputs_embeds
        if reference is None or reference.dim() < 3:
            raise ValueError("ScratchBertForMultipleChoice takes input_ids of shape (batch, num_choices, sequence).")
        num_choices = reference.size(1)
        folded = [_fold_choices(t) for t in (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)]  # (B * C, S)
        encoded = self.bert(*folded, return_dict=True, **kwargs)
        scores = self.classifier(self.dropout(text_vector(encoded, folded[1], self.config.classifier_pooling)))  # (B * C, 1)
        logits = scores.view(-1, num_choices)  # (B, C)
        loss = cross_entropy(logits, labels) if labels is not None else None
        return MultipleChoiceModelOutput(loss=loss, logits=logits, hidden_states=encoded.hidden_states, attentions=encoded.attentions)


__all__ = [
    "ScratchBertPreTrainedModel",
    "ScratchBertModel",
    "ScratchBertForPreTraining",
    "ScratchBertForMaskedLM",
    "ScratchBertForNextSentencePrediction",
    "ScratchBertForSequenceClassification",
    "ScratchBertForTokenClassification",
    "ScratchBertForQuestionAnswering",
    "ScratchBertForMultipleChoice",
    "ScratchBertForPreTrainingOutput",
]
