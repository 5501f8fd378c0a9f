"""Training curves as a PNG, drawn from the run's JSONL log (no display needed)."""

from __future__ import annotations

import json
from pathlib import Path


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
