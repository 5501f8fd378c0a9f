"""Adversarial training on the word embeddings (`finetune --adversarial EPS`).

Miyato et al. (2017, "Adversarial training methods for semi-supervised text classification",
measured on IMDB) add to each step's loss the loss at the word embeddings moved a small step in the
direction that raises it most: the loss's gradient with respect to each example's word embeddings,
scaled to a fixed norm over the example. A classifier trained so cannot lean on the exact vector of
a few words. Miyato et al. fix the norm on normalised embeddings; here it is EPS times the length of
an average word vector (the mean norm of the rows of the embedding table), so that one EPS means the
same nudge to a pretrained table (rows of norm ~2) and to a newly initialised one (~0.2)
(measured: docs/finetuning.md).

1. `adversarial_step`  the gradient of the loss at the embeddings -> the step of a given norm per example
2. `AdversarialLoss`   a `Trainer` mixin: the loss at the embeddings plus the loss at the moved ones
3. `adversarial_trainer(base, eps)`  `base` (`Trainer`, `TextLossTrainer`) with that loss

Shapes: B = examples (windows) in a batch, T = tokens per example (padded), H = hidden size.
(A module of its own, imported when the option is used: importing `Trainer` takes a while.)
"""

from __future__ import annotations

import torch
from transformers import Trainer


def adversarial_step(grad: torch.Tensor, norm: float | torch.Tensor) -> torch.Tensor:
    """(B, T, H) gradient of the loss with respect to the word embeddings -> (B, T, H) step of `norm`
    per example, along the gradient. Padding has no gradient, so it gets no step; an example whose
    gradient is zero gets none either."""
    norms = grad.flatten(1).norm(dim=1)  # (B,)
    return norm * grad / norms.clamp_min(torch.finfo(grad.dtype).tiny)[:, None, None]


def word_vector_length(embed: torch.nn.Embedding) -> torch.Tensor:
    """The length of an average word vector: the mean norm of the embedding table's rows (a scalar)."""
    return embed.weight.detach().float().norm(dim=1).mean()


class AdversarialLoss:
    """Trainer mixin: during training, loss(embeddings) + loss(embeddings + step), the step of norm
    `adversarial_eps` x `word_vector_length` per example (`adversarial_step`) held constant (no
    gradient through it; Goodfellow et al.'s fast gradient method). The model reads `inputs_embeds`:
    the word-embedding lookup happens here, once, and both passes add the position and token-type
    embeddings themselves. Evaluation is the base class's."""

    adversarial_eps: float = 0.0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not model.training or not self.adversarial_eps:
            return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        inputs = dict(inputs)
        embed = self.accelerator.unwrap_model(model).get_input_embeddings()
        embeddings = embed(inputs.pop("input_ids"))  # (B, T, H)
        loss, outputs = super().compute_loss(model, {**inputs, "inputs_embeds": embeddings}, return_outputs=True, num_items_in_batch=num_items_in_batch)
        (grad,) = torch.autograd.grad(loss, embeddings, retain_graph=True)  # (B, T, H); the loss's graph is kept for its backward
        moved = embeddings + adversarial_step(grad.detach(), self.adversarial_eps * word_vector_length(embed)).to(embeddings.dtype)
        adversarial = super().compute_loss(model, {**inputs, "inputs_embeds": moved}, num_items_in_batch=num_items_in_batch)
        loss = loss + adversarial
        return (loss, outputs) if return_outputs else loss


def adversarial_trainer(base: type | None, eps: float) -> type:
    """`base` (a `Trainer` class; None: `Trainer`) whose training loss adds the adversarial one at step `eps`."""
    base = base or Trainer
    return type(f"Adversarial{base.__name__}", (AdversarialLoss, base), {"adversarial_eps": eps})
