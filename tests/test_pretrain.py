"""The pretraining loop: configuration, atomic checkpoints, exact resumption, errors, reloading, DDP.

Every run here is a tiny model (hidden 32, 2 layers, 4 heads) on a few documents of the
embedded corpus, for a handful of steps.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from conftest import (
    TINY_PRETRAIN,
    documentation_corpus,
    forget_kernel_choices,
    kill_after_saving,
    python_path,
    run_config_maker,
    run_launcher,
    run_log,
    saved_tokenizer,
    tiny_bert_config,
    trial_model,
)

from scratchbert import ScratchBertConfig, ScratchBertForPreTraining, cpu_gemm
from scratchbert.tokenization import load_tokenizer
from scratchbert.training.run_setup import add_config_arguments, config_from_args
from scratchbert.training.pretraining import checkpoint as ckpt
from scratchbert.training.pretraining import loop as pretrain_module
from scratchbert.training.pretraining import optimization, precision, processes
from scratchbert.training.pretraining.config import PRESETS, PretrainConfig
from scratchbert.training.pretraining.loop import NonFiniteLossError, pretrain
from scratchbert.training.run_setup import LOCK_FILE, OutputDirLock

REPO = Path(__file__).resolve().parents[1]

TINY = TINY_PRETRAIN  # conftest.py


# Accelerate keeps process-wide state; each in-process run here starts from none (conftest.py).
pytestmark = pytest.mark.usefixtures("fresh_accelerator_state")


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    """A small text file: 12 documents of the embedded CPython documentation, blank-line separated.

    Each document is flattened into one paragraph so the file's blank lines separate
    documents (not paragraphs); about 75 sentence pairs of 32 tokens, i.e. an epoch of
    ~9 batches of 8, so an 8-step run with accumulation 2 crosses an epoch boundary.
    """
    return documentation_corpus(tmp_path_factory, documents=40)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, corpus_file) -> Path:
    """One tokenizer for all runs: WordPiece training breaks ties differently from one process to
    the next, and runs that must match exactly need the same vocabulary."""
    return saved_tokenizer(tmp_path_factory, corpus_file, vocab_size=400)


@pytest.fixture(scope="module")
def tiny_config(corpus_file, tokenizer_dir):
    return run_config_maker(TINY, corpus_file, tokenizer_dir)


def final_weights(output_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(output_dir / "model.safetensors")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_config) -> Path:
    """One uninterrupted 8-step run with gradient accumulation 2 (the reference for resumption)."""
    AcceleratorState._reset_state(reset_partial_state=True)
    output_dir = tmp_path_factory.mktemp("runs") / "full"
    pretrain(tiny_config(output_dir, gradient_accumulation_steps=2))
    AcceleratorState._reset_state(reset_partial_state=True)
    return output_dir


# --- configuration -------------------------------------------------------------------


def test_presets_have_bert_miniature_geometry():
    expected = {"tiny": (2, 128), "mini": (4, 256), "small": (4, 512), "medium": (8, 512), "base": (12, 768)}
    assert PRESETS == expected
    for name, (layers, hidden) in expected.items():
        config = PretrainConfig(preset=name)
        assert (config.num_hidden_layers, config.hidden_size) == (layers, hidden)
        assert config.num_attention_heads == hidden // 64
        assert config.intermediate_size == 4 * hidden
        assert config.output_dir == str(Path("runs") / name)


def test_config_file_then_flags_override(tmp_path):
    import argparse

    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump({"preset": "mini", "learning-rate": 2e-4, "max_steps": 50, "train_files": ["a.txt"]}))
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, PretrainConfig)

    from_file = config_from_args(parser.parse_args(["--config", str(config_file)]), PretrainConfig)
    assert (from_file.preset, from_file.hidden_size, from_file.learning_rate, from_file.max_steps) == ("mini", 256, 2e-4, 50)
    assert from_file.train_files == ["a.txt"]
    assert from_file.batch_size == PretrainConfig.batch_size  # untouched fields keep their defaults

    overridden = config_from_args(
        parser.parse_args(["--config", str(config_file), "--max-steps", "7", "--hidden-size", "512", "--no-lowercase"]), PretrainConfig
    )
    assert (overridden.max_steps, overridden.hidden_size, overridden.num_attention_heads, overridden.lowercase) == (7, 512, 8, False)
    assert overridden.learning_rate == 2e-4

    # The resolved configuration saved as JSON loads back identically.
    overridden.save(tmp_path / "resolved.json")
    assert PretrainConfig.from_file(tmp_path / "resolved.json") == overridden


def test_config_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="max_seq_length=600 is longer than max_position_embeddings=512"):
        PretrainConfig(max_seq_length=600)
    with pytest.raises(ValueError, match="unknown pretraining option.*learnig_rate"):
        PretrainConfig.from_dict({"learnig_rate": 1e-3})
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        PretrainConfig(preset="huge")
    with pytest.raises(ValueError, match="not divisible"):
        PretrainConfig(hidden_size=100, num_attention_heads=3)
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="must hold a mapping"):
        PretrainConfig.from_file(tmp_path / "list.yaml")
    with pytest.raises(FileNotFoundError):
        PretrainConfig.from_file(tmp_path / "missing.yaml")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="fp16.*needs a GPU"):
            processes.build_accelerator(PretrainConfig(mixed_precision="fp16"))


def test_no_weight_decay_on_biases_and_layernorm():
    model = ScratchBertForPreTraining(ScratchBertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64))
    decay, no_decay = optimization.parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all(names[id(p)].endswith("bias") or "LayerNorm" in names[id(p)] for p in no_decay["params"])
    assert all(not names[id(p)].endswith("bias") and "LayerNorm" not in names[id(p)] for p in decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_adamw_is_fused_on_cpu_and_matches_the_per_parameter_loop_to_rounding():
    """The pretraining optimiser runs torch's fused kernel on a CPU; 5 steps of it stay within 1e-6 of the loop's weights."""
    torch.manual_seed(0)
    model = ScratchBertForPreTraining(ScratchBertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64))
    twin, start = copy.deepcopy(model), copy.deepcopy(model)
    fused = optimization.adamw(optimization.parameter_groups(model, 0.01), torch.device("cpu"), lr=1e-2, betas=(0.9, 0.999), eps=1e-6)
    loop = torch.optim.AdamW(optimization.parameter_groups(twin, 0.01), lr=1e-2, betas=(0.9, 0.999), eps=1e-6, foreach=False)
    assert fused.defaults["fused"] and not loop.defaults["fused"]
    for _ in range(5):
        for a, b in zip(model.parameters(), twin.parameters()):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        fused.step()
        loop.step()
    moved = max((a - b).abs().max().item() for a, b in zip(model.parameters(), twin.parameters()))
    assert moved <= 1e-6, f"fused AdamW left the loop's weights by {moved}"
    assert min((a - b).abs().max().item() for a, b in zip(model.parameters(), start.parameters())) > 1e-3, "every tensor should have moved"
    assert optimization.adamw([{"params": [torch.nn.Parameter(torch.ones(2))]}], torch.device("meta"), lr=1e-3, betas=(0.9, 0.999), eps=1e-6).defaults["fused"] is False


def test_learning_rate_warms_up_then_decays_linearly():
    factor = optimization.warmup_then_linear_decay(max_steps=10, warmup_steps=4)
    assert [round(factor(s), 4) for s in range(11)] == [0.25, 0.5, 0.75, 1.0, 1.0, 0.8333, 0.6667, 0.5, 0.3333, 0.1667, 0.0]


# --- checkpoints -------------------------------------------------------------------------


def _tiny_training_state():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def _train_one_step(model, optimizer):
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_checkpoint_crash_mid_write_leaves_previous_intact(tmp_path, monkeypatch):
    accelerator, model, optimizer = _tiny_training_state()
    _train_one_step(model, optimizer)
    state = {"step": 2, "epoch": 0, "batches_in_epoch": 2, "config": {}}
    saved = ckpt.save_checkpoint(accelerator, tmp_path, 2, state, keep_last=2)
    weights_at_2 = model.weight.detach().clone()
    files_at_2 = {p.name: p.read_bytes() for p in saved.iterdir()}

    # The process dies while writing step 4: some files written, then the crash.
    _train_one_step(model, optimizer)
    real_save_state = accelerator.save_state

    def crash_mid_write(output_dir, **kwargs):
        real_save_state(output_dir, **kwargs)
        (Path(output_dir) / "model.safetensors").write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(accelerator, "save_state", crash_mid_write)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(accelerator, tmp_path, 4, {**state, "step": 4}, keep_last=2)
    monkeypatch.undo()

    assert [step for step, _ in ckpt.list_checkpoints(tmp_path)] == [2]
    assert ckpt.list_checkpoints(tmp_path)[-1][1] == saved
    assert {p.name: p.read_bytes() for p in saved.iterdir()} == files_at_2  # byte for byte untouched
    assert (tmp_path / "checkpoints" / ".tmp-step-4").is_dir()  # the debris, ignored
    assert ckpt.load_checkpoint(accelerator, saved)["step"] == 2
    assert torch.equal(model.weight.detach(), weights_at_2)

    # The next save clears the debris and rotates to the last two.
    for step in (4, 6):
        _train_one_step(model, optimizer)
        ckpt.save_checkpoint(accelerator, tmp_path, step, {**state, "step": step}, keep_last=2)
    assert [step for step, _ in ckpt.list_checkpoints(tmp_path)] == [4, 6]
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_damaged_checkpoint_is_reported(tmp_path):
    broken = tmp_path / "checkpoints" / "step-3"
    broken.mkdir(parents=True)
    (broken / ckpt.STATE_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="damaged"):
        ckpt.read_trainer_state(broken)
    saved, now = PretrainConfig(num_hidden_layers=2, max_steps=8), PretrainConfig(num_hidden_layers=3, max_steps=9)
    assert ckpt.config_differences(saved.to_saved_dict(), now.to_dict()) == ["num_hidden_layers: checkpoint 2, now 3"]  # max_steps may change
    assert ckpt.config_differences({"num_hidden_layers": 2}, now.to_dict()) == ["num_hidden_layers: checkpoint 2, now 3"]  # the rest: defaults


# --- the loop ----------------------------------------------------------------------------


def test_stopped_and_resumed_run_ends_with_identical_weights(finished_run, tiny_config, tmp_path, monkeypatch):
    output_dir = tmp_path / "interrupted"
    config = tiny_config(output_dir, gradient_accumulation_steps=2)
    kill_after_saving(monkeypatch, 6, lambda: pretrain(config))  # 12 micro-batches in: past the first epoch, in the middle of the second
    state = ckpt.read_trainer_state(ckpt.list_checkpoints(output_dir)[-1][1])
    assert state["step"] == 6 and state["epoch"] >= 1 and state["batches_in_epoch"] > 0  # really mid-epoch
    assert not (output_dir / "model.safetensors").exists()

    AcceleratorState._reset_state(reset_partial_state=True)
    pretrain(tiny_config(output_dir, gradient_accumulation_steps=2, resume=True))

    expected, resumed = final_weights(finished_run), final_weights(output_dir)
    assert expected.keys() == resumed.keys()
    for name in expected:
        assert torch.equal(expected[name], resumed[name]), name
    # The log of the resumed run reads as one run: same losses, step by step.
    losses = lambda d: [(r["step"], r["loss"]) for r in run_log(d) if r["type"] == "train"]  # noqa: E731
    assert losses(output_dir) == losses(finished_run)


@pytest.mark.skipif(not cpu_gemm.ONEDNN or cpu_gemm.CAPABILITIES is None, reason="one kernel only here: nothing is chosen by timing")
def test_a_resumed_run_multiplies_on_the_kernels_the_stopped_run_chose(tiny_config, tmp_path, monkeypatch):
    """Each process times its CPU kernels afresh, and a busy machine can reorder two close ones; a
    resumed process that picked another kernel would sum in another order. The run keeps its
    decisions in its folder, and the resumed process takes them: no training product timed again,
    and the uninterrupted run's weights."""
    monkeypatch.setattr(cpu_gemm, "MIN_FLOPS", 0)  # the tiny model's products are rerouted as a real model's are
    monkeypatch.delenv("SCRATCHBERT_GEMM_CACHE", raising=False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")  # `accelerate launch --cpu`: on a machine with a GPU, train on the CPU's kernels
    measured, fastest = [], ["onednn"]

    def measure(gemm):  # this process's timings: fastest[0] wins
        measured.append(gemm)
        return {kernel: 0.5 if kernel == fastest[0] else 1.0 for kernel in cpu_gemm.candidates(gemm)}

    def new_process() -> None:
        forget_kernel_choices(monkeypatch)
        AcceleratorState._reset_state(reset_partial_state=True)

    monkeypatch.setattr(cpu_gemm, "measure", measure)
    new_process()
    pretrain(tiny_config(tmp_path / "full"))
    assert "onednn" in cpu_gemm.DECISIONS.values()
    expected = final_weights(tmp_path / "full")

    new_process()
    stopped = tmp_path / "stopped"
    kill_after_saving(monkeypatch, 4, lambda: pretrain(tiny_config(stopped)))
    assert "onednn" in json.loads((stopped / "kernel_decisions.json").read_text()).values()
    new_process()
    measured.clear()
    fastest[0] = "mkl"  # what the resumed process would choose, were it to time them
    pretrain(tiny_config(stopped, resume=True))
    assert [gemm for gemm in measured if not gemm.inference] == []
    resumed = final_weights(stopped)
    assert all(torch.equal(expected[name], resumed[name]) for name in expected)


def test_finished_run_reloads_with_auto_classes_and_fill_mask(finished_run):
    from transformers import AutoModel, AutoModelForPreTraining, AutoTokenizer, pipeline

    import scratchbert  # noqa: F401  (registers the Auto classes)

    tokenizer = AutoTokenizer.from_pretrained(finished_run)
    model = AutoModelForPreTraining.from_pretrained(finished_run)
    assert type(model).__name__ == "ScratchBertForPreTraining"
    assert model.config.vocab_size == len(tokenizer)
    encoder = AutoModel.from_pretrained(finished_run)
    batch = tokenizer("the return statement leaves a function.", return_tensors="pt")
    assert encoder(**batch).last_hidden_state.shape == (1, batch["input_ids"].shape[1], 32)
    predictions = pipeline("fill-mask", model=str(finished_run), tokenizer=str(finished_run))(f"a {tokenizer.mask_token} b")
    assert len(predictions) == 5

    records = run_log(finished_run)
    assert records[0]["type"] == "start" and torch.device(records[0]["device"]).type == ("cuda" if torch.cuda.is_available() else "cpu")
    train = [r for r in records if r["type"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 9))
    assert train[-1]["learning_rate"] == 0.0 and all(r["tokens_per_second"] > 0 for r in train)
    assert train[-1]["loss"] < train[0]["loss"]
    evals = [r for r in records if r["type"] == "eval"]
    assert [r["step"] for r in evals] == [4, 8]
    assert all(0 <= r["mlm_accuracy"] <= 1 and 0 <= r["nsp_accuracy"] <= 1 for r in evals)
    final = records[-1]
    assert final["type"] == "final" and final["eval_examples"] == records[0]["eval_examples"]
    assert (finished_run / "training_curves.png").stat().st_size > 10_000
    assert [step for step, _ in ckpt.list_checkpoints(finished_run)] == [6, 8]  # keep_last=2


def test_bf16_mixed_precision_trains_on_cpu_like_fp32(tiny_config, tmp_path):
    """`--mixed-precision bf16` on CPU (autocast; on a CPU without bf16 units the layers run on fp32
    kernels, see cpu_gemm.py): the same run as fp32 to bf16 rounding, fp32 weights saved."""
    losses = {}
    for precision in ("no", "bf16"):
        AcceleratorState._reset_state(reset_partial_state=True)
        output_dir = tmp_path / precision
        pretrain(tiny_config(output_dir, mixed_precision=precision, save_every=8))
        losses[precision] = [r["loss"] for r in run_log(output_dir) if r["type"] == "train"]
    assert len(losses["bf16"]) == 8 and all(torch.isfinite(torch.tensor(losses["bf16"])))
    assert losses["bf16"][-1] < losses["bf16"][0]
    assert losses["bf16"][0] == pytest.approx(losses["no"][0], rel=0.01)  # same weights and batch at step 1
    assert losses["bf16"][0] != losses["no"][0]  # but computed in bf16: autocast was on
    assert all(t.dtype == torch.float32 for t in final_weights(tmp_path / "bf16").values())


# --- the bag-of-words plateau -----------------------------------------------------------


def test_evaluation_scores_the_guess_that_reads_no_context():
    """Six scored tokens: one left as it was (the collator's "keep"), four [MASK]s with targets 7, 9, 9, 7 and
    one random replacement of a 9. Reading no context, one guesses the kept token and the most frequent
    [MASK]ed target: 1 + 2 of 6. Without the [MASK] id the random replacement's 9 would count too: 1 + 3."""
    from scratchbert import ScratchBertForMaskedLM
    from scratchbert.training.pretraining.evaluation import evaluate

    mask = 4
    input_ids = torch.tensor([[2, mask, mask, 30, 9, 3], [mask, 31, 32, 20, 33, mask]])
    labels = torch.full_like(input_ids, -100)
    labels[0, [1, 2, 4]] = torch.tensor([7, 9, 9])
    labels[1, [0, 3, 5]] = torch.tensor([9, 9, 7])
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "token_type_ids": torch.zeros_like(input_ids), "labels": labels}
    model = ScratchBertForMaskedLM(tiny_bert_config(vocab_size=40))
    metrics = evaluate(model, [batch], Accelerator(cpu=True), mask_token_id=mask)
    assert metrics["eval_masked_tokens"] == 6 and metrics["context_free_accuracy"] == pytest.approx(3 / 6)
    assert evaluate(model, [batch], Accelerator(cpu=True))["context_free_accuracy"] == pytest.approx(4 / 6)


