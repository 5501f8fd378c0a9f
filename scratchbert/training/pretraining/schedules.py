"""The optimiser's parameter groups, the learning-rate schedules, and the clock a time budget runs on."""

from __future__ import annotations

import contextlib
import time

import torch


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


class TrainingClock:
    """Seconds spent training, carried over when a run is resumed.

    Evaluation and checkpoint writing are left out (`pause` / `start` around them), so a
    budget buys the same amount of training whatever the bookkeeping costs. `timer` is
    injectable so tests can run a budget on a clock of their own.
    """

    def __init__(self, elapsed: float = 0.0, timer=time.perf_counter):
        self.timer = timer
        self._elapsed = elapsed
        self._since: float | None = None

    def start(self) -> None:
        if self._since is None:
            self._since = self.timer()

    def pause(self) -> None:
        if self._since is not None:
            self._elapsed += self.timer() - self._since
            self._since = None

    @contextlib.contextmanager
    def paused(self, window: dict):
        """The clock stopped for the block (evaluation, a checkpoint); the throughput `window` restarts after it."""
        self.pause()
        try:
            yield
        finally:
            self.start()
            window["start"] = time.perf_counter()  # throughput counts training time only

    def seconds(self) -> float:
        return self._elapsed + (self.timer() - self._since if self._since is not None else 0.0)


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
