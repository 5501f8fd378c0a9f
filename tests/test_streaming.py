"""--streaming: windows shuffled by seed, a held-out split by content, disjoint shares per process, exact resume."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import datasets
import pytest
import torch
from accelerate.state import AcceleratorState
from conftest import first_documents_file, kill_after_saving, python_path, saved_tokenizer

from scratchbert.ingestion import default_corpus_documents
from scratchbert.training.pretraining import checkpoint as ckpt
from scratchbert.training.pretraining import streaming
from scratchbert.training.pretraining.config import PretrainConfig
from scratchbert.training.pretraining.loop import pretrain
from scratchbert.training.pretraining.streaming import ExampleStream, StreamLoader, split_stream

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("fresh_accelerator_state")


def numbered(n: int) -> datasets.IterableDataset:
    return datasets.Dataset.from_dict({"n": list(range(n))}).to_iterable_dataset()


def test_each_window_is_a_seeded_permutation_and_every_epoch_another():
    stream = ExampleStream(numbered(50), seed=1, window=16)
    first = [(index, example["n"]) for index, example in stream]
    assert sorted(n for _, n in first) == list(range(50))  # every example once
    assert all(index == n for index, n in first)  # the index is the place in the stream
    for start in range(0, 50, 16):  # shuffled within windows only
        assert sorted(n for _, n in first[start : start + 16]) == list(range(start, min(start + 16, 50)))
    assert [n for _, n in first] != list(range(50))
    assert [(i, x["n"]) for i, x in ExampleStream(numbered(50), seed=1, window=16)] == first  # same seed, same order
    stream.set_epoch(1)
    assert [example["n"] for _, example in stream] != [n for _, n in first]


@pytest.mark.parametrize("taken", [5, 16, 23, 49])  # mid-window, a window's end, the next window, the last example
def test_a_stream_resumes_exactly_where_its_state_was_taken(taken):
    stream = ExampleStream(numbered(50), seed=3, window=16)
    stream.set_epoch(2)
    iterator = iter(stream)
    [next(iterator) for _ in range(taken)]
    state = json.loads(json.dumps(stream.state_dict()))  # it goes into trainer_state.json
    rest = [(index, example["n"]) for index, example in iterator]
    resumed = ExampleStream(numbered(50), seed=3, window=16)
    resumed.load_state_dict(state)
    assert resumed.epoch == 2
    assert [(index, example["n"]) for index, example in resumed] == rest


def test_held_out_documents_are_chosen_by_content():
    texts = [f"document number {i} " * (1 + i % 5) for i in range(400)] + ["a repeated document"] * 20
    documents = datasets.Dataset.from_dict({"text": texts}).to_iterable_dataset()
    training, held_out = split_stream(documents, eval_fraction=0.1)
    trained = [example["text"] for example in training]
    held = [example["text"] for example in held_out]
    assert 15 <= len(set(held)) <= 65  # about 10% of 401 distinct documents
    assert not set(held) & set(trained)  # a repeated document is never on both sides
    assert sorted(trained + held) == sorted(texts)  # nothing lost, nothing twice
    assert len(trained) > 300


@pytest.mark.parametrize("world_size, accumulation", [(2, 1), (2, 2), (3, 1)])
def test_processes_share_out_each_step_as_one_process_with_the_whole_batch_would_take_it(world_size, accumulation):
    """Micro-batch j of a step is batch j * N + rank of the step's batches, as Accelerate deals a
    map-style dataset's: together the N processes hold the examples one process of batch N * B * k
    would, with the same indices (so the same masks); a stream's last part step is left out."""
    take = lambda items: {"index": torch.tensor([index for index, _ in items])}  # noqa: E731 (collate: the examples' indices)
    one = StreamLoader(ExampleStream(numbered(50), seed=5, window=16), 4 * world_size * accumulation, 1, take, torch.device("cpu"))
    whole_steps = [batch["index"].tolist() for batch in one]
    shares = [
        [batch["index"].tolist() for batch in StreamLoader(ExampleStream(numbered(50), seed=5, window=16), 4, accumulation, take, torch.device("cpu"), rank, world_size)]
        for rank in range(world_size)
    ]
    assert len(whole_steps) == 50 // (4 * world_size * accumulation)
    for step, whole in enumerate(whole_steps):
        parts = [shares[rank][step * accumulation + j] for j in range(accumulation) for rank in range(world_size)]
        assert sorted(index for part in parts for index in part) == sorted(whole)
        assert [index for j in range(accumulation) for rank in range(world_size) for index in shares[rank][step * accumulation + j]] == whole
    assert all(len(share) == len(whole_steps) * accumulation for share in shares)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    """16 documents of the embedded corpus, a quarter held out: about 100 training examples of 32 tokens
    (13 batches of 8), so a 12-step run with accumulation 2 wraps an epoch."""
    return first_documents_file(tmp_path_factory.mktemp("stream-corpus"), documents=16, words=120)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, corpus_file) -> Path:
    return saved_tokenizer(tmp_path_factory, corpus_file, vocab_size=400, name="stream-tokenizer")


def streamed_config(corpus_file, tokenizer_dir, output_dir, **overrides) -> PretrainConfig:
    values = {
        "streaming": True, "train_files": [str(corpus_file)], "tokenizer": str(tokenizer_dir), "output_dir": str(output_dir),
        "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
        "max_position_embeddings": 64, "max_seq_length": 32, "batch_size": 8, "max_steps": 12, "learning_rate": 3e-3,
        "eval_every": 6, "save_every": 4, "log_every": 1, "max_eval_examples": 16, "eval_fraction": 0.25, "report_to": "none", "progress_bar": False,
    }  # fmt: skip
    return PretrainConfig(**{**values, **overrides})