@pytest.mark.parametrize(
    "metrics, warned",
    [
        ({"mlm_accuracy": 0.135, "context_free_accuracy": 0.136}, True),  # BBC News, tiny, at step 1,600: the plateau
        ({"mlm_accuracy": 0.044, "context_free_accuracy": 0.136}, True),  # never learned to copy a kept token
        ({"mlm_accuracy": 0.165, "context_free_accuracy": 0.136}, False),  # 200 steps later: it reads context
    ],
)
def test_plateau_report(metrics, warned):
    from scratchbert.training.pretraining.evaluation import plateau_report

    report = plateau_report(metrics)
    assert (report is not None) == warned
    if warned:
        assert "not yet learned to read context" in report and "--time-budget" in report and "--vocab-size" in report


def test_a_run_that_ends_on_the_plateau_says_so(finished_run, tiny_config, tmp_path, capsys):
    """Four steps teach a model word frequencies at most: the run says so, in its output and its log."""
    pretrain(tiny_config(tmp_path / "short", max_steps=4))
    out = capsys.readouterr().out
    assert "guessing from word frequencies alone" in out
    assert "warning: the model has not yet learned to read context" in out
    final = run_log(tmp_path / "short")[-1]
    assert final["mlm_accuracy"] < final["context_free_accuracy"] + 0.02
    assert final["plateau_warning"].startswith("the model has not yet learned to read context")
    assert all(0 < r["context_free_accuracy"] < 1 for r in run_log(finished_run) if r["type"] == "eval")


