"""The global batch means what it says: N processes x batch B x accumulation k train as one process with batch N*B*k.

Each multi-process run here is a real `accelerate launch` (gloo DDP on this CPU, one process per
rank), compared with in-process runs of one process. "The same weights" is measured as the
issue measured it: the distance between two runs' final weights over the distance between two
runs that differ only in --seed. Before the global batch (issue 78), 2 x 8 against 1 x 16 was
0.139 of it; what remains is float rounding (the order DDP sums gradients in), under 1e-3.
Dropout is off in every run compared (the packed recipe has none; the paper recipe's is set to
0 here): each process draws its own dropout masks (`training/pretraining/optimization.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState
from conftest import REPO, first_documents_file, kill_tree, python_path, run_launcher, saved_tokenizer

from scratchbert.errors import ScratchBertError
from scratchbert.training.pretraining import checkpoint as ckpt
from scratchbert.training.pretraining.config import PretrainConfig
from scratchbert.training.pretraining.loop import pretrain

pytestmark = pytest.mark.usefixtures("fresh_accelerator_state")

SAME_WEIGHTS = 1e-3  # of the seed-to-seed distance: float rounding, nothing else
RUN = {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
    "max_position_embeddings": 64, "max_seq_length": 32, "max_steps": 6, "learning_rate": 3e-3,
    "eval_every": 0, "save_every": 3, "log_every": 1, "max_eval_examples": 16, "report_to": "none", "progress_bar": False,
    "mixed_precision": "no",
}  # fmt: skip
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    """24 documents of the embedded corpus: about 130 packed training examples of 32 tokens, 8 steps of 16."""
    return first_documents_file(tmp_path_factory.mktemp("global-batch-corpus"), documents=24, words=120)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, corpus_file) -> Path:
    return saved_tokenizer(tmp_path_factory, corpus_file, vocab_size=400, name="global-batch-tokenizer")


def config(corpus_file, tokenizer_dir, output_dir, **overrides) -> PretrainConfig:
    values = {**RUN, "train_files": [str(corpus_file)], "tokenizer": str(tokenizer_dir), "output_dir": str(output_dir)}
    return PretrainConfig(**{**values, **overrides})


def one_process(corpus_file, tokenizer_dir, output_dir: Path, **overrides) -> dict[str, torch.Tensor]:
    """An in-process run of one process; its final weights."""
    AcceleratorState._reset_state(reset_partial_state=True)
    pretrain(config(corpus_file, tokenizer_dir, output_dir, **overrides))
    return weights(output_dir)


def weights(output_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(output_dir / "model.safetensors")


def distance(first: dict, second: dict) -> float:
    return sum(float((first[name].double() - second[name].double()).pow(2).sum()) for name in first) ** 0.5


@pytest.fixture(scope="module")
def references(tmp_path_factory, corpus_file, tokenizer_dir):
    """recipe -> (final weights of 1 process x batch 16, the seed-to-seed distance), for each recipe compared."""
    made = {}
    for name, overrides in (("packed", {}), ("paper", {"recipe": "paper", **NO_DROPOUT}), ("streaming", {"streaming": True})):
        folder = tmp_path_factory.mktemp(f"reference-{name}")
        reference = one_process(corpus_file, tokenizer_dir, folder / "seed42", batch_size=16, **overrides)
        other_seed = one_process(corpus_file, tokenizer_dir, folder / "seed43", batch_size=16, seed=43, **overrides)
        made[name] = (reference, distance(reference, other_seed))
    AcceleratorState._reset_state(reset_partial_state=True)
    return made


def launch_command(corpus_file, tokenizer_dir, output_dir: Path, port: int, launcher: list[str], **overrides) -> list[str]:
    """`accelerate launch <launcher> -m scratchbert.commands.pretrain ...` with RUN's options and `overrides`.

    Options the command line does not take (dropout) go through a --config file, as a user's would.
    """
    values = {**RUN, **overrides}
    file_only = {name: values.pop(name) for name in list(values) if name.endswith("dropout_prob")}
    command = [
        sys.executable, "-m", "accelerate.commands.launch", *launcher, "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(port), "-m", "scratchbert.commands.pretrain",
        "--train-files", str(corpus_file), "--tokenizer", str(tokenizer_dir), "--output-dir", str(output_dir),
    ]  # fmt: skip
    if file_only:
        config_file = output_dir.parent / f"{output_dir.name}-options.json"
        config_file.write_text(json.dumps(file_only), encoding="utf-8")
        command += ["--config", str(config_file)]
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        command += [flag] if value is True else [f"--no-{flag[2:]}"] if value is False else [flag, str(value)]
    return command


LAUNCH_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": python_path(REPO), "CUDA_VISIBLE_DEVICES": ""}  # CPU ranks, as on CI
ONE_MACHINE = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1"]


def launch(corpus_file, tokenizer_dir, output_dir: Path, port: int, **overrides) -> str:
    """2 processes on this machine; returns what they printed (the test fails on a non-zero exit)."""
    command = launch_command(corpus_file, tokenizer_dir, output_dir, port, ONE_MACHINE, **overrides)
    returncode, output = run_launcher(command, LAUNCH_ENV, output_dir.parent, timeout=300)
    assert returncode == 0, output[-4000:]
    return output


def two_machines(corpus_file, tokenizer_dir, output_dir: Path, port: int, **overrides) -> list[subprocess.Popen]:
    """The launch a user runs on each of two machines, here both on 127.0.0.1, one process each."""
    processes = []
    for machine_rank in (0, 1):
        launcher = [
            "--multi_gpu", "--num_processes", "2", "--num_machines", "2", "--machine_rank", str(machine_rank),
            "--main_process_ip", "127.0.0.1",
        ]  # fmt: skip
        command = launch_command(corpus_file, tokenizer_dir, output_dir, port, launcher, **overrides)
        processes.append(
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=LAUNCH_ENV, start_new_session=True)
        )
    return processes


def finish(processes: list[subprocess.Popen], timeout: float = 300) -> list[str]:
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=timeout)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                kill_tree(process.pid)
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-4000:]
    return outputs


def assert_same_weights(run: dict, reference: tuple[dict, float], what: str) -> None:
    reference_weights, seed_distance = reference
    ratio = distance(run, reference_weights) / seed_distance
    assert ratio < SAME_WEIGHTS, f"{what}: {ratio:.2e} of the seed-to-seed distance from 1 process x batch 16"


# --- in one process -------------------------------------------------------------------------


def test_micro_batches_with_unequal_masked_counts_add_up_to_the_gradient_of_one_big_batch():
    """Two micro-batches with different numbers of labelled tokens, each divided by the global count
    (and scaled as `loop.train` does), give the gradient of the whole batch's mean loss;
    averaging the two micro-batch means (what DDP and accumulation did before) does not."""
    from scratchbert.configuration_scratchbert import ScratchBertConfig
    from scratchbert.modeling_scratchbert import IGNORE_INDEX, ScratchBertForPreTraining

    torch.manual_seed(0)
    model = ScratchBertForPreTraining(ScratchBertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    input_ids = torch.randint(5, 50, (6, 12))
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:2, :9] = input_ids[:2, :9]  # the first micro-batch (rows 0-2) holds 18 labelled tokens
    labels[3:, :1] = input_ids[3:, :1]  # the second (rows 3-5) holds 3
    nsp = torch.tensor([0, 1, 0, 1, 1, 0])

    def gradient(loss_of_parts) -> torch.Tensor:
        model.zero_grad()
        loss_of_parts().backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    model.train()
    whole = gradient(lambda: model(input_ids=input_ids, labels=labels, next_sentence_label=nsp).loss)
    parts = [slice(0, 3), slice(3, 6)]
    counts = {"num_items_in_batch": (labels != IGNORE_INDEX).sum(), "num_sentence_pairs_in_batch": torch.tensor(6)}
    summed = gradient(lambda: sum(model(input_ids=input_ids[p], labels=labels[p], next_sentence_label=nsp[p], **counts).loss for p in parts))
    averaged = gradient(lambda: sum(model(input_ids=input_ids[p], labels=labels[p], next_sentence_label=nsp[p]).loss for p in parts) / 2)
    assert torch.allclose(summed, whole, atol=1e-6)
    assert not torch.allclose(averaged, whole, atol=1e-3)


@pytest.mark.parametrize("batch_size, accumulation", [(8, 2), (4, 4)])
def test_gradient_accumulation_trains_as_the_whole_batch_does(corpus_file, tokenizer_dir, references, tmp_path, batch_size, accumulation):
    run = one_process(corpus_file, tokenizer_dir, tmp_path / "run", batch_size=batch_size, gradient_accumulation_steps=accumulation)
    assert_same_weights(run, references["packed"], f"1 process x {batch_size} x {accumulation}")


def test_a_stream_stopped_at_a_step_resumes_with_another_split_of_the_same_global_batch(corpus_file, tokenizer_dir, references, tmp_path, monkeypatch):
    """A streamed 1 x 16 run stopped after its step-3 checkpoint, resumed as 1 x 8 x accumulation 2: the stream's
    one state carries on, and the run ends where 1 x 16 ends (what a stream resumed on 2 processes of 8 reads too)."""
    from conftest import kill_after_saving

    output_dir = tmp_path / "stream"
    kill_after_saving(monkeypatch, 3, lambda: one_process(corpus_file, tokenizer_dir, output_dir, batch_size=16, streaming=True))
    resumed = one_process(corpus_file, tokenizer_dir, output_dir, batch_size=8, gradient_accumulation_steps=2, streaming=True, resume=True)
    assert_same_weights(resumed, references["streaming"], "a stream of 1 x 16 to step 3, then 1 x 8 x 2")


# --- several processes ----------------------------------------------------------------------


def test_two_processes_with_accumulation_train_as_one_with_the_whole_batch_and_resume_on_one(corpus_file, tokenizer_dir, references, tmp_path):
    """2 x 4 x accumulation 2 ends where 1 x 16 ends. Taken back to its step-3 checkpoint (as if stopped
    there), one process of batch 16 resumes it and ends there too; a resume that would change the
    examples of a step (1 x 8) is refused, naming both global batches and the fix."""
    import shutil

    output_dir = tmp_path / "2x4x2"
    launch(corpus_file, tokenizer_dir, output_dir, 29541, batch_size=4, gradient_accumulation_steps=2)
    assert_same_weights(weights(output_dir), references["packed"], "2 processes x 4 x 2")
    shutil.rmtree(output_dir / "checkpoints" / "step-6")  # stopped after step 3
    with pytest.raises(ScratchBertError, match=r"16 examples \(2 process\(es\) x --batch-size 4 x --gradient-accumulation-steps 2\).*8 examples.*= 16"):
        one_process(corpus_file, tokenizer_dir, output_dir, batch_size=8, resume=True)
    resumed = one_process(corpus_file, tokenizer_dir, output_dir, batch_size=16, resume=True)
    assert_same_weights(resumed, references["packed"], "2 x 4 x 2 to step 3, then 1 x 16")


@pytest.mark.parametrize(
    "recipe, overrides, port",
    [("packed", {}, 29543), ("paper", {"recipe": "paper", **NO_DROPOUT}, 29545), ("streaming", {"streaming": True}, 29547)],
)
def test_two_processes_of_batch_8_train_as_one_of_batch_16(corpus_file, tokenizer_dir, references, tmp_path, recipe, overrides, port):
    output_dir = tmp_path / "2x8"
    launch(corpus_file, tokenizer_dir, output_dir, port, batch_size=8, **overrides)
    assert_same_weights(weights(output_dir), references[recipe], f"{recipe}: 2 processes x 8")
    losses = [r["loss"] for r in map(json.loads, (output_dir / "train_log.jsonl").read_text().splitlines()) if r["type"] == "train"]
    assert len(losses) == RUN["max_steps"]


def test_two_machines_train_as_one_machine_save_once_and_resume_exactly_after_both_are_killed(corpus_file, tokenizer_dir, references, tmp_path):
    """`--num_machines 2 --machine_rank 0|1`, one process each, on 127.0.0.1: the weights of 1 x 16
    (which are 2 x 8's on one machine); one log, one checkpoint per save with both ranks' RNG
    states; killed (-9, both) after the step-3 checkpoint and resumed: the uninterrupted run's weights, bit for bit.
    200 steps (20 epochs), so that the kill lands long before the end."""
    steps = {"max_steps": 200, "save_every": 50, "batch_size": 8}
    one = one_process(corpus_file, tokenizer_dir, tmp_path / "one", max_steps=200, batch_size=16)
    whole = tmp_path / "whole"
    finish(two_machines(corpus_file, tokenizer_dir, whole, 29551, **steps))
    assert_same_weights(weights(whole), (one, references["packed"][1]), "two machines x 1 process x 8")
    starts = [r for r in map(json.loads, (whole / "train_log.jsonl").read_text().splitlines()) if r["type"] == "start"]
    assert len(starts) == 1 and starts[0]["num_processes"] == 2  # one log, written once
    last = ckpt.list_checkpoints(whole)[-1][1]
    assert last.name == "step-200" and {"random_states_0.pkl", "random_states_1.pkl"} <= {p.name for p in last.iterdir()}

    killed = tmp_path / "killed"
    processes = two_machines(corpus_file, tokenizer_dir, killed, 29553, **{**steps, "save_every": 3})
    deadline = time.monotonic() + 300
    while not (killed / "checkpoints" / "step-3").is_dir():  # renamed into place once complete (checkpoint.py)
        assert time.monotonic() < deadline and all(p.poll() is None for p in processes), "no step-3 checkpoint"
        time.sleep(0.05)
    for process in processes:
        kill_tree(process.pid)
        process.communicate()
    assert not (killed / "model.safetensors").exists()  # killed before the end
    finish(two_machines(corpus_file, tokenizer_dir, killed, 29555, **steps, resume=True))  # saving every 50 again
    first, resumed = weights(whole), weights(killed)
    assert all(torch.equal(first[name], resumed[name]) for name in first)
