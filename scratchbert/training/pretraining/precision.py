"""Which precision pretrains faster on this CPU, measured rather than assumed from its flags.

bf16 is not faster on every CPU that lists bf16 instructions. Where oneDNN's bf16 GEMM is slower
than fp32 (an Intel Xeon whose AMX the hypervisor hides: half the fp32 rate), `cpu_gemm` runs bf16
products on the fp32 kernel, and what bf16 autocast adds is casts: `tiny` pretrained at 31,000
tokens/s in bf16 there and 39,500 in fp32 (docs/performance.md). With AMX the answer can be the
other way round, and at bert-base's size it was a tie there. So a choice that matters is made by timing a few training
steps of the run's own model and batch shape in each precision: `scripts/bench_pretrain_budget.py
--mixed-precision auto` pretrains in the faster, and `scratchbert pretrain --mixed-precision bf16`
on a CPU warns when fp32 would train faster (`warn_if_fp32_is_faster`). `scratchbert pretrain
--mixed-precision auto` (the default with `--time-budget`, where a faster step is more steps)
trains in the faster (`auto_precision`).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable

import torch
from torch import nn

from scratchbert import cpu_gemm
from scratchbert.training.pretraining.optimization import adamw, parameter_groups

PRECISIONS = {"no": None, "bf16": torch.bfloat16}  # --mixed-precision value -> autocast dtype

TRIAL_SECONDS = 10.0  # the longest a pretraining run's start waits for the trial; larger models go untimed

BF16_MARGIN = 1.1  # bf16 is chosen only where a trial finds it at least this much faster than fp32

logger = logging.getLogger(__name__)


def training_rates(
    make_model: Callable[[], nn.Module], batch_size: int, seq_length: int, masking_rate: float = 0.15, steps: int = 8,
    warmup: int = 3, rounds: int = 2, max_seconds: float | None = None,
) -> dict[str, float] | None:
    """Tokens per second of a pretraining step on this CPU, per `--mixed-precision` value ("no", "bf16").

    A throwaway copy of the run's model (`make_model()`: `PretrainConfig.new_model`'s MLM or NSP
    model, whose steps differ in cost), on random tokens of the run's batch shape
    (`batch_size` x `seq_length`, `masking_rate` of them predicted, as the run's masks predict;
    random sentence-pair labels for a model with an NSP head): forward under the precision's
    autocast, backward, fused AdamW. Each precision runs `warmup` untimed steps (cpu_gemm times
    its kernels on the first calls) and then `rounds` times `steps` timed steps, the rounds of
    the precisions interleaved; its rate is the best round's, so a moment of load on a shared
    machine does not decide. The caller's random state and cpu_gemm's kernel decisions are left
    as they were. max_seconds: None instead if a step (the second: the first times kernels) says
    the whole trial would take longer.
    """
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = make_model().train()
    optimizer = adamw(parameter_groups(model, 0.01), torch.device("cpu"), lr=1e-4, betas=(0.9, 0.999), eps=1e-6)
    input_ids = torch.randint(model.config.vocab_size, (batch_size, seq_length), generator=generator)  # (B, S)
    predicted = torch.rand(batch_size, seq_length, generator=generator) < masking_rate  # (B, S)
    batch = {"input_ids": input_ids, "labels": torch.where(predicted, input_ids, -100)}
    if "next_sentence_label" in inspect.signature(model.forward).parameters:  # an NSP head to train too
        batch["next_sentence_label"] = torch.randint(2, (batch_size,), generator=generator)  # (B,)

    def run(dtype: torch.dtype | None, count: int) -> float:
        started = time.perf_counter()
        for _ in range(count):
            with torch.random.fork_rng(devices=[]), torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = model(**batch).loss  # dropout draws from a forked stream
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return count * batch_size * seq_length / (time.perf_counter() - started)

    best = dict.fromkeys(PRECISIONS, 0.0)
    with cpu_gemm.decisions_forgotten():  # the real run times its kernels itself, and keeps them
        run(None, 1)  # the first step times cpu_gemm's kernels: the second says what a step costs
        step_seconds = batch_size * seq_length / run(None, 1)
        if max_seconds is not None and step_seconds * 2 * (warmup + rounds * steps) > max_seconds:
            return None
        for dtype in PRECISIONS.values():
            run(dtype, warmup)
        for _ in range(rounds):
            for name, dtype in PRECISIONS.items():
                best[name] = max(best[name], run(dtype, steps))
    return best


def faster_precision(rates: dict[str, float]) -> str:
    """The `--mixed-precision` value with the higher rate: fp32 ("no") unless bf16 is faster by `BF16_MARGIN`.

    Near a tie a few seconds of timing would decide, and two starts of one command could train in
    different arithmetic; fp32, the arithmetic every machine shares, wins those.
    """
    return "bf16" if rates["bf16"] > BF16_MARGIN * rates["no"] else "no"


def auto_precision(
    make_model: Callable[[], nn.Module], batch_size: int, seq_length: int, masking_rate: float, on_gpu: bool
) -> tuple[str, str]:
    """What `--mixed-precision auto` trains in, and a line that says why.

    On a GPU: bf16 where it has bf16 units (CUDA's own answer), else fp32. On a CPU: the faster
    in a timed trial of the run's model, batch and masking rate (`training_rates`, at most `TRIAL_SECONDS`); a model
    too large to time in that trains in fp32, the precision that never needs a trial to be right.
    """
    if on_gpu:
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return "bf16", "bf16, which this GPU computes natively"
        return "no", "fp32: this device has no bf16 support that torch reports"
    rates = training_rates(make_model, batch_size, seq_length, masking_rate, max_seconds=TRIAL_SECONDS)
    if rates is None:
        return "no", (
            f"fp32: a step of this model is too slow to time both precisions in {TRIAL_SECONDS:.0f} s "
            "(--mixed-precision bf16 trains in bf16 without a trial)"
        )
    choice = faster_precision(rates)
    return choice, (
        f"fp32 {rates['no']:,.0f}, bf16 {rates['bf16']:,.0f} tokens/s in a timed trial of this model and batch: "
        f"training in {'bf16' if choice == 'bf16' else 'fp32'}"
    )


def warn_if_fp32_is_faster(
    make_model: Callable[[], nn.Module], batch_size: int, seq_length: int, masking_rate: float
) -> dict[str, float] | None:
    """`--mixed-precision bf16` on a CPU: time this run's model and batch in both, and warn if fp32 is faster.

    A note, never a change of what was asked. Skipped (None) for a model whose trial would take
    longer than `TRIAL_SECONDS`: at bert-base's size the GEMMs are most of a step, and bf16 ran at
    fp32's speed even on the Intel without AMX (8.8 against 8.9 s a step; docs/performance.md).
    """
    rates = training_rates(make_model, batch_size, seq_length, masking_rate, max_seconds=TRIAL_SECONDS)
    if rates is not None and faster_precision(rates) == "no":
        logger.warning(
            f"--mixed-precision bf16 trains slower than fp32 on this CPU: {rates['bf16']:,.0f} against {rates['no']:,.0f} "
            "tokens/s in a timed trial of this model and batch (bf16 autocast adds casts, and without AMX or bf16 units "
            "its products run on fp32 kernels). --mixed-precision no trains faster; docs/performance.md."
        )
    return rates


__all__ = ["PRECISIONS", "TRIAL_SECONDS", "BF16_MARGIN", "training_rates", "faster_precision", "auto_precision", "warn_if_fp32_is_faster"]


