"""The pretraining progress bar: a time budget's bar survives the last step's overshoot."""

from __future__ import annotations

import io

from accelerate import Accelerator

from scratchbert.training.pretraining.config import PretrainConfig
from scratchbert.training.pretraining.loop import progress_bar


def test_a_time_budget_bar_stops_at_its_total_when_the_last_step_runs_past_it(monkeypatch):
    # The last step of a 15-minute run ended at 900.9 s: tqdm then drops the total, and the bar's
    # "{total:.0f}" failed with "unsupported format string passed to NoneType.__format__".
    config = PretrainConfig(time_budget=15.0, progress_bar=True)
    bar = progress_bar(config, Accelerator(cpu=True), step=0, training_seconds=0.0)
    bar.fp, bar.disable = io.StringIO(), False  # draw it, into a string
    bar.update(899.2)
    bar.update(1.7)
    assert bar.n == 900.0 and bar.total == 900.0
    assert "900/900s" in str(bar)
    bar.close()


def test_a_resumed_finished_budget_starts_its_bar_at_the_total():
    bar = progress_bar(PretrainConfig(time_budget=1.0), Accelerator(cpu=True), step=0, training_seconds=61.3)
    assert bar.n == 60.0
    bar.close()
