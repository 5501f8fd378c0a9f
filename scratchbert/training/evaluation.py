"""Held-out evaluation of a pretraining model: MLM loss, accuracy and perplexity, and NSP accuracy.

The MLM head runs only where a label is (the model's sparse MLM logits: `labelled_tokens`, then
`mlm_logits`), so evaluation costs (N, V) scores instead of (B, S, V).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from accelerate import Accelerator

from scratchbert.bert_padding import labelled_tokens
from scratchbert.modeling_scratchbert import IGNORE_INDEX

EVAL_MLM_PROBABILITY = 0.15  # held-out MLM accuracy is always measured at BERT's masking rate


@torch.no_grad()
def evaluate(model, eval_loader, accelerator: Accelerator) -> dict:
    """MLM loss / accuracy / perplexity, and NSP accuracy when the model has NSP, over the held-out split.

    Each process scores its shard; `gather_for_metrics` collects per-example counts from
    all processes and drops the examples Accelerate repeated to even out the shards.
    """
    model.eval()
    unwrapped = accelerator.unwrap_model(model)
    totals = torch.zeros(5, dtype=torch.float64, device=accelerator.device)
    has_nsp = False
    for batch in eval_loader:
        labels = batch["labels"]
        has_nsp = "next_sentence_label" in batch
        inputs = {name: batch[name] for name in ("input_ids", "attention_mask", "token_type_ids")}
        with accelerator.autocast():
            encoded = unwrapped.base_model(**inputs)
            hidden, targets = labelled_tokens(encoded.last_hidden_state, labels, IGNORE_INDEX)  # (N, H), (N,)
            logits = unwrapped.mlm_logits(hidden, None)[0].float()  # (N, V): in eval mode the head scores what it is given
            nsp_logits = unwrapped.cls.seq_relationship(encoded.pooler_output) if has_nsp else None  # (B, 2)
        per_example = _per_example_counts(labels, logits, targets, nsp_logits, batch.get("next_sentence_label"))
        totals += accelerator.gather_for_metrics(per_example).sum(dim=0)
    model.train()
    loss_sum, n_masked, n_correct, nsp_correct, n_examples = totals.tolist()
    mlm_loss = loss_sum / max(n_masked, 1.0)
    metrics = {
        "mlm_loss": mlm_loss,
        "mlm_accuracy": n_correct / max(n_masked, 1.0),
        "perplexity": math.exp(min(mlm_loss, 50.0)),
        "eval_examples": int(n_examples),
        "eval_masked_tokens": int(n_masked),
    }
    if has_nsp:
        metrics["nsp_accuracy"] = nsp_correct / max(n_examples, 1.0)
    return metrics


def _per_example_counts(labels, logits, targets, nsp_logits, nsp_labels) -> torch.Tensor:
    """(B, 5) per example: MLM loss sum, masked tokens, correct tokens, NSP correct, 1 (the example)."""
    masked = labels != IGNORE_INDEX  # (B, S)
    row = torch.nonzero(masked)[:, 0]  # (N,) the example each scored token belongs to, row-major as `targets`
    token_loss = F.cross_entropy(logits, targets, reduction="none")  # (N,)
    hits = (logits.argmax(dim=-1) == targets).double()  # (N,)
    zeros = torch.zeros(labels.shape[0], dtype=torch.float64, device=labels.device)  # (B,)
    nsp_correct = (nsp_logits.argmax(dim=-1) == nsp_labels).double() if nsp_logits is not None else zeros
    columns = [zeros.index_add(0, row, token_loss.double()), masked.sum(dim=1).double(), zeros.index_add(0, row, hits), nsp_correct]
    return torch.stack([*columns, torch.ones_like(zeros)], dim=1)  # (B, 5)


def weight_checksum(model: torch.nn.Module) -> float:
    """A number that differs when any weight differs (to confirm all processes agree)."""
    total = torch.zeros((), dtype=torch.float64)
    for index, parameter in enumerate(model.parameters()):
        total += (parameter.detach().double().cpu().flatten() * (1.0 + 1e-3 * index)).sum()
    return total.item()
