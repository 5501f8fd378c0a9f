"""One optimizer step: the global batch it trains on, AdamW, and the learning rate's schedule.

What the step loop (`loop.train`) does once per step, in its order: the micro-batches of one
global batch (`optimizer_steps`), the loss divided by the whole step's counts (`GlobalCounts`,
`backward_scale`), AdamW on decayed and undecayed groups (`parameter_groups`, `adamw`), then the
schedule: warmup and linear decay over steps, or over the seconds of a `--time-budget`
(`make_scheduler`, `TimeBudgetSchedule`, on the loop's `TrainingClock`).

The global batch
----------------
A run on N processes with `--batch-size B` and `--gradient-accumulation-steps k` takes optimizer
steps of N * B * k examples, and it ends with the weights of one process with batch N * B * k
(to float rounding, and with dropout off: each process draws its own dropout). Three things
make that so, each in its own place:

1. **The same examples in the same order.** `masking.EpochPermutation` orders an epoch from
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


# ---------------------------------------------------------------------------------------------
# The global batch: what one step trains on, and what its loss is divided by
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# The optimizer and the learning rate's schedule
# ---------------------------------------------------------------------------------------------
def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: decay matrices, but not biases or LayerNorm weights (as in BERT).

    Decay pulls weights towards 0; for a bias or a LayerNorm gain that is a bias
    towards "no offset" / "scale 0", which only hurts.
    """
    no_decay = set()
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            if isinstance(module, torch.nn.LayerNorm) or name == "bias" or name.endswith("bias"):
                no_decay.add(id(parameter))
    decay = [p for p in model.parameters() if p.requires_grad and id(p) not in no_decay]
    keep = [p for p in model.parameters() if p.requires_grad and id(p) in no_decay]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


# Devices with torch's fused AdamW kernel (torch.utils._foreach_utils lists them; that module is private).
FUSED_ADAMW_DEVICES = ("cpu", "cuda", "mps", "xpu")


def adamw(groups: list[dict], device: torch.device, lr: float, betas: tuple[float, float], eps: float) -> torch.optim.AdamW:
    """AdamW on `groups` (`parameter_groups`), on its fused kernel where `device` has one.

    torch's default on a CPU is a loop over the parameters, ~10 small calls each per step; the
    fused kernel updates them all in one call (as `Trainer`'s default `adamw_torch_fused` does).
    On `tiny` (42 tensors, 1.0M parameters) the optimizer step took 4.2 ms in the loop and 0.8 ms
    fused on an Intel Xeon with AMX, 2 threads (4.35 / 0.85 ms under an AVX2 stand-in): the demo's
    whole fp32 training step 5.2% faster (3.3% under the stand-in; docs/pretraining.md). Its
    result differs from the loop's by float rounding only (at most 1e-7 on those weights;
    tests/test_pretrain.py holds it to 1e-6). It writes the weights without bumping their
    `_version`: `cpu_gemm`'s packed copies watch optimizer steps for that reason.
    """
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=device.type in FUSED_ADAMW_DEVICES)


def warmup_then_linear_decay(max_steps: int, warmup_steps: int):
    """Learning-rate multiplier: 0 -> 1 over `warmup_steps`, then 1 -> 0 at `max_steps`."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (max_steps - step) / max(1, max_steps - warmup_steps))

    return factor


class TimeBudgetSchedule:
    """Learning-rate multiplier of a time-budgeted run: the same warmup and decay, on elapsed time.

    As in "How to Train BERT with an Academic Budget" (Izsak et al. 2021): the rate rises
    linearly over the first `warmup_ratio` of the budget and falls linearly to 0 at its
    end, so the run ends annealed whatever speed the machine has. The loop sets
    `elapsed` (seconds of training, the same on every process) before each scheduler step.
    """

    def __init__(self, budget_seconds: float, warmup_ratio: float):
        self.budget_seconds = budget_seconds
        self.warmup_ratio = warmup_ratio
        self.elapsed = 0.0

    def __call__(self, step: int) -> float:
        return one_cycle(min(self.elapsed / self.budget_seconds, 1.0), self.warmup_ratio)


def one_cycle(progress: float, warmup: float) -> float:
    """The multiplier a fraction `progress` into a cycle: linear up over `warmup`, linear down to 0 at 1."""
    if progress < warmup:
        return max(progress / warmup, 1e-3)  # never exactly 0: the first step must move
    return max(0.0, (1.0 - progress) / max(1e-9, 1.0 - warmup))


def make_scheduler(optimizer, max_steps: int | None, warmup_ratio: float, time_budget: float | None):
    """The run's learning-rate schedule, and its `TimeBudgetSchedule` when it runs on elapsed time (else None).

    Without a time budget: warmup over `warmup_ratio` of `max_steps`, then linear decay to 0 at
    `max_steps`. With one (`time_budget` minutes): the same shape over the budget's seconds; the
    loop sets the returned schedule's `elapsed` before each scheduler step.
    """
    if time_budget is not None:
        budget_schedule = TimeBudgetSchedule(60.0 * time_budget, warmup_ratio)
        return torch.optim.lr_scheduler.LambdaLR(optimizer, budget_schedule), budget_schedule
    warmup_steps = max(1, round(warmup_ratio * max_steps))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_linear_decay(max_steps, warmup_steps)), None
