"""Training curves as a PNG, drawn from the run's JSONL log (no display needed)."""

from __future__ import annotations

import json
from pathlib import Path


def read_log(path: str | Path) -> list[dict]:
    """The records of a `train_log.jsonl` (one JSON object per line)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def plot_training_curves(records: list[dict], path: str | Path, title: str = "scratchbert pretraining") -> Path:
    """Draw training loss and held-out MLM loss / MLM accuracy / NSP or RTD accuracy (when trained) against steps.

    `records` are the log's dicts: `{"type": "train", "step", "loss"}` and
    `{"type": "eval", "step", "mlm_loss", "mlm_accuracy", "context_free_accuracy", "nsp_accuracy"}`; an ELECTRA run's
    evaluations carry its generator's MLM figures, `rtd_accuracy` and `rtd_auc` instead of `nsp_accuracy`.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: works on machines without a display
    import matplotlib.pyplot as plt

    train = [r for r in records if r.get("type") == "train"]
    evals = [r for r in records if r.get("type") == "eval"]
    figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(11, 4))
    has_nsp = any("nsp_accuracy" in r for r in evals)
    has_rtd = any("rtd_accuracy" in r for r in evals)
    objective = "generator MLM + weighted RTD" if has_rtd else "MLM + NSP" if has_nsp else "MLM"
    mlm = "generator MLM" if has_rtd else "MLM"
    loss_axis.plot([r["step"] for r in train], [r["loss"] for r in train], label=f"train loss ({objective})")
    if evals:
        loss_axis.plot([r["step"] for r in evals], [r["mlm_loss"] for r in evals], "o-", label=f"held-out {mlm} loss")
        accuracy_axis.plot([r["step"] for r in evals], [r["mlm_accuracy"] for r in evals], "o-", label=f"held-out {mlm} accuracy")
        if "context_free_accuracy" in evals[-1]:  # the bag-of-words plateau: evaluation.py
            accuracy_axis.axhline(evals[-1]["context_free_accuracy"], color="grey", linestyle="--", linewidth=1, label="guess from word frequencies")
    if has_rtd:
        rtd = [r for r in evals if "rtd_accuracy" in r]
        accuracy_axis.plot([r["step"] for r in rtd], [r["rtd_accuracy"] for r in rtd], "s-", label="held-out replaced-token detection accuracy")
        auc = [r for r in rtd if r.get("rtd_auc") is not None]
        if auc:  # logs written before the AUC was evaluated have none
            accuracy_axis.plot([r["step"] for r in auc], [r["rtd_auc"] for r in auc], "^-", label="held-out replaced-token detection AUC")
            accuracy_axis.axhline(0.5, color="grey", linestyle=":", linewidth=1, label="AUC chance")
    if has_nsp:
        nsp = [r for r in evals if "nsp_accuracy" in r]
        accuracy_axis.plot([r["step"] for r in nsp], [r["nsp_accuracy"] for r in nsp], "s-", label="held-out NSP accuracy")
        accuracy_axis.axhline(0.5, color="grey", linestyle=":", linewidth=1, label="NSP chance")
    loss_axis.set(xlabel="optimizer step", ylabel="loss", title="loss")
    score = "accuracy and AUC" if has_rtd else "accuracy"
    accuracy_axis.set(xlabel="optimizer step", ylabel=score, title=f"held-out {score}", ylim=(0, 1))
    for axis in (loss_axis, accuracy_axis):
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(title)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_loss_comparison(curves: dict[str, tuple[list[int], list[float]]], path: str | Path, title: str) -> Path:
    """Overlay several loss curves, `{label: (steps, losses)}`, e.g. two models trained identically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for (label, (steps, losses)), style in zip(curves.items(), ("-", "--", ":", "-.")):
        axis.plot(steps, losses, style, label=label)
    axis.set(xlabel="optimizer step", ylabel="training loss", title=title)
    return _finish(figure, [axis], path)


def plot_label_curve(curves: dict[str, dict[int, list[float]]], path: str | Path, title: str) -> Path:
    """Test accuracy against the number of labels, `{model: {labels: [accuracy per seed]}}`: the mean with
    a bar of one standard deviation, on a log scale of labels (each doubling the same width)."""
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    figure, axis = plt.subplots(figsize=(7, 4))
    for label, runs in curves.items():
        counts = sorted(runs)
        means = [statistics.mean(runs[count]) for count in counts]
        spreads = [statistics.stdev(runs[count]) if len(runs[count]) > 1 else 0.0 for count in counts]
        axis.errorbar(counts, means, yerr=spreads, marker="o", capsize=3, label=label)
    axis.set_xscale("log")
    axis.set_xticks(sorted({count for runs in curves.values() for count in runs}))
    axis.get_xaxis().set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    axis.minorticks_off()
    axis.set(xlabel="labelled training examples (log scale)", ylabel="test accuracy", title=title)
    return _finish(figure, [axis], path)


def _finish(figure, axes, path: str | Path) -> Path:
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
