"""The global batch: what one optimizer step trains on, the same whatever the number of processes.

A run on N processes with `--batch-size B` and `--gradient-accumulation-steps k` takes optimizer
steps of N * B * k examples, and it ends with the weights of one process with batch N * B * k
(to float rounding, and with dropout off: each process draws its own dropout). Three things
make that so, each in its own place:

1. **The same examples in the same order.** `corpus.EpochPermutation` orders an epoch from
   (seed, epoch) alone and hands out whole global batches only (the rest of an epoch's order,
   fewer than one step's examples, is left out, as `drop_last` would). Accelerate deals batch j
   of B examples to process j mod N, so step s trains on examples s*G .. (s+1)*G-1 of the order
   (G = N * B * k) on any N. A stream does the same with `streaming.StreamLoader`.
2. **The same masks.** `masking.SeededCollator` draws each example's masks from (seed, epoch,
   the example's index), not from the batch it lands in.
3. **Every labelled token weighs the same.** Each micro-batch's loss is summed over its labelled
   tokens and divided by the count of the whole global batch (`GlobalCounts`: MLM tokens and NSP
   pairs, each by its own), not averaged per micro-batch: ranks and micro-batches holding
   different numbers of masked tokens then add up to the loss of one big batch. DDP (and FSDP,
   DeepSpeed) average the gradients of the N processes and `accelerator.backward` divides by k,
   so the loss handed to backward is multiplied by N * k (`backward_scale`).

Dropout is the one thing left to each process: its masks are drawn over the shape of the batch
the process holds. With dropout (the paper recipe's 0.1) runs on different N differ as runs of
different dropout draws do.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from accelerate import Accelerator

from scratchbert.errors import ScratchBertError
from scratchbert.modeling_scratchbert import IGNORE_INDEX


def examples_per_step(batch_size: int, gradient_accumulation_steps: int, num_processes: int) -> int:
    """G: the examples one optimizer step trains on, over every process and micro-batch."""
    return batch_size * gradient_accumulation_steps * num_processes


def describe(batch_size: int, gradient_accumulation_steps: int, num_processes: int) -> str:
    """'16 examples (2 processes x --batch-size 8 x --gradient-accumulation-steps 1)', for messages."""
    total = examples_per_step(batch_size, gradient_accumulation_steps, num_processes)
    return (
        f"{total} examples ({num_processes} process(es) x --batch-size {batch_size} x "
        f"--gradient-accumulation-steps {gradient_accumulation_steps})"
    )


def optimizer_steps(batches: Iterable[dict], accumulation: int) -> Iterator[list[dict]]:
    """This process's micro-batches, `accumulation` at a time: one list per optimizer step.

    The loaders hand out whole global batches (module docstring, 1.), so an epoch never ends
    inside a step.
    """
    step: list[dict] = []
    for batch in batches:
        step.append(batch)
        if len(step) == accumulation:
            yield step
            step = []
    if step:
        raise ScratchBertError(
            f"an epoch ended {len(step)} micro-batch(es) into an optimizer step of {accumulation}: the data loader "
            "did not hand out whole global batches (a bug: please report it)"
        )


@dataclass
class GlobalCounts:
    """What one optimizer step's losses are divided by, counted over every process and micro-batch."""

    labelled_tokens: torch.Tensor  # () MLM labels that are not -100
    sentence_pairs: torch.Tensor | None  # () NSP labels, for the paper recipe; None without NSP

    @classmethod
    def of(cls, accelerator: Accelerator, micro_batches: list[dict]) -> GlobalCounts:
        """Count this process's micro-batches, then sum over the processes (one all-reduce per step)."""
        nsp = "next_sentence_label" in micro_batches[0]
        labelled = sum((batch["labels"] != IGNORE_INDEX).sum() for batch in micro_batches)
        pairs = sum(batch["next_sentence_label"].numel() for batch in micro_batches) if nsp else 0
        local = torch.stack([labelled.to(accelerator.device), torch.tensor(pairs, device=accelerator.device)])  # (2,)
        counts = accelerator.reduce(local, reduction="sum") if accelerator.num_processes > 1 else local
        counts = counts.clamp(min=1)  # a step with no labelled token has a loss of 0, not NaN
        return cls(counts[0], counts[1] if nsp else None)

    def loss_kwargs(self) -> dict[str, torch.Tensor]:
        """The model's keyword arguments that divide its summed losses by these counts."""
        kwargs = {"num_items_in_batch": self.labelled_tokens}
        if self.sentence_pairs is not None:
            kwargs["num_sentence_pairs_in_batch"] = self.sentence_pairs
        return kwargs


def backward_scale(accelerator: Accelerator) -> int:
    """N * k: what undoes the gradient averaging over N processes and `backward`'s division by k."""
    return accelerator.num_processes * accelerator.gradient_accumulation_steps