# --- errors ------------------------------------------------------------------------------


def test_held_out_passages_hide_one_whole_word_of_held_out_text(corpus_file, tokenizer_dir):
    """What `scratchbert pretrain` shows at the end on a user's corpus: held-out text, one word hidden."""
    from transformers import AutoTokenizer

    from scratchbert.training.pretraining.evaluation import held_out_passages

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    documents = corpus_file.read_text(encoding="utf-8").split("\n\n")
    stream = [token for document in documents for token in [*tokenizer(document, add_special_tokens=False)["input_ids"], tokenizer.sep_token_id]]
    examples = [{"input_ids": [tokenizer.cls_token_id, *stream[k : k + 62], tokenizer.sep_token_id]} for k in range(0, len(stream) - 62, 62)]

    passages = held_out_passages(examples, tokenizer, count=4, seed=3)
    assert len(passages) == 4
    for text, word in passages:
        assert text.count(tokenizer.mask_token) == 1
        assert word.isalpha() and len(word) >= 3 and word in tokenizer.get_vocab()  # a whole word, one token
        ids = tokenizer(text.replace(tokenizer.mask_token, word), add_special_tokens=False)["input_ids"]
        assert any(ids == example["input_ids"][k : k + len(ids)] for example in examples for k in range(64)), text  # text it was given
        assert not set(ids) & set(tokenizer.all_special_ids)  # never across a document boundary
        assert text[0].isalnum()  # it starts on a word, not on punctuation
    assert held_out_passages(examples, tokenizer, count=4, seed=3) == passages  # drawn from the seed
    assert held_out_passages(examples, tokenizer, count=4, seed=4) != passages
    assert held_out_passages([{"input_ids": example["input_ids"][:16]} for example in examples], tokenizer) == []  # too short


