"""A model soup (Wortsman et al. 2022): several fine-tuning runs of one checkpoint averaged into one
model of the same size, kept only when it validates no worse than the worst of its runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from scratchbert.training.finetuning.metrics import document_metrics, unprefixed

logger = logging.getLogger(__name__)

@dataclass
class Member:
    """What one fine-tuning run of `finetune` did (`_train_member`)."""

    seed: int
    train: dict  # Trainer's training metrics
    validation: dict  # the kept epoch's validation metrics, as logged when it was evaluated
    best_checkpoint: str | None
    early_stopping: dict  # `early_stopping_record`
    log_history: list[dict]

class WeightAverage:
    """The running element-wise mean of the weights of models added one by one (a uniform model soup,
    Wortsman et al. 2022), holding one float32 copy of the weights rather than every model.

    Fine-tuned from one checkpoint, the runs stay close enough in weight space for their mean to be a
    classifier itself, better than the runs on average (docs/finetuning.md). Tensors that are not floating point
    (index buffers) are the same in every run and are left as the model has them.
    """

    def __init__(self):
        self.total: dict[str, torch.Tensor] = {}
        self.count = 0

    def add(self, model) -> None:
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point():
                self.total[name] = self.total[name] + tensor.float() if self.count else tensor.detach().float().clone()
        self.count += 1

    def load_into(self, model) -> None:
        """Give `model` (one of the averaged models' architecture) the mean weights."""
        mean = {name: (total / self.count).to(model.state_dict()[name].dtype) for name, total in self.total.items()}
        model.load_state_dict(mean, strict=False)  # strict=False: the non-float buffers stay as they are

def soup_record(members: list[Member]) -> dict:
    """What the runs of a soup did together: training time and steps summed, the rest per run."""
    return {
        "train": {"runtime": sum(m.train["runtime"] for m in members), "loss": float(np.mean([m.train["loss"] for m in members])), "epoch": members[0].train["epoch"]},
        "early_stopping": {
            "patience": members[0].early_stopping["patience"],
            "stopped_early": any(m.early_stopping["stopped_early"] for m in members),
            "epochs_run": sum(m.early_stopping["epochs_run"] for m in members),
            "optimizer_steps_run": sum(m.early_stopping["optimizer_steps_run"] for m in members),
        },
        "soup": {"runs": len(members), "members": [{name: getattr(m, name) for name in ("seed", "validation", "best_checkpoint", "early_stopping")} for m in members]},
    }

SOUP_FALLBACK_ADVICE = (
    "its runs did not end in one basin of the loss, as fine-tunes of an untrained or barely pretrained checkpoint "
    "do not. Pretrain longer, or pass --soup 1 to train once."
)

def keep_soup_or_best_run(trainer, members: list[Member], validation, best_metric: str) -> dict:
    """Keep the soup in `trainer.model` if it validates no worse than the worst of its runs, else the best run.

    Runs fine-tuned from a pretrained checkpoint stay in one basin, and their mean is a classifier
    at least as good as they are; runs from random weights end in different basins, and their mean
    is close to a constant guess (on BBC News: validation loss 1.3 against 0.2 to 0.7 for each run,
    test macro-F1 0.77 to 0.88 where one run scores 0.92 to 0.97; docs/finetuning.md). The validation loss tells the two apart where
    the score of a small validation split cannot. When the soup is worse than every run, the run with
    the best `best_metric` (then the lowest loss) is loaded into `trainer.model` instead, with a warning.
    It catches a soup that fell towards a constant guess, not every soup worse than one run: on IMDB the
    soup of five random-weight runs validated above its runs and tested 1.2 points under the first (docs/finetuning.md).

    Returns:
        {"kept": "soup" or "run k", "validation": the soup's validation scores (loss, accuracy, macro_f1,
        top_class_share), kept or not, "worst_run_validation_loss"}
    """
    from safetensors.torch import load_file

    trainer.compute_metrics = document_metrics(validation["document"])
    metrics = unprefixed(trainer.predict(validation, metric_key_prefix="eval").metrics, "eval_")
    scores = {name: value for name, value in metrics.items() if name != "runtime" and not name.endswith("per_second")}
    worst = max(m.validation["loss"] for m in members)
    record = {"validation": scores, "worst_run_validation_loss": worst}
    if scores["loss"] <= worst:
        return record | {"kept": "soup"}
    best = max(range(len(members)), key=lambda k: (members[k].validation[best_metric], -members[k].validation["loss"]))
    trainer.model.load_state_dict(load_file(str(Path(members[best].best_checkpoint) / "model.safetensors")), strict=False)
    logger.warning(
        "SOUP NOT KEPT: the mean of the %d runs' weights has validation loss %.3f, above every run's (the worst: %.3f; "
        "the soup's %s %.4f): %s Keeping run %d (seed %d), the best on validation (%s %.4f).", len(members), scores["loss"], worst,
        best_metric, scores[best_metric], SOUP_FALLBACK_ADVICE, best, members[best].seed, best_metric, members[best].validation[best_metric],
    )  # fmt: skip
    return record | {"kept": f"run {best}"}
