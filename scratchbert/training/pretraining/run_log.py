"""What a pretraining run reports: the JSONL log (and Accelerate's trackers), its training records, the progress bar."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from scratchbert.training.pretraining.config import PretrainConfig


class RunLog:
    """The always-on JSONL log (main process) plus Accelerate's trackers."""

    def __init__(self, accelerator: Accelerator, path: Path, resume_step: int | None):
        self.accelerator = accelerator
        self.path = path
        if accelerator.is_main_process:
            path.parent.mkdir(parents=True, exist_ok=True)
            if resume_step is None:
                path.write_text("", encoding="utf-8")
            elif path.exists():  # drop what the interrupted run logged after its last checkpoint
                kept = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
                kept = [line for line in kept if json.loads(line).get("step", 0) <= resume_step]
                partial = path.with_name(f".{path.name}.partial")  # written whole, then renamed: a full disk keeps the old log
                partial.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
                os.replace(partial, path)

    def write(self, record: dict) -> None:
        if not self.accelerator.is_main_process:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        numbers = {f"{record['type']}/{k}": v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        self.accelerator.log(numbers, step=record.get("step"))


class BudgetBar(tqdm):
    """Seconds of training out of a time budget. The last step ends past the budget, and tqdm drops a
    total that `n` has passed (its bar format would then fail on total=None): this bar stops at its total."""

    def update(self, n: float = 1) -> bool | None:
        return super().update(max(0.0, min(n, self.total - self.n)))


def progress_bar(config: PretrainConfig, accelerator: Accelerator, step: int, training_seconds: float):
    """Steps out of max_steps; with a time budget, seconds of training out of the budget."""
    disable = not (accelerator.is_local_main_process and config.progress_bar)
    if config.time_budget is None:
        return tqdm(total=config.max_steps, initial=step, desc="pretrain", unit="step", disable=disable, dynamic_ncols=True)
    budget = 60.0 * config.time_budget
    return BudgetBar(
        total=budget, initial=min(training_seconds, budget), desc="pretrain", unit="s", disable=disable, dynamic_ncols=True,
        bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}s [{elapsed}<{remaining}{postfix}]",
    )  # fmt: skip


def train_record(accelerator: Accelerator, window: dict, step: int, epoch: int, scheduler) -> dict:
    """Mean training loss per optimizer step over the logging window, and throughput.

    Each process holds its share of every step's loss (`global_batch.py`): their sum is the step's.
    """
    mean_loss = accelerator.reduce(window["loss"], reduction="sum").item() / max(window["steps"], 1)
    local_tokens = torch.as_tensor(window["tokens"], device=accelerator.device)
    tokens = int(accelerator.reduce(local_tokens, reduction="sum").item())
    seconds = time.perf_counter() - window["start"]
    window.update(loss=torch.zeros_like(window["loss"]), steps=0, tokens=0, start=time.perf_counter())
    return {
        "type": "train", "step": step, "epoch": epoch, "loss": mean_loss,
        "learning_rate": scheduler.get_last_lr()[0], "tokens": tokens, "tokens_per_second": tokens / max(seconds, 1e-9),
    }  # fmt: skip

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