def test_existing_run_needs_resume_or_overwrite(finished_run, tiny_config):
    with pytest.raises(ValueError, match="already holds a run.*--resume.*--overwrite"):
        pretrain(tiny_config(finished_run, gradient_accumulation_steps=2))


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _copy_of(finished_run: Path, tmp_path: Path, checkpoints: bool = True) -> Path:
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(finished_run, run)
    if not checkpoints:
        shutil.rmtree(run / ckpt.CHECKPOINTS)
    return run


def test_a_finished_run_without_checkpoints_is_never_overwritten_by_accident(finished_run, tiny_config, tmp_path):
    run = _copy_of(finished_run, tmp_path, checkpoints=False)
    before = _snapshot(run)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="already holds a run.*saved model.*--overwrite"):
        pretrain(tiny_config(run, train_files=[str(empty)]))  # bad data: refused before reading it
    with pytest.raises(ValueError, match="already holds a run.*saved model.*--overwrite"):
        pretrain(tiny_config(run))  # good data: still refused without --overwrite
    assert _snapshot(run) == before


def test_overwrite_replaces_old_state_only_once_the_new_data_is_built(finished_run, tiny_config, tmp_path):
    run = _copy_of(finished_run, tmp_path)
    before = _snapshot(run)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n   \n")
    with pytest.raises(ValueError, match="no documents|holds no text"):
        pretrain(tiny_config(run, train_files=[str(empty)], overwrite=True))
    with pytest.raises(FileNotFoundError, match="no such corpus file"):
        pretrain(tiny_config(run, train_files=[str(tmp_path / "missing.txt")], overwrite=True))
    assert _snapshot(run) == before  # every checkpoint and the finished model are still there

    AcceleratorState._reset_state(reset_partial_state=True)
    pretrain(tiny_config(run, overwrite=True, max_steps=4))
    assert [step for step, _ in ckpt.list_checkpoints(run)] == [2, 4]  # the old run's 6 and 8 are gone
    assert run_log(run)[-1]["step"] == 4


def test_fsdp_and_deepspeed_on_cpu_are_refused_not_turned_into_ddp(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: FSDP is allowed here")
    for variable, name in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")):
        with monkeypatch.context() as patch:
            patch.setenv(variable, "true")
            with pytest.raises(ValueError, match=f"{name} shards the model across GPUs.*DDP over gloo.*accelerate launch --multi_gpu --num_processes 2 -m scratchbert.commands.pretrain"):
                processes.build_accelerator(PretrainConfig())


@pytest.mark.parametrize("rates, warned", [({"no": 39_500.0, "bf16": 31_000.0}, True), ({"no": 30_000.0, "bf16": 45_000.0}, False), (None, False)])
def test_bf16_on_a_cpu_where_a_trial_finds_fp32_faster_says_so(rates, warned, tiny_config, tmp_path, monkeypatch, caplog):
    """A rule on the CPU's flags missed an Intel Xeon with bf16 units and AMX hidden, where `tiny` trains
    a fifth slower in bf16: the run times its own model and batch (None: too large to time) and warns."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: bf16 runs there")
    asked = []
    trial = lambda make_model, batch, length, masking_rate, max_seconds: asked.append((trial_model(make_model), batch, length, masking_rate, max_seconds)) or rates  # noqa: E731
    monkeypatch.setattr(precision, "training_rates", trial)
    AcceleratorState._reset_state(reset_partial_state=True)
    with caplog.at_level("WARNING", logger="scratchbert.training.pretraining.precision"):
        pretrain(tiny_config(tmp_path / "run", mixed_precision="bf16", max_steps=2, save_every=0))
    config = tiny_config(tmp_path / "run")
    assert config.nsp  # the paper recipe: the trial trains the NSP head too, at the recipe's 15% masking
    model = ("ScratchBertForPreTraining", config.hidden_size, run_log(tmp_path / "run")[0]["vocab_size"])
    assert asked == [(model, config.batch_size, config.max_seq_length, config.mlm_probability, precision.TRIAL_SECONDS)]
    assert ("--mixed-precision bf16 trains slower than fp32 on this CPU: 31,000 against 39,500 tokens/s" in caplog.text) is warned
    assert run_log(tmp_path / "run")[-1]["type"] == "final"  # a note, never a change of what was asked


def test_a_time_budget_trains_in_the_precision_a_trial_finds_faster_and_a_resumed_run_keeps_it(tiny_config, tmp_path, monkeypatch, capsys):
    """Under --time-budget a faster step is more steps, so the default is `auto`: a timed trial of the run's
    model and batch picks bf16 or fp32 (fp32 was faster on an Intel Xeon with AMX hidden, bf16 1.9 times
    faster on a Zen 4). The saved options name the precision that ran, and a resumed run keeps it
    whatever a new trial would say. Without a time budget the default is fp32, untimed."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: auto picks by the GPU's bf16 support there")
    trials = []

    def trial(rates):
        return lambda make_model, batch, length, masking_rate, max_seconds: trials.append((trial_model(make_model), batch, length, max_seconds)) or rates

    output_dir = tmp_path / "budget"
    budget = {"time_budget": 5.0, "max_steps": 4, "save_every": 2}
    assert tiny_config(output_dir, **budget).mixed_precision == "auto"
    monkeypatch.setattr(precision, "training_rates", trial({"no": 30_000.0, "bf16": 45_000.0}))
    AcceleratorState._reset_state(reset_partial_state=True)
    kill_after_saving(monkeypatch, 2, lambda: pretrain(tiny_config(output_dir, **budget)))
    config = tiny_config(output_dir)
    vocabulary = len(load_tokenizer(config.tokenizer))  # the model's, from --tokenizer: not the 4,096 of a trained one
    assert trials == [(("ScratchBertForPreTraining", config.hidden_size, vocabulary), config.batch_size, config.max_seq_length, precision.TRIAL_SECONDS)]
    assert "--mixed-precision auto: fp32 30,000, bf16 45,000 tokens/s in a timed trial of this model and batch: training in bf16" in capsys.readouterr().out
    assert json.loads((output_dir / "pretrain_config.json").read_text())["mixed_precision"] == "bf16"

    monkeypatch.setattr(precision, "training_rates", trial({"no": 45_000.0, "bf16": 30_000.0}))  # this time fp32 would win
    AcceleratorState._reset_state(reset_partial_state=True)
    pretrain(tiny_config(output_dir, **budget, resume=True))
    assert len(trials) == 1 and "bf16, the precision of the checkpoint this run continues" in capsys.readouterr().out
    assert run_log(output_dir)[-1]["type"] == "final" and run_log(output_dir)[-1]["step"] == 4

    AcceleratorState._reset_state(reset_partial_state=True)
    pretrain(tiny_config(tmp_path / "steps", max_steps=2, save_every=0))  # no budget: fp32, and no trial
    assert len(trials) == 1 and json.loads((tmp_path / "steps" / "pretrain_config.json").read_text())["mixed_precision"] == "no"


