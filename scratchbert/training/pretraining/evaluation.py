"""Held-out evaluation of a pretraining model: MLM loss, accuracy and perplexity, and NSP accuracy;
the training curves drawn from a run's log.

The MLM head runs only where a label is (the model's sparse MLM logits: `labelled_tokens`, then
`mlm_logits`), so evaluation costs (N, V) scores instead of (B, S, V).

Next to the model's accuracy stands that of a guess that reads no context,
`context_free_accuracy`: at each scored position, the token shown there when the collator left
one (its 10% "keep"), else the most frequent target. A small model first learns exactly that
guess (the "bag-of-words plateau") and only later to read the words around a mask;
`plateau_report` says when a run ended before that.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.distributed.tensor import DTensor

from scratchbert.bert_padding import labelled_tokens
from scratchbert.modeling_scratchbert import IGNORE_INDEX

EVAL_MLM_PROBABILITY = 0.15  # held-out MLM accuracy is always measured at BERT's masking rate

# The per-example columns that `_per_example_counts` returns, in order.
COUNTS = ("mlm_loss_sum", "masked", "mlm_correct", "nsp_correct", "examples", "shown")


@torch.no_grad()
def evaluate(model, eval_loader, accelerator: Accelerator, mask_token_id: int | None = None) -> dict:
    """MLM loss / accuracy / perplexity, and NSP accuracy when the model has NSP, over the held-out split.

    Each process scores its shard; `gather_for_metrics` collects per-example counts from
    all processes and drops the examples Accelerate repeated to even out the shards.
    `mask_token_id`: where the context-free guess meets [MASK] (without it: wherever the input
    does not show the target, which counts the collator's random tokens too).
    """
    model.eval()
    unwrapped = accelerator.unwrap_model(model)
    totals = torch.zeros(len(COUNTS), dtype=torch.float64, device=accelerator.device)
    masked_targets = torch.zeros(unwrapped.config.vocab_size, dtype=torch.float64, device=accelerator.device)  # (V,) at [MASK]
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
        per_example = _per_example_counts(labels, logits, targets, nsp_logits, batch.get("next_sentence_label"), inputs["input_ids"])
        totals += accelerator.gather_for_metrics(per_example).sum(dim=0)
        shown = inputs["input_ids"][labels != IGNORE_INDEX]  # (N,): what the input holds at each scored position
        at_mask = shown == mask_token_id if mask_token_id is not None else shown != targets  # (N,)
        masked_targets += torch.bincount(targets[at_mask], minlength=masked_targets.numel()).double()
    model.train()
    # Summed over processes: an uneven last batch repeats at most num_processes - 1 examples here
    # (gather_for_metrics drops them from the other figures); the mode it picks does not change.
    masked_targets = accelerator.reduce(masked_targets, reduction="sum")
    total = dict(zip(COUNTS, totals.tolist()))
    n_masked = max(total["masked"], 1.0)
    mlm_loss = total["mlm_loss_sum"] / n_masked
    metrics = {
        "mlm_loss": mlm_loss,
        "mlm_accuracy": total["mlm_correct"] / n_masked,
        "perplexity": math.exp(min(mlm_loss, 50.0)),
        "eval_examples": int(total["examples"]),
        "eval_masked_tokens": int(total["masked"]),
        "context_free_accuracy": (total["shown"] + masked_targets.max().item()) / n_masked,
    }
    if has_nsp:
        metrics["nsp_accuracy"] = total["nsp_correct"] / max(total["examples"], 1.0)
    return metrics


# How far above the context-free guess held-out MLM accuracy must be to count as reading context
# (accuracy points): the plateau runs measured sat within 0.003 of it (docs/pretraining.md).
PLATEAU_MARGIN = 0.02


def plateau_report(metrics: dict) -> str | None:
    """A warning when held-out evaluation says the model has not learned to read context yet, else None.

    Its accuracy is within PLATEAU_MARGIN of `context_free_accuracy`.
    """
    if "context_free_accuracy" not in metrics or metrics["mlm_accuracy"] >= metrics["context_free_accuracy"] + PLATEAU_MARGIN:
        return None
    problem = (
        f"its held-out MLM accuracy {metrics['mlm_accuracy']:.3f} is not clearly above that of a guess from word frequencies alone "
        f"({metrics['context_free_accuracy']:.3f})"
    )
    return (
        f"the model has not yet learned to read context: {problem}. Fine-tuning such a model can score below a "
        "randomly initialised one (docs/pretraining.md). Train longer (--time-budget, --max-steps), or pick a "
        "smaller model (--preset) or vocabulary (--vocab-size), which the same time trains for more steps."
    )


def _per_example_counts(labels, logits, targets, nsp_logits, nsp_labels, input_ids) -> torch.Tensor:
    """(B, len(COUNTS)) per example, the columns of `COUNTS`. `shown`: scored positions whose input is the target itself."""
    masked = labels != IGNORE_INDEX  # (B, S)
    row = torch.nonzero(masked)[:, 0]  # (N,) the example each scored token belongs to, row-major as `targets`
    token_loss = F.cross_entropy(logits, targets, reduction="none")  # (N,)
    hits = (logits.argmax(dim=-1) == targets).double()  # (N,)
    zeros = torch.zeros(labels.shape[0], dtype=torch.float64, device=labels.device)  # (B,)
    nsp_correct = (nsp_logits.argmax(dim=-1) == nsp_labels).double() if nsp_logits is not None else zeros
    columns = [
        zeros.index_add(0, row, token_loss.double()), masked.sum(dim=1).double(), zeros.index_add(0, row, hits), nsp_correct,
        torch.ones_like(zeros), (masked & (input_ids == labels)).sum(dim=1).double(),
    ]  # fmt: skip
    return torch.stack(columns, dim=1)  # (B, len(COUNTS))


def weight_checksum(model: torch.nn.Module) -> float:
    """A number that differs when any weight differs (to confirm all processes agree)."""
    total = torch.zeros((), dtype=torch.float64)
    for index, parameter in enumerate(model.parameters()):
        if isinstance(parameter, DTensor):  # sharded by FSDP2: the whole tensor, gathered
            parameter = parameter.full_tensor()
        total += (parameter.detach().double().cpu().flatten() * (1.0 + 1e-3 * index)).sum()
    return total.item()


def _whole_word(tokens: list[str], i: int) -> bool:
    """tokens[i] is a word of three letters or more that the vocabulary holds whole (no ## piece follows)."""
    return tokens[i].isalpha() and len(tokens[i]) >= 3 and not tokens[i + 1].startswith("##")


def _starts_a_word(tokens: list[str], i: int) -> bool:
    """tokens[i] begins a word: a letter or digit, neither a ## piece nor right after an apostrophe."""
    return tokens[i][:1].isalnum() and not tokens[i].startswith("##") and tokens[i - 1] not in ("'", "’")


def held_out_passages(dataset, tokenizer, count: int = 4, seed: int = 0, context: int = 10) -> list[tuple[str, str]]:
    """`count` passages of held-out text with one whole word hidden: (text with [MASK], the word).

    What `scratchbert pretrain` shows at the end of a run on the user's own corpus: the model's
    guesses on text it never trained on, beside the word that was there. Each passage is
    `context` tokens either side of a word the vocabulary holds whole (alphabetic, three letters
    or more, no ## piece before or after), from one example of `dataset` (token ids, as the
    held-out examples are), with no [CLS] or [SEP] inside. The examples and words are drawn with
    `seed`. Fewer than `count` (or none) when the held-out examples are too short or too few.
    """
    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    passages = []
    # A bounded search (a corpus without such words ends it soon), whatever the held-out set's size.
    for index in rng.sample(range(len(dataset)), min(len(dataset), 50 * count)):
        ids = list(dataset[index]["input_ids"])
        tokens = tokenizer.convert_ids_to_tokens(ids)
        spots = [
            i for i in range(context + 1, len(ids) - context - 1)
            if _whole_word(tokens, i) and not special.intersection(ids[i - context : i + context + 1])
            and _starts_a_word(tokens, i - context)  # not on punctuation, nor on the "t" of "don ' t"
        ]  # fmt: skip
        if not spots:
            continue
        i = rng.choice(spots)
        end = i + context + 1
        while end < len(ids) and tokens[end].startswith("##") and ids[end] not in special:
            end += 1  # do not cut the last word in two
        left, right = (tokenizer.decode(part, clean_up_tokenization_spaces=True) for part in (ids[i - context : i], ids[i + 1 : end]))
        text = f"{left} {tokenizer.mask_token} {right}"  # "doesn't", not "doesn ' t": it tokenizes the same
        passages.append((text, tokens[i]))
        if len(passages) == count:
            break
    return passages


# ---------------------------------------------------------------------------------------------
# Training curves as a PNG, drawn from the run's JSONL log (no display needed).
# ---------------------------------------------------------------------------------------------


def read_log(path: str | Path) -> list[dict]:
    """The records of a `train_log.jsonl` (one JSON object per line)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def plot_training_curves(records: list[dict], path: str | Path, title: str = "scratchbert pretraining") -> Path:
    """Draw training loss and held-out MLM loss / MLM accuracy / NSP accuracy (when trained) against steps.

    `records` are the log's dicts: `{"type": "train", "step", "loss"}` and
    `{"type": "eval", "step", "mlm_loss", "mlm_accuracy", "context_free_accuracy", "nsp_accuracy"}`.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: works on machines without a display
    import matplotlib.pyplot as plt

    train = [r for r in records if r.get("type") == "train"]
    evals = [r for r in records if r.get("type") == "eval"]
    figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(11, 4))
    has_nsp = any("nsp_accuracy" in r for r in evals)
    objective = "MLM + NSP" if has_nsp else "MLM"
    loss_axis.plot([r["step"] for r in train], [r["loss"] for r in train], label=f"train loss ({objective})")
    if evals:
        loss_axis.plot([r["step"] for r in evals], [r["mlm_loss"] for r in evals], "o-", label="held-out MLM loss")
        accuracy_axis.plot([r["step"] for r in evals], [r["mlm_accuracy"] for r in evals], "o-", label="held-out MLM accuracy")
        if "context_free_accuracy" in evals[-1]:  # the bag-of-words plateau: evaluation.py
            accuracy_axis.axhline(evals[-1]["context_free_accuracy"], color="grey", linestyle="--", linewidth=1, label="guess from word frequencies")
    if has_nsp:
        nsp = [r for r in evals if "nsp_accuracy" in r]
        accuracy_axis.plot([r["step"] for r in nsp], [r["nsp_accuracy"] for r in nsp], "s-", label="held-out NSP accuracy")
        accuracy_axis.axhline(0.5, color="grey", linestyle=":", linewidth=1, label="NSP chance")
    loss_axis.set(xlabel="optimizer step", ylabel="loss", title="loss")
    accuracy_axis.set(xlabel="optimizer step", ylabel="accuracy", title="held-out accuracy", ylim=(0, 1))
    figure.suptitle(title)
    return finish_figure(figure, (loss_axis, accuracy_axis), path)


def finish_figure(figure, axes, path: str | Path) -> Path:
    """Grid and legend on every axis, then write the figure as a PNG (creating its folder) and close it."""
    import matplotlib.pyplot as plt

    for axis in axes:
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