def test_a_streamed_run_stopped_and_resumed_ends_with_the_uninterrupted_runs_weights(corpus_file, tokenizer_dir, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    monkeypatch.setattr(streaming, "STREAM_WINDOW", 20)  # 2.5 batches a window: the resume lands mid-window
    pretrain(streamed_config(corpus_file, tokenizer_dir, tmp_path / "full", gradient_accumulation_steps=2))
    AcceleratorState._reset_state(reset_partial_state=True)

    output_dir = tmp_path / "interrupted"
    kill_after_saving(monkeypatch, 8, lambda: pretrain(streamed_config(corpus_file, tokenizer_dir, output_dir, gradient_accumulation_steps=2)))
    state = ckpt.read_trainer_state(ckpt.list_checkpoints(output_dir)[-1][1])
    stream_state = state["stream"]
    assert state["step"] == 8 and stream_state["epoch"] >= 1  # the stream wrapped: 16 batches of a shorter epoch
    assert 0 < stream_state["used"] < 20  # inside a window

    AcceleratorState._reset_state(reset_partial_state=True)
    pretrain(streamed_config(corpus_file, tokenizer_dir, output_dir, gradient_accumulation_steps=2, resume=True))
    expected, resumed = load_file(tmp_path / "full" / "model.safetensors"), load_file(output_dir / "model.safetensors")
    for name in expected:
        assert torch.equal(expected[name], resumed[name]), name
    losses = lambda folder: [(r["step"], r["loss"]) for r in map(json.loads, (folder / "train_log.jsonl").read_text().splitlines()) if r["type"] == "train"]  # noqa: E731
    assert losses(output_dir) == losses(tmp_path / "full")


def test_a_streamed_run_trains_its_tokenizer_on_the_first_text_and_learns(corpus_file, tmp_path, capfd):
    result = pretrain(streamed_config(corpus_file, None, tmp_path / "run", tokenizer=None, vocab_size=300, max_steps=30, learning_rate=5e-3))
    records = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    start = records[0]
    assert start["train_examples"] is None and start["eval_examples"] == 16 and start["setup_seconds"] > 0
    train = [r["loss"] for r in records if r["type"] == "train"]
    assert sum(train[-5:]) / 5 < sum(train[:5]) / 5 - 0.3, train
    assert result.eval_metrics["mlm_accuracy"] > 0
    assert (tmp_path / "run" / "tokenizer" / "tokenizer.json").is_file()
    assert "%|" not in capfd.readouterr().err  # progress_bar=False from Python: no bar of datasets' or transformers' either


def test_streaming_is_fixed_for_the_run_and_an_empty_share_is_an_error(corpus_file, tokenizer_dir, tmp_path):
    from scratchbert.errors import ScratchBertError

    pretrain(streamed_config(corpus_file, tokenizer_dir, tmp_path / "run", max_steps=4))
    AcceleratorState._reset_state(reset_partial_state=True)
    with pytest.raises(ScratchBertError, match="streaming"):  # the examples would differ: not resumable
        pretrain(streamed_config(corpus_file, tokenizer_dir, tmp_path / "run", streaming=False, resume=True, max_steps=8))
    AcceleratorState._reset_state(reset_partial_state=True)
    one = tmp_path / "one.txt"
    one.write_text(" ".join(default_corpus_documents()[0].split()[:200]) + "\n", encoding="utf-8")
    with pytest.raises(ScratchBertError, match="no optimizer step|no examples"):
        pretrain(streamed_config(one, tokenizer_dir, tmp_path / "tiny", eval_fraction=0.0001))


def test_two_processes_share_out_the_stream_and_resume(corpus_file, tokenizer_dir, tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2 ... --streaming`, then --resume with more steps."""
    from conftest import run_launcher

    output_dir = tmp_path / "ddp"
    base = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29531",
        "-m", "scratchbert.commands.pretrain", "--streaming", "--train-files", str(corpus_file), "--tokenizer", str(tokenizer_dir),
        "--output-dir", str(output_dir), "--hidden-size", "32", "--num-hidden-layers", "2", "--num-attention-heads", "4",
        "--intermediate-size", "64", "--max-position-embeddings", "64", "--max-seq-length", "32", "--batch-size", "8",
        "--eval-every", "0", "--save-every", "3", "--log-every", "1", "--max-eval-examples", "16", "--report-to", "none",
        "--no-progress-bar",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": python_path(REPO), "CUDA_VISIBLE_DEVICES": ""}  # CPU ranks, as on CI
    returncode, output = run_launcher([*base, "--max-steps", "6"], env, tmp_path, timeout=240)
    assert returncode == 0, output[-4000:]
    state = ckpt.read_trainer_state(ckpt.list_checkpoints(output_dir)[-1][1])
    assert state["stream"]["used"] > 0  # the stream's place, the same in both processes
    returncode, output = run_launcher([*base, "--max-steps", "9", "--resume"], env, tmp_path, timeout=240)
    assert returncode == 0, output[-4000:]
    assert "resuming from" in output and "step 6" in output
    records = [json.loads(line) for line in (output_dir / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["type"] == "train"] == list(range(1, 10))
    assert records[-1]["weight_checksums"][0] == records[-1]["weight_checksums"][1]