def test_the_precision_trial_times_the_vocabulary_the_model_will_have(tiny_config, tokenizer_dir, tmp_path):
    """The MLM head's product with the vocabulary is a large share of a small model's step: the trial
    times the size `setup` will give the model (the tokenizer's, --vocab-size over it, or the size a
    trained one is asked for), and a bad --prepared-data folder is named before any trial runs."""
    from scratchbert.errors import ScratchBertError
    from scratchbert.training.pretraining.config import DEFAULT_VOCAB_SIZE
    from scratchbert.training.pretraining.processes import trial_vocab_size

    given = len(load_tokenizer(tokenizer_dir))
    assert given != DEFAULT_VOCAB_SIZE
    assert trial_vocab_size(tiny_config(tmp_path / "a")) == given
    assert trial_vocab_size(tiny_config(tmp_path / "b", vocab_size=2 * given)) == 2 * given
    assert trial_vocab_size(tiny_config(tmp_path / "c", tokenizer=None)) == DEFAULT_VOCAB_SIZE
    assert trial_vocab_size(tiny_config(tmp_path / "d", tokenizer=None, vocab_size=1000)) == 1000
    with pytest.raises(ScratchBertError, match="does not exist: build it with `scratchbert prepare-data"):
        trial_vocab_size(tiny_config(tmp_path / "e", tokenizer=None, train_files=[], prepared_data=str(tmp_path / "missing")))


def test_incompatible_checkpoint_is_refused(finished_run, tiny_config):
    with pytest.raises(ValueError, match="different options(.|\n)*hidden_size: checkpoint 32, now 64"):
        pretrain(tiny_config(finished_run, gradient_accumulation_steps=2, resume=True, hidden_size=64))


def test_tokenizer_vocabulary_must_match_the_model(tiny_config, tmp_path):
    with pytest.raises(ValueError, match=r"the tokenizer has \d+ tokens but the model's vocab_size is 999"):
        pretrain(tiny_config(tmp_path / "run", vocab_size=999))


class _MainProcess:
    """What `OutputDirLock.claim` reads of an Accelerator: the only process."""

    is_main_process = True
    num_processes = 1


