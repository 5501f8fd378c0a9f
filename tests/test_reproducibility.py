"""Reproducible runs: the same seed gives the same model, and kill -9 plus --resume changes nothing.

Every run here is a real `scratchbert pretrain` process (`python -m scratchbert pretrain`),
so the tokenizer is trained afresh in each (the deterministic WordPiece trainer), hash
randomisation differs between them (PYTHONHASHSEED), and a kill is a real SIGKILL of the
process group, possibly in the middle of writing a checkpoint.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import python_path
from safetensors.torch import load_file

from scratchbert.ingestion import default_corpus_documents
from scratchbert.training.pretraining import checkpoint as ckpt

REPO = Path(__file__).resolve().parents[1]
TINY_FLAGS = [
    "--recipe", "packed", "--hidden-size", "32", "--num-hidden-layers", "2", "--num-attention-heads", "4",
    "--intermediate-size", "64", "--max-position-embeddings", "64", "--max-seq-length", "32", "--vocab-size", "300",
    "--batch-size", "8", "--learning-rate", "3e-3", "--log-every", "2", "--eval-every", "10",
    "--no-progress-bar", "--report-to", "none", "--fill-mask",
]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    path.write_text("\n\n".join(" ".join(doc.split()[:120]) for doc in default_corpus_documents()[:30]) + "\n", encoding="utf-8")
    return path


def command(corpus: Path, output_dir: Path, max_steps: int, save_every: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "scratchbert", "pretrain", "--train-files", str(corpus), "--output-dir", str(output_dir),
        "--seed", "7", "--max-steps", str(max_steps), "--save-every", str(save_every), "--keep-last", "2", *TINY_FLAGS, *extra,
    ]  # fmt: skip


def environment(hash_seed: int) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": str(hash_seed), "PYTHONPATH": python_path(REPO)}


def run_to_end(argv: list[str], hash_seed: int, cwd: Path) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=environment(hash_seed), cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]


def assert_same_model(a: Path, b: Path) -> None:
    assert (a / "vocab.txt").read_bytes() == (b / "vocab.txt").read_bytes(), "the tokenizers differ"
    first, second = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert first.keys() == second.keys()
    different = [name for name in first if not torch.equal(first[name], second[name])]
    assert not different, f"{len(different)} of {len(first)} tensors differ, e.g. {different[:3]}"


def kill_at_random_moments(argv_fresh: list[str], output_dir: Path, kills: int, seed: int, cwd: Path) -> list[str]:
    """Start the run, SIGKILL it at a random moment once training is under way, resume; `kills` times.

    Returns where each kill landed (the newest complete checkpoint then), for the failure message.
    """
    rng = random.Random(seed)
    landed = []
    for attempt in range(kills):
        argv = argv_fresh if attempt == 0 and not output_dir.exists() else [*argv_fresh, "--resume"]
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment(attempt), cwd=cwd, start_new_session=True)
        # Wait for training to be under way (a log record), then strike at a random moment.
        deadline = time.monotonic() + 120
        log = output_dir / "train_log.jsonl"
        while process.poll() is None and time.monotonic() < deadline and not (log.is_file() and log.stat().st_size > 0):
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 1.5))
        if process.poll() is not None:  # it finished before the blow: nothing more to interrupt
            assert process.returncode == 0
            break
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        latest = ckpt.list_checkpoints(output_dir)
        landed.append(latest[-1][1].name if latest else "before the first checkpoint")
    run_to_end([*argv_fresh, "--resume"], 99, cwd)
    return landed


def test_two_fresh_runs_with_one_seed_end_bit_identical(corpus, tmp_path):
    """No --tokenizer: each process trains its own, with different hash seeds."""
    for name, hash_seed in (("a", 1), ("b", 2)):
        run_to_end(command(corpus, tmp_path / name, 12, 4), hash_seed, tmp_path)
    assert_same_model(tmp_path / "a", tmp_path / "b")


def _fault_injection(corpus: Path, tmp_path: Path, max_steps: int, kills: int) -> None:
    run_to_end(command(corpus, tmp_path / "reference", max_steps, 1), 1, tmp_path)
    killed = tmp_path / "killed"
    landed = kill_at_random_moments(command(corpus, killed, max_steps, 1), killed, kills, seed=max_steps, cwd=tmp_path)
    try:
        assert_same_model(tmp_path / "reference", killed)
    except AssertionError as err:
        raise AssertionError(f"{err}; kills landed at: {landed}") from None


def test_kill_9_at_random_moments_then_resume_ends_bit_identical(corpus, tmp_path):
    """A checkpoint every step, so kills also land in the middle of writing one."""
    _fault_injection(corpus, tmp_path, max_steps=40, kills=2)


@pytest.mark.slow
def test_kill_9_many_times_then_resume_ends_bit_identical(corpus, tmp_path):
    _fault_injection(corpus, tmp_path, max_steps=150, kills=7)
