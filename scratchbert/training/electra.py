"""ELECTRA's replaced-token detection as a pretraining objective (`scratchbert pretrain --objective electra`).

Clark et al. 2020, "ELECTRA: Pre-training Text Encoders as Discriminators Rather Than Generators".

Masked-language modelling learns only at the positions it masks (15-30% of them): the rest of
each example costs a forward and a backward pass and is never asked about. ELECTRA trains two
encoders side by side and asks about every token:

  generator      a small masked-language model (`ScratchBertForMaskedLM`). It reads the masked
                 input the collator made and predicts the original token at each masked
                 position: ordinary MLM cross-entropy.
  discriminator  the encoder that is kept (`ScratchBertModel`). It reads the original text in
                 which every masked position holds a token *sampled* from the generator's
                 prediction, and says for every token whether it is the original or a
                 replacement: replaced-token detection (RTD), one binary decision per token.

Why this learns more per example: the discriminator's loss covers every real token, not only
the masked ones, and the question is hard in a useful way because the replacements are
plausible ("the cook ate the meal" -> "the chef ate the meal"); telling them apart takes an
understanding of the context. The paper reports BERT's fine-tuning scores reached for a fraction
of the compute. A generator that is too good makes the task unlearnable, so it is kept small:
here it has the discriminator's width and `generator_layers` layers (default a quarter of them,
at least one), the depth-reduced generator that DeBERTa-v3 also uses.

Details that matter, each one line of `__init__` or `forward` below:
  - The generator reads through the discriminator's embeddings module itself (the word,
    position and token-type tables and their LayerNorm), as ELECTRA ties its embeddings, and its
    MLM decoder stays tied to that shared word table: the tables learn from both losses.
  - The sample is not differentiable, and no gradient is sent back through it: the generator
    is trained by its MLM loss alone (not adversarially), as in the paper.
  - A sampled token that equals the original counts as original (target 0): the question is
    "was this token changed?", not "was this position masked?".
  - loss = generator MLM loss + lambda * RTD loss, lambda = `discriminator_weight` (50 in the
    paper): the binary loss is much smaller than a cross-entropy over the vocabulary.
  - Samples come from torch's global random stream, which Accelerate saves in every checkpoint,
    so a resumed run draws the same ones; evaluation passes a `torch.Generator` of its own, so
    it is deterministic and leaves the training stream alone.

What a finished run saves (`output_folder.save_final_model`): the discriminator as a plain
`ScratchBertModel` (the RTD head is dropped, as ELECTRA's fine-tuning drops it) and the
generator as a `ScratchBertForMaskedLM` in `generator/`.

Notation: B batch, S sequence length, H hidden size, V vocabulary, N labelled (masked) positions.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.utils import ModelOutput

from scratchbert.bert_padding import labelled_tokens
from scratchbert.configuration_scratchbert import ScratchBertConfig
from scratchbert.modeling_scratchbert import IGNORE_INDEX, ScratchBertForMaskedLM, ScratchBertModel, cross_entropy

GENERATOR_DIR = "generator"  # where a finished run saves the generator, inside its output folder


class ReplacedTokenDetectionHead(nn.Module):
    """One logit per token, "this token was replaced": dense -> activation -> dense to 1. (B, S, H) -> (B, S).

    The names are those of transformers' `ElectraDiscriminatorPredictions` (`dense`, `dense_prediction`).
    """

    def __init__(self, config: ScratchBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACT2FN[config.hidden_act]
        self.dense_prediction = nn.Linear(config.hidden_size, 1)
        for linear in (self.dense, self.dense_prediction):  # BERT's initialisation, as for every other layer
            nn.init.normal_(linear.weight, mean=0.0, std=config.initializer_range)
            nn.init.zeros_(linear.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(self.activation(self.dense(hidden_states))).squeeze(-1)  # (B, S)


@dataclass
class ElectraPretrainingOutput(ModelOutput):
    """What `ElectraForPretraining.forward` returns.

    loss: generator_loss + discriminator_weight * discriminator_loss (scalar).
    generator_loss: MLM cross-entropy at the labelled positions; generator_logits (N, V) are its
        scores there, in row-major order (`labels[labels != -100]` are their targets).
    corrupted_input_ids (B, S): what the discriminator read, the original text with the samples
        at the labelled positions; replaced (B, S): where that differs from the original.
    discriminator_logits (B, S); discriminator_loss: their binary cross-entropy against
        `replaced` over the real tokens; discriminator_accuracy: the fraction of real tokens
        whose logit has the right sign.
    """

    loss: torch.Tensor | None = None
    generator_loss: torch.Tensor | None = None
    discriminator_loss: torch.Tensor | None = None
    discriminator_accuracy: torch.Tensor | None = None
    generator_logits: torch.Tensor | None = None
    discriminator_logits: torch.Tensor | None = None
    corrupted_input_ids: torch.Tensor | None = None
    replaced: torch.Tensor | None = None


class ElectraForPretraining(nn.Module):
    """A generator and a discriminator trained together on replaced-token detection (module docstring).

    `config` is the discriminator's; the generator's is the same with `generator_layers` layers.
    The training loop calls it like any pretraining model: `model(**batch).loss`, with the
    collator's batch (input_ids masked 80/10/10, labels = the original id at chosen positions).
    """

    def __init__(self, config: ScratchBertConfig, generator_layers: int, discriminator_weight: float):
        super().__init__()
        self.config = config
        self.discriminator_weight = discriminator_weight
        # No pooler: nothing untrained is saved, and a fine-tuned classifier starts its pooler fresh.
        self.discriminator = ScratchBertModel(config, add_pooling_layer=False)
        self.discriminator_head = ReplacedTokenDetectionHead(config)
        generator_config = copy.deepcopy(config)
        generator_config.num_hidden_layers = generator_layers
        self.generator = ScratchBertForMaskedLM(generator_config)
        # The generator's own embeddings (built by its constructor) give way to the discriminator's,
        # and its MLM decoder is tied again, to the now shared word table.
        self.generator.bert.embeddings = self.discriminator.embeddings
        self.generator.cls.predictions.decoder.weight = self.discriminator.embeddings.word_embeddings.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        sampling_generator: torch.Generator | None = None,
    ) -> ElectraPretrainingOutput:
        """input_ids (B, S) as masked by the collator, labels (B, S) the original ids at the masked
        positions and -100 elsewhere. `sampling_generator`: the random stream of the samples
        (default: torch's global one)."""
        if labels is None:
            raise ValueError("ElectraForPretraining needs labels: the original ids at the masked positions, -100 elsewhere.")
        masked = labels != IGNORE_INDEX  # (B, S): the positions the collator chose
        real = attention_mask.bool() if attention_mask is not None else torch.ones_like(masked)  # (B, S)

        # 1. The generator: masked-language modelling, scored only at the N labelled positions.
        inputs = {"attention_mask": attention_mask, "token_type_ids": token_type_ids, "return_dict": True}
        generated = self.generator.bert(input_ids=input_ids, **inputs)  # the masked text
        hidden, targets = labelled_tokens(generated.last_hidden_state, labels, IGNORE_INDEX)  # (N, H), (N,)
        generator_logits = self.generator.cls.predictions(hidden)  # (N, V)
        generator_loss = cross_entropy(generator_logits, targets)

        # 2. Replace each labelled token by a sample from the generator; elsewhere, the original text.
        original = torch.where(masked, labels, input_ids)  # (B, S): undoes the collator's 80/10/10
        corrupted = original.clone()
        corrupted[masked] = sample_tokens(generator_logits, sampling_generator)  # row-major, as `targets`
        replaced = corrupted != original  # (B, S): a sample equal to the original counts as original

        # 3. The discriminator: for every real token, was it replaced?
        encoded = self.discriminator(input_ids=corrupted, **inputs)
        discriminator_logits = self.discriminator_head(encoded.last_hidden_state).float()  # (B, S)
        token_loss = F.binary_cross_entropy_with_logits(discriminator_logits, replaced.float(), reduction="none")  # (B, S)
        discriminator_loss = (token_loss * real).sum() / real.sum()
        correct = (discriminator_logits > 0) == replaced  # (B, S)
        discriminator_accuracy = (correct & real).sum() / real.sum()

        return ElectraPretrainingOutput(
            loss=generator_loss + self.discriminator_weight * discriminator_loss,
            generator_loss=generator_loss,
            discriminator_loss=discriminator_loss,
            discriminator_accuracy=discriminator_accuracy,
            generator_logits=generator_logits,
            discriminator_logits=discriminator_logits,
            corrupted_input_ids=corrupted,
            replaced=replaced,
        )


@torch.no_grad()
def sample_tokens(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row, drawn from softmax(logits) (temperature 1, as in the paper). (N, V) -> (N,).

    Inverse-CDF sampling: one uniform draw per row, located in the row's cumulative distribution.
    It draws from the same distribution as `torch.multinomial`, whose CPU kernel draws an
    exponential variate for each of the N x V entries: that took 46% of a `tiny` ELECTRA step
    (32 x 64 tokens, 30% predicted, a 4,096-token vocabulary; profiled, docs/pretraining.md).
    """
    probabilities = torch.softmax(logits.float(), dim=-1)  # (N, V)
    cumulative = probabilities.cumsum(dim=-1)  # (N, V); float32 rounding moves a token's share by ~1e-5 at most
    total = cumulative[:, -1:]  # (N, 1): 1 up to rounding
    draws = torch.rand(total.shape, generator=generator, device=logits.device) * total  # (N, 1), in [0, total)
    # The first token whose cumulative probability exceeds the draw; a token of probability 0 adds
    # an empty interval, so it is never drawn. The clamp guards a draw rounded up to `total`.
    return torch.searchsorted(cumulative, draws, right=True).squeeze(1).clamp_(max=logits.shape[-1] - 1)  # (N,)


__all__ = ["GENERATOR_DIR", "ElectraForPretraining", "ElectraPretrainingOutput", "ReplacedTokenDetectionHead", "sample_tokens"]