# A second process that holds a folder as a running pretraining does, until it is killed.
HOLD_FOLDER = """
import sys, time
from scratchbert.training.run_setup import OutputDirLock
lock = OutputDirLock(sys.argv[1], "scratchbert pretrain")
lock.claim(type("Main", (), {"is_main_process": True, "num_processes": 1})(), writing=True)
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="Windows: runs are not locked")
def test_a_run_on_a_folder_another_run_holds_is_refused_and_changes_nothing(finished_run, tiny_config, tmp_path):
    """--resume would write checkpoints between the other run's, --overwrite delete them: both refused."""
    run = _copy_of(finished_run, tmp_path)
    env = {**os.environ, "PYTHONPATH": python_path(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD_FOLDER, str(run)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        during = _snapshot(run)
        for options in ({"resume": True}, {"overwrite": True}):
            message = rf"{run} is in use by another run \(scratchbert pretrain, process {holder.pid} on .+, since .+ UTC\)\. Wait for it"
            with pytest.raises(ValueError, match=message):
                pretrain(tiny_config(run, gradient_accumulation_steps=2, **options))
        assert _snapshot(run) == during  # every checkpoint, the model and the holder's note untouched
    finally:
        holder.kill()
        holder.wait()
    with OutputDirLock(run, "test") as lock:  # a killed run holds nothing: the folder is free, its stale note gone
        lock.claim(_MainProcess())
        assert not (run / LOCK_FILE).exists()


def test_a_run_holds_its_folder_while_it_writes_and_lets_go_after(tiny_config, tmp_path, monkeypatch):
    output_dir = tmp_path / "run"  # made by the run, and claimed once made
    seen = []
    real_train = pretrain_module.train

    def train_while_another_tries(run, timer):
        with OutputDirLock(output_dir, "test") as other, pytest.raises(ValueError, match=rf"in use by another run \(scratchbert pretrain, process {os.getpid()} on"):
            other.claim(_MainProcess())
        seen.append((output_dir / LOCK_FILE).read_text(encoding="utf-8"))
        return real_train(run, timer)

    monkeypatch.setattr(pretrain_module, "train", train_while_another_tries)
    pretrain(tiny_config(output_dir, max_steps=2, save_every=0))
    assert len(seen) == 1 and seen[0].startswith(f"scratchbert pretrain, process {os.getpid()} on ")
    assert not (output_dir / LOCK_FILE).exists()

    # A run refused for bad input lets go as well, and writes nothing into the folder.
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    folder = tmp_path / "existing"
    folder.mkdir()
    with pytest.raises(ValueError, match="no documents|holds no text"):
        pretrain(tiny_config(folder, train_files=[str(empty)]))
    assert not any(folder.iterdir())
    for path in (output_dir, folder):
        with OutputDirLock(path, "test") as lock:
            lock.claim(_MainProcess())


def test_empty_corpus_is_an_error(tiny_config, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n   \n\n")
    with pytest.raises(ValueError, match="no documents|holds no text"):
        pretrain(tiny_config(tmp_path / "run", train_files=[str(empty)]))


def test_too_few_documents_is_an_error_that_says_how_many_are_needed(tiny_config, tmp_path):
    two = tmp_path / "two.jsonl"
    two.write_text('{"text": "a good film with a good story."}\n{"text": "a bad film with a bad story."}\n')
    with pytest.raises(ValueError, match=r"has 2 document\(s\) and pretraining needs at least 4: 2 held out .* each row of a table is one"):
        pretrain(tiny_config(tmp_path / "run", train_files=[str(two)]))
    assert not (tmp_path / "run").exists()


class LossTurnsNaN(ScratchBertForPreTraining):
    """Returns a NaN loss from the 9th forward pass on (step 5 without accumulation)."""

    calls = 0

    def forward(self, **kwargs):
        output = super().forward(**kwargs)
        type(self).calls += 1
        if type(self).calls >= 9 and self.training:
            output.loss = output.loss * float("nan")
        return output


def train_instead(monkeypatch, model_class) -> None:
    """The runs that follow train `model_class` (a subclass with a fault put in) where the recipe's model would be."""
    real_new_model = PretrainConfig.new_model
    monkeypatch.setattr(PretrainConfig, "new_model", lambda config, *args, **options: model_class(real_new_model(config, *args, **options).config))


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tiny_config, tmp_path, monkeypatch):
    output_dir = tmp_path / "run"
    LossTurnsNaN.calls = 0
    train_instead(monkeypatch, LossTurnsNaN)
    with pytest.raises(NonFiniteLossError, match=r"became nan at step 9.*last good checkpoint is .*step-8"):
        pretrain(tiny_config(output_dir, max_steps=12, eval_every=0, save_every=4))
    assert [step for step, _ in ckpt.list_checkpoints(output_dir)] == [4, 8]
    assert not (output_dir / "model.safetensors").exists()
    weights = torch.load(ckpt.list_checkpoints(output_dir)[-1][1] / "optimizer.bin", weights_only=False)
    assert weights  # the last good checkpoint is intact and loadable


def test_nan_in_an_early_micro_batch_is_caught_with_one_check_per_optimizer_step(tiny_config, tmp_path, monkeypatch):
    """The loss check reads the host once per optimizer step (not per micro-batch, a GPU sync each),
    and a NaN in the first micro-batch of a step still stops the run before that step's update."""
    import scratchbert.training.pretraining.loop as pretrain_module

    checks = []
    real_check = pretrain_module._stop_if_not_finite
    monkeypatch.setattr(pretrain_module, "_stop_if_not_finite", lambda *a: (checks.append(a[3]), real_check(*a)))

    class OneNaN(LossTurnsNaN):  # only the 9th forward pass: the first micro-batch of step 5 with accumulation 2
        def forward(self, **kwargs):
            output = super().forward(**kwargs)
            if type(self).calls > 9:
                output.loss = output.loss.nan_to_num()
            return output

    OneNaN.calls = 0
    train_instead(monkeypatch, OneNaN)
    with pytest.raises(NonFiniteLossError, match=r"became nan or inf at step 5"):
        pretrain(tiny_config(tmp_path / "run", max_steps=12, eval_every=0, save_every=0, gradient_accumulation_steps=2))
    assert checks == [0, 1, 2, 3, 4]


def test_command_line_reports_errors_in_one_line(tmp_path, capsys):
    import argparse

    from scratchbert.commands import pretrain as pretrain_command

    code = pretrain_command.main(["--max-seq-length", "600", "--output-dir", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "max_seq_length=600 is longer than max_position_embeddings=512" in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())  # nothing written for a run that could not start

    # `scratchbert pretrain` is the same parser
    parser = argparse.ArgumentParser()
    pretrain_command.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["pretrain", "--preset", "mini", "--max-steps", "3", "--fill-mask", "a [MASK] b"])
    assert args.func is pretrain_command.run and args.preset == "mini" and args.fill_mask == ["a [MASK] b"]


# --- several processes -------------------------------------------------------------------


def test_two_process_ddp_on_cpu(corpus_file, tokenizer_dir, tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2`: gloo DDP on CPU. With `--mixed-precision auto`
    the main process alone times the precisions and tells the other rank what it chose."""
    output_dir = tmp_path / "ddp"
    flags = {**TINY, "dupe_factor": 2, "max_steps": 12, "eval_every": 6, "save_every": 6, "log_every": 3, "learning_rate": 5e-3, "mixed_precision": "auto"}
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29517",
        "-m", "scratchbert.commands.pretrain", "--train-files", str(corpus_file), "--tokenizer", str(tokenizer_dir),
        "--output-dir", str(output_dir),
    ]  # fmt: skip
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        command += [flag] if value is True else [f"--no-{flag[2:]}"] if value is False else [flag, str(value)]
    # No GPU for the ranks, as on CI: on a machine with one GPU, two ranks would both ask for it.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": python_path(REPO), "CUDA_VISIBLE_DEVICES": ""}
    returncode, output = run_launcher(command, env, tmp_path, timeout=240)
    assert returncode == 0, output[-4000:]
    assert output.count("--mixed-precision auto: fp32 ") == 1, output[-4000:]
    chosen = "bf16" if "training in bf16" in output else "no"
    assert json.loads((output_dir / "pretrain_config.json").read_text())["mixed_precision"] == chosen

    records = run_log(output_dir)
    assert records[0]["num_processes"] == 2
    train = [r["loss"] for r in records if r["type"] == "train"]
    assert train[-1] < train[0], train
    final = records[-1]
    assert len(final["weight_checksums"]) == 2 and final["weight_checksums"][0] == final["weight_checksums"][1]
    evals = [r for r in records if r["type"] == "eval"]
    # gathered over both processes: every held-out example counted once, none twice
    assert all(r["eval_examples"] == records[0]["eval_examples"] for r in evals)
    saved = set(os.listdir(ckpt.list_checkpoints(output_dir)[-1][1]))
    assert {"random_states_0.pkl", "random_states_1.pkl", "trainer_state.json"} <= saved  # each rank's RNG streams



def test_auto_precision_that_fails_on_the_main_process_stops_every_rank_instead_of_leaving_them_waiting(tiny_config, tmp_path, monkeypatch):
    """The main process decides `auto` and broadcasts it; when deciding fails (here a damaged checkpoint
    of the run to resume), the main process raises the error and the other ranks get it too."""
    from scratchbert.errors import ScratchBertError
    from scratchbert.training.pretraining import processes as accelerator_module

    output_dir = tmp_path / "damaged"
    (output_dir / "checkpoints" / "step-2").mkdir(parents=True)
    (output_dir / "checkpoints" / "step-2" / "trainer_state.json").write_text("{not json")
    config = tiny_config(output_dir, mixed_precision="auto", resume=True)
    sent = []

    class Rank:
        def __init__(self, is_main):
            self.is_main_process, self.num_processes = is_main, 2

    def broadcast(objects, from_process):  # rank 0 sends what it decided; rank 1 receives rank 0's last message
        if sent and objects == [None]:
            objects[0] = sent[-1]
        else:
            sent.append(objects[0])

    monkeypatch.setattr(accelerator_module, "broadcast_object_list", broadcast)
    monkeypatch.setattr(accelerator_module, "PartialState", lambda cpu: Rank(is_main=True))
    with pytest.raises(ScratchBertError, match="trainer_state.json is damaged") as main_error:
        accelerator_module.settle_mixed_precision(config)
    assert not main_error.value.every_process and sent[0][0] == "error"
    monkeypatch.setattr(accelerator_module, "PartialState", lambda cpu: Rank(is_main=False))
    with pytest.raises(ScratchBertError, match="main process could not settle --mixed-precision auto: .*damaged") as other_error:
        accelerator_module.settle_mixed_precision(config)
    assert other_error.value.every_process  # printed once, by the main process's own error

@pytest.mark.skipif(sys.platform == "win32", reason="Windows: runs are not locked")
def test_a_two_process_launch_on_a_held_folder_is_refused_once_and_on_every_rank(corpus_file, tokenizer_dir, tmp_path):
    """The main process finds the folder held and tells the other: both stop, and the error is printed once."""
    output_dir = tmp_path / "held"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": python_path(REPO), "CUDA_VISIBLE_DEVICES": ""}
    holder = subprocess.Popen([sys.executable, "-c", HOLD_FOLDER, str(output_dir)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        command = [
            sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29518",
            "-m", "scratchbert.commands.pretrain", "--train-files", str(corpus_file), "--tokenizer", str(tokenizer_dir),
            "--output-dir", str(output_dir), "--preset", "tiny", "--max-steps", "2", "--resume",
        ]  # fmt: skip
        returncode, output = run_launcher(command, env, tmp_path, timeout=180)
    finally:
        holder.kill()
        holder.wait()
    assert returncode not in (0, None), output[-4000:]
    refusals = [line for line in output.splitlines() if "is in use by another run" in line]
    assert len(refusals) == 1, output[-4000:]  # rank 1 stops too, silently
    assert refusals[0].startswith(f"scratchbert pretrain: error: {output_dir} is in use by another run (scratchbert pretrain, process {holder.pid} on ")


# --- the long phase -------------------------------------------------------------------


def assert_resumes_exactly(tiny_config, monkeypatch, output_dir: Path, config: dict, expected: dict, kill_at: int) -> None:
    """A run of `config` killed after saving at step `kill_at`, then resumed, ends on `expected` (the uninterrupted run's weights)."""
    AcceleratorState._reset_state(reset_partial_state=True)
    kill_after_saving(monkeypatch, kill_at, lambda: pretrain(tiny_config(output_dir, **config)))
    AcceleratorState._reset_state(reset_partial_state=True)
    pretrain(tiny_config(output_dir, **config, resume=True))
    resumed = final_weights(output_dir)
    assert all(torch.equal(expected[name], resumed[name]) for name in expected), kill_at


def test_long_phase_trains_the_positions_past_max_seq_length_and_resumes_exactly(tiny_config, tmp_path, monkeypatch):
    """--long-phase 0.5: steps 5-8 on 32-token examples. Without weight decay, position rows no example
    reaches stay at their initial values: rows 16-31 are trained only by the long phase. A run killed
    before the switch and one killed after it both resume to the uninterrupted run's weights."""
    from safetensors.torch import load_file

    base = {"recipe": "packed", "max_seq_length": 16, "weight_decay": 0.0, "max_steps": 8, "save_every": 2}
    long = {**base, "long_phase": 0.5, "long_seq_length": 32}
    pretrain(tiny_config(tmp_path / "short", **base))
    AcceleratorState._reset_state(reset_partial_state=True)
    pretrain(tiny_config(tmp_path / "long", **long))
    records = [r for r in run_log(tmp_path / "long") if r["type"] == "train"]
    assert [r["seq_length"] for r in records] == [16] * 4 + [32] * 4
    positions = lambda folder: load_file(folder / "model.safetensors")["bert.embeddings.position_embeddings.weight"]  # noqa: E731
    short, longer = positions(tmp_path / "short"), positions(tmp_path / "long")
    assert torch.equal(short[32:], longer[32:])  # reached by no example: both as initialised (same seed)
    assert not torch.equal(short[16:32], longer[16:32])  # reached by the long phase only
    expected = final_weights(tmp_path / "long")

    for kill_at in (2, 6):  # before and after the switch
        AcceleratorState._reset_state(reset_partial_state=True)
        output_dir = tmp_path / f"killed-{kill_at}"
        kill_after_saving(monkeypatch, kill_at, lambda output_dir=output_dir: pretrain(tiny_config(output_dir, **long)))
        assert ckpt.read_trainer_state(ckpt.list_checkpoints(output_dir)[-1][1])["phase"] == (kill_at > 4)
        AcceleratorState._reset_state(reset_partial_state=True)
        pretrain(tiny_config(output_dir, **long, resume=True))
        resumed = final_weights(output_dir)
        assert all(torch.equal(expected[name], resumed[name]) for name in expected), kill_at


def test_long_phase_options_are_checked(tiny_config, tmp_path):
    from scratchbert.errors import ScratchBertError

    with pytest.raises(ScratchBertError, match="long_seq_length=16: it must be longer than"):
        tiny_config(tmp_path, max_seq_length=16, long_phase=0.1, long_seq_length=16)
    with pytest.raises(ScratchBertError, match="long_seq_length=8: it must be longer than"):
        tiny_config(tmp_path, max_seq_length=16, long_phase=0.1, long_seq_length=8)
    with pytest.raises(ScratchBertError, match="long_seq_length=128: .*at most max_position_embeddings=64"):
        tiny_config(tmp_path, max_seq_length=16, long_phase=0.1, long_seq_length=128)
    assert tiny_config(tmp_path, max_seq_length=16, long_phase=0.1, long_seq_length=32).long_seq_length == 32
    with pytest.raises(ScratchBertError, match="long_phase=1.5"):
        tiny_config(tmp_path, long_phase=1.5)
    with pytest.raises(ScratchBertError, match="not with --streaming"):
        tiny_config(tmp_path, max_seq_length=16, long_phase=0.1, streaming=True)


def test_one_output_folder_check_for_every_command(tmp_path):
    """`check_output_folder`: a file refused; a folder holding anything refused without --overwrite (or --resume for a run)."""
    from scratchbert.training.pretraining.checkpoint import run_contents
    from scratchbert.training.run_setup import check_output_folder

    afile = tmp_path / "a.txt"
    afile.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        check_output_folder(afile, overwrite=True)
    assert check_output_folder(tmp_path / "new", overwrite=False) == tmp_path / "new"
    with pytest.raises(ValueError, match=r"already holds files.*--overwrite") as refused:
        check_output_folder(tmp_path, overwrite=False)
    assert "--resume" not in str(refused.value)  # a command without --resume is not told to pass it
    assert check_output_folder(tmp_path, overwrite=True) == tmp_path
    assert check_output_folder(tmp_path, overwrite=False, held=run_contents) == tmp_path  # stray files are no run
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"already holds a run.*--resume.*--overwrite"):
        check_output_folder(tmp_path, overwrite=False, resume=False, held=run_contents)
    assert check_output_folder(tmp_path, overwrite=False, resume=True, held=run_contents) == tmp_path


def _saved_before_the_removals(version: int, corpus_file, tokenizer_dir, output_dir) -> dict:
    """tests/data/pretrain_config_v{version}.json: TINY's run (accumulation 2) as scratchbert saved it at
    commit 9a075dd, version 8 with `config_version`, version 1 without it (and without what it lacked)."""
    text = (Path(__file__).parent / "data" / f"pretrain_config_v{version}.json").read_text(encoding="utf-8")
    for name, value in (("corpus_file", corpus_file), ("tokenizer_dir", tokenizer_dir), ("output_dir", output_dir)):
        text = text.replace("{" + name + "}", json.dumps(str(value))[1:-1])
    return json.loads(text)


@pytest.mark.parametrize("version", [8, 1])
def test_a_run_saved_before_the_removals_reads_and_resumes_exactly(version, finished_run, tiny_config, corpus_file, tokenizer_dir, tmp_path):
    """A version-8 save (objective, position_init, the masking schedule and long-phase batch keys, all off) and a
    version-1 save (none of the later keys: each reads as its default, the recipe as the paper's it trained)
    load as today's run, and its checkpoint resumes to the uninterrupted run's weights."""
    run = _copy_of(finished_run, tmp_path)
    saved = _saved_before_the_removals(version, corpus_file, tokenizer_dir, run)
    assert ("config_version" in saved) == (version == 8) and ("objective" in saved) == (version == 8)
    current = tiny_config(run, gradient_accumulation_steps=2, resume=True)
    assert PretrainConfig.from_dict(saved).to_dict() == {**current.to_dict(), "resume": False, "num_proc": 2}
    assert ckpt.config_differences(saved, current.to_dict()) == []
    *_, (_, before_last), (_, last) = ckpt.list_checkpoints(run)
    import shutil

    shutil.rmtree(last)  # resume from the checkpoint before the last, with the old save as its configuration
    state = json.loads((before_last / ckpt.STATE_FILE).read_text())
    (before_last / ckpt.STATE_FILE).write_text(json.dumps({**state, "config": saved}))
    (run / "pretrain_config.json").write_text(json.dumps(saved))
    pretrain(current)
    expected, resumed = final_weights(finished_run), final_weights(run)
    assert all(torch.equal(expected[name], resumed[name]) for name in expected)


@pytest.mark.parametrize("option, value", [
    ("objective", "electra"), ("position_init", "sinusoidal"), ("mlm_probability_end", 0.15),
    ("long_batch_size", 64), ("long_learning_rate", 5e-4), ("generator_layers", 1),
])  # fmt: skip
def test_a_save_that_used_a_removed_option_is_refused_with_the_commit_that_has_it(option, value, corpus_file, tokenizer_dir, tmp_path):
    saved = _saved_before_the_removals(8, corpus_file, tokenizer_dir, tmp_path)
    with pytest.raises(ValueError, match=rf"^{option}={value!r} was removed from scratchbert .*git checkout 9a075dd\)\.$"):
        PretrainConfig.from_dict({**saved, option: value})
    with pytest.raises(ValueError, match=f"{option}={value!r} was removed"):
        ckpt.config_differences({**saved, option: value}, PretrainConfig.from_dict(saved).to_dict())
    (tmp_path / "run.json").write_text(json.dumps({option: value}))
    with pytest.raises(ValueError, match=f"{option}={value!r} was removed"):  # a hand-written file too
        PretrainConfig.from_file(tmp_path / "run.json")


def test_help_lists_at_most_50_pretrain_and_25_prepare_data_options_and_the_rest_come_from_the_file(tmp_path, capsys):
    """Issue 75's budget of option lines; optimiser constants and dropouts have no flag but a --config
    file sets them (and the help says which), and prepare-data takes only what shapes the examples."""
    from scratchbert.commands import main

    def option_lines(command: str) -> list[str]:
        with pytest.raises(SystemExit):
            main([command, "--help"])
        lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
        return [line.split()[0].rstrip(",") for line in lines if line.startswith("--")]

    pretrain_options, prepare_options = option_lines("pretrain"), option_lines("prepare-data")
    assert len(pretrain_options) <= 50 and len(prepare_options) <= 25
    assert "--adam-beta1" not in pretrain_options and "--hidden-size" not in prepare_options
    assert set(prepare_options) <= set(pretrain_options) | {"--config"}  # the same flags for the same options
    (tmp_path / "run.yaml").write_text("adam_beta2: 0.98\nhidden_dropout_prob: 0.05\n")
    assert main(["pretrain", "--config", str(tmp_path / "run.yaml"), "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert any(line.split()[:3] == ["adam_beta2", "file", "0.98"] for line in printed.splitlines())
    assert any(line.split()[:3] == ["hidden_dropout_prob", "file", "0.05"] for line in printed.splitlines())
