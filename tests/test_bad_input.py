"""Bad input a user hands the commands: one line naming the problem and the fix, exit status 2, no traceback.

Each case is one a new user met (issue 79): compressed files that are cut short or are not
compressed, a model folder whose config.json is not JSON, an image name matplotlib cannot
write, export folders that are a file or the model's own folder, a tokenizer larger than the
model's vocabulary; and the faults of a pretraining run's folder: YAML numbers read as text, a
damaged checkpoint to resume, read-only folders, a full disk, Ctrl-C and SIGTERM, an interrupted
checkpoint rotation, two runs started into one new folder. The commands run in-process through
`scratchbert.commands.main`, as the console script runs them.
"""

from __future__ import annotations

import bz2
import errno
import gzip
import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from conftest import TINY_PRETRAIN, documentation_corpus, python_path, saved_tokenizer, tiny_bert_config

from scratchbert import ScratchBertForMaskedLM
from scratchbert.commands import main
from scratchbert.errors import ScratchBertError
from scratchbert.ingestion import DataError, load_documents, load_table, read_lines
from scratchbert.tokenization import train_tokenizer
from scratchbert.training.pretraining import checkpoint as ckpt
from scratchbert.training.pretraining import loop as pretrain_module
from scratchbert.training.pretraining.config import PretrainConfig
from scratchbert.training.run_setup import LOCK_FILE, OutputDirLock
from scratchbert.weights import model_folder

TEXT = "".join(f"document {n} has a few words of plain text in it.\n\n" for n in range(3000))


def one_line_error(capsys, argv: list[str]) -> str:
    """Run a command that must fail as a user's error: status 2 and one line on standard error, no traceback."""
    capsys.readouterr()  # what the test's own set-up printed
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("model")
    tokenizer = train_tokenizer([TEXT], vocab_size=60, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    ScratchBertForMaskedLM(tiny_bert_config(vocab_size=len(tokenizer), max_position_embeddings=64)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def copy_of(model_dir: Path, destination: Path) -> Path:
    shutil.copytree(model_dir, destination)
    return destination


# --------------------------------------------------------------------------------------
# Compressed files
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix, compress", [(".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress)])
def test_a_compressed_text_file_cut_short_is_named_with_the_fix(tmp_path, suffix, compress):
    data = compress(TEXT.encode())
    cut = tmp_path / f"corpus.txt{suffix}"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"corpus\.txt.* ends before its compressed stream does .*Download or copy it again"):
        load_documents(str(cut))
    with pytest.raises(DataError, match="ends before its compressed stream does"):
        list(read_lines([cut]))  # the tokenizer trainer's reader


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_plain_text_named_as_compressed_is_named_with_the_fix(tmp_path, suffix):
    fake = tmp_path / f"corpus.txt{suffix}"
    fake.write_text(TEXT)
    with pytest.raises(DataError, match=rf"is not a valid \{suffix} file .*name it without \{suffix} if it is plain text"):
        load_documents(str(fake))


def test_a_table_file_cut_short_is_named(tmp_path):
    rows = "".join(json.dumps({"text": f"row {n} of text", "label": n % 2}) + "\n" for n in range(20000))
    data = gzip.compress(rows.encode())
    cut = tmp_path / "train.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"train\.jsonl\.gz ends before its compressed stream does"):
        load_table([str(cut)])


def test_a_good_compressed_file_still_reads_whole(tmp_path):
    good = tmp_path / "corpus.txt.gz"
    good.write_bytes(gzip.compress(TEXT.encode()))
    assert len(load_documents(str(good))) == 3000


def test_pretrain_on_a_cut_file_is_one_line(tmp_path, capsys):
    data = gzip.compress(TEXT.encode())
    (tmp_path / "corpus.txt.gz").write_bytes(data[: len(data) // 2])
    err = one_line_error(capsys, ["pretrain", "--train-files", str(tmp_path / "corpus.txt.gz"), "--max-steps", "1",
                                  "--output-dir", str(tmp_path / "run"), "--no-progress-bar"])
    assert "corpus.txt.gz ends before its compressed stream does" in err


# --------------------------------------------------------------------------------------
# Model folders and outputs
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["{not json", "[1, 2]"])
def test_a_config_that_is_not_a_json_object_is_named(model_dir, tmp_path, content):
    damaged = copy_of(model_dir, tmp_path / "damaged")
    (damaged / "config.json").write_text(content)
    with pytest.raises(ScratchBertError, match=r"config\.json .*save the model again"):
        model_folder(damaged)


@pytest.mark.parametrize(
    "argv",
    [
        ["fill-mask", "a [MASK] word.", "--model", "{model}"],
        ["attention-map", "a word.", "--model", "{model}", "--out", "{tmp}/a.png"],
        ["export-onnx", "{model}", "{tmp}/onnx"],
        ["export-bert", "{model}", "{tmp}/bert"],
    ],
    ids=lambda argv: argv[0],
)
def test_every_command_names_a_damaged_config_in_one_line(model_dir, tmp_path, capsys, argv):
    damaged = copy_of(model_dir, tmp_path / "damaged")
    (damaged / "config.json").write_text("{not json")
    err = one_line_error(capsys, [arg.format(model=damaged, tmp=tmp_path) for arg in argv])
    assert "config.json is not valid JSON" in err


def test_attention_map_refuses_an_unknown_image_format(model_dir, tmp_path, capsys):
    err = one_line_error(capsys, ["attention-map", "a word.", "--model", str(model_dir), "--out", str(tmp_path / "attn.xyz")])
    assert ".xyz is not an image format" in err and ".png" in err
    assert not (tmp_path / "attn.xyz").exists()


def test_attention_map_refuses_a_folder_it_cannot_write(model_dir, tmp_path, capsys, monkeypatch):
    # As root every folder is writable, so the check is shown by what os.access answers for a read-only one.
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path and real_access(path, mode))
    err = one_line_error(capsys, ["attention-map", "a word.", "--model", str(model_dir), "--out", str(tmp_path / "a.png")])
    assert "is not writable" in err


@pytest.mark.parametrize("command", ["export-bert", "export-onnx"])
def test_exports_refuse_a_file_and_the_models_own_folder(model_dir, tmp_path, capsys, command):
    a_file = tmp_path / "out"
    a_file.write_text("keep me")
    assert "it is a file, not a folder" in one_line_error(capsys, [command, str(model_dir), str(a_file)])
    assert a_file.read_text() == "keep me"
    before = sorted(path.name for path in model_dir.iterdir())
    assert "the model's own folder" in one_line_error(capsys, [command, str(model_dir), str(model_dir)])
    assert sorted(path.name for path in model_dir.iterdir()) == before


@pytest.mark.parametrize("command", ["fill-mask", "attention-map", "finetune"])
def test_a_tokenizer_larger_than_the_vocabulary_is_named(model_dir, tmp_path, capsys, command):
    shrunk = tmp_path / "shrunk"
    model = ScratchBertForMaskedLM.from_pretrained(model_dir)
    model.resize_token_embeddings(20)
    model.save_pretrained(shrunk)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(model_dir / name, shrunk / name)
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"document {n} words,{n % 2}\n" for n in range(20)))
    argv = {
        "fill-mask": ["fill-mask", "a [MASK] word.", "--model", str(shrunk)],
        "attention-map": ["attention-map", "a word.", "--model", str(shrunk), "--out", str(tmp_path / "a.png")],
        "finetune": ["finetune", str(shrunk), "--train-file", str(tmp_path / "train.csv"), "--output-dir", str(tmp_path / "cls")],
    }[command]
    err = one_line_error(capsys, argv)
    assert "tokens but the model's vocabulary only 20" in err and "resize_token_embeddings" in err


# --------------------------------------------------------------------------------------
# A pretraining run's folder: config files, damaged checkpoints, permissions, disk, signals
# --------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run_flags(tmp_path_factory) -> list[str]:
    """`scratchbert pretrain` flags of a 4-step tiny run on a small corpus, checkpoints at 2 and 4."""
    corpus = documentation_corpus(tmp_path_factory, documents=40)
    tokenizer = saved_tokenizer(tmp_path_factory, corpus, vocab_size=400)
    values = {**TINY_PRETRAIN, "max_steps": 4, "eval_every": 0, "train_files": str(corpus), "tokenizer": str(tokenizer)}
    flags = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        flags += [flag] if value is True else [f"--no-{flag[2:]}"] if value is False else [flag, str(value)]
    return flags


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, run_flags) -> Path:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    folder = tmp_path_factory.mktemp("runs") / "finished"
    assert main(["pretrain", *run_flags, "--output-dir", str(folder), "--fill-mask"]) == 0
    AcceleratorState._reset_state(reset_partial_state=True)
    return folder


def snapshot(folder: Path) -> dict:
    """Every file under `folder`, byte for byte (and every folder, by name)."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def pretrain_argv(run_flags, output_dir: Path, *more: str) -> list[str]:
    return ["pretrain", *run_flags, "--output-dir", str(output_dir), "--fill-mask", *more]


def test_yaml_numbers_read_as_text_are_numbers_and_other_text_is_named(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("learning_rate: 1e-3\nmax_steps: 2e3\nwarmup_ratio: .05\n")  # YAML 1.1: the first two are strings
    assert main(["pretrain", "--config", str(config), "--print-config"]) == 0
    table = capsys.readouterr().out
    assert "learning_rate" in table and "0.001" in table and "2000" in table
    loaded = PretrainConfig.from_file(config)
    assert (loaded.learning_rate, loaded.max_steps) == (0.001, 2000) and isinstance(loaded.max_steps, int)
    for text, kind in (("learning_rate: fast", "a number"), ("max_steps: 1.5e2.0", "an integer"), ("max_steps: 2.55e1", "an integer")):
        config.write_text(text + "\n")
        err = one_line_error(capsys, ["pretrain", "--config", str(config), "--print-config"])
        assert f"option {text.split(':')[0]} in the --config file is" in err and f"not {kind}" in err and "write a number there" in err


@pytest.mark.usefixtures("fresh_accelerator_state")
@pytest.mark.parametrize("damaged_file", ["model.safetensors", "optimizer.bin"])
def test_resuming_a_damaged_checkpoint_names_it_offers_the_one_before_and_changes_nothing(finished_run, run_flags, tmp_path, capsys, damaged_file):
    run = copy_of(finished_run, tmp_path / "run")
    damaged = run / "checkpoints" / "step-4" / damaged_file
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    before = snapshot(run)
    err = one_line_error(capsys, pretrain_argv(run_flags, run, "--resume"))
    assert f"the newest checkpoint {run / 'checkpoints' / 'step-4'} is damaged ({damaged_file}" in err
    assert "move it away or delete it to resume from step-2, the newest complete one" in err
    assert snapshot(run) == before  # pretrain_config.json, the log, the lock: nothing written

    shutil.rmtree(run / "checkpoints" / "step-2")
    assert "no earlier checkpoint is complete" in one_line_error(capsys, pretrain_argv(run_flags, run, "--resume"))


@pytest.mark.usefixtures("fresh_accelerator_state")
def test_read_only_output_folders_are_refused_before_any_work(finished_run, run_flags, model_dir, tmp_path, capsys, monkeypatch):
    # As root every folder is writable, so a read-only one is what os.access answers for it.
    read_only = {tmp_path / "ro", tmp_path / "run"}
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) not in read_only and real_access(path, mode))
    (tmp_path / "ro").mkdir()
    err = one_line_error(capsys, pretrain_argv(run_flags, tmp_path / "ro" / "new"))
    assert f"--output-dir {tmp_path / 'ro' / 'new'}: {tmp_path / 'ro'}, where it would be made, is read-only" in err
    assert not any((tmp_path / "ro").iterdir())

    run = copy_of(finished_run, tmp_path / "run")
    before = snapshot(run)
    assert f"--output-dir {run}: it is read-only for this user" in one_line_error(capsys, pretrain_argv(run_flags, run, "--resume"))
    assert snapshot(run) == before

    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"document {n} words,{n % 2}\n" for n in range(20)))
    argv = ["finetune", str(model_dir), "--train-file", str(tmp_path / "train.csv"), "--output-dir", str(tmp_path / "ro" / "cls")]
    assert "is read-only for this user" in one_line_error(capsys, argv)


def test_a_lock_that_cannot_be_written_is_one_error(tmp_path, monkeypatch):
    """The folder lock's own writes (its folder, the note of who holds it) refused: the folder named, not a PermissionError."""
    real_write = Path.write_text

    def read_only(path, *args, **kwargs):
        if path.name == LOCK_FILE:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_write(path, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", read_only)
    main_process = type("Main", (), {"is_main_process": True, "num_processes": 1})()
    with OutputDirLock(tmp_path / "run", "test") as lock, pytest.raises(ScratchBertError, match=r"run is not writable \(Permission denied: .*\.scratchbert\.lock\): choose another --output-dir"):
        lock.claim(main_process, writing=True)


def _accelerator_and_model():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return accelerator, *accelerator.prepare(model, optimizer)


@pytest.mark.usefixtures("fresh_accelerator_state")
def test_a_full_disk_during_a_checkpoint_leaves_nothing_half_written(tmp_path, monkeypatch):
    accelerator, _, _ = _accelerator_and_model()
    state = {"step": 2, "epoch": 0, "batches_in_epoch": 2, "config": {}}
    saved = ckpt.save_checkpoint(accelerator, tmp_path, 2, state, keep_last=2)
    real_save_state = accelerator.save_state

    def disk_fills_up(output_dir, **kwargs):
        real_save_state(output_dir, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(accelerator, "save_state", disk_fills_up)
    with pytest.raises(ScratchBertError, match=rf"the disk is full: checkpoint step-4 could not be written .* {saved} is still the newest checkpoint\. Free some space"):
        ckpt.save_checkpoint(accelerator, tmp_path, 4, {**state, "step": 4}, keep_last=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-2"]  # no .tmp-step-4


@pytest.mark.usefixtures("fresh_accelerator_state")
def test_a_full_disk_in_a_run_is_one_line_and_keeps_the_runs_record(finished_run, run_flags, tmp_path, capsys, monkeypatch):
    real_save_state = Accelerator.save_state

    def disk_fills_up(self, output_dir=None, **kwargs):
        real_save_state(self, output_dir, **kwargs)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")  # torch's words for it

    monkeypatch.setattr(Accelerator, "save_state", disk_fills_up)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 4096, 4096))
    err = one_line_error(capsys, pretrain_argv(run_flags, tmp_path / "new", "--max-steps", "2"))
    assert "the disk is full: checkpoint step-2 could not be written" in err and "no checkpoint was kept" in err
    assert not list((tmp_path / "new" / "checkpoints").iterdir())

    # The first write of a resumed run fails: the run's configuration stays as it was.
    run = copy_of(finished_run, tmp_path / "run")
    before = snapshot(run)
    real_write = Path.write_text

    def full(path, *args, **kwargs):
        if path.name.endswith(".partial"):
            real_write(path, "{", encoding="utf-8")
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_write(path, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    assert "is full (No space left on device): free some space" in one_line_error(capsys, pretrain_argv(run_flags, run, "--resume"))
    assert snapshot(run) == before


@pytest.mark.usefixtures("fresh_accelerator_state")
def test_a_full_disk_at_the_final_save_leaves_no_half_model(run_flags, tmp_path, capsys, monkeypatch):
    from transformers import PreTrainedModel

    def disk_fills_up(self, folder, **kwargs):
        (Path(folder) / "model.safetensors").write_bytes(b"half a model")
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")  # safetensors' words

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", disk_fills_up)
    output_dir = tmp_path / "run"
    err = one_line_error(capsys, pretrain_argv(run_flags, output_dir, "--max-steps", "2"))
    assert f"the final model could not be saved in {output_dir}" in err and "step-2, is whole" in err and "--resume" in err
    assert not (output_dir / "model.safetensors").exists() and [step for step, _ in ckpt.list_checkpoints(output_dir)] == [2]


def _signal_at_step(monkeypatch, signum: int, step: int) -> None:
    """The process gets `signum` right after optimizer step `step` (its checkpoint, if due, saved)."""
    real_long_phase_due = pretrain_module.Run.long_phase_due  # asked once a step, after its log, evaluation and checkpoint
    signalled = []

    def long_phase_due_then_signal(run):
        if run.position.step == step and not signalled:
            signalled.append(step)
            os.kill(os.getpid(), signum)
        return real_long_phase_due(run)

    monkeypatch.setattr(pretrain_module.Run, "long_phase_due", long_phase_due_then_signal)


@pytest.mark.usefixtures("fresh_accelerator_state")
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_and_sigterm_say_where_resume_starts_and_exit_with_the_signals_status(run_flags, tmp_path, capsys, monkeypatch, signum, status):
    _signal_at_step(monkeypatch, signum, step=3)
    # Python turns SIGINT into KeyboardInterrupt unless it was ignored at startup, as a shell ignores
    # it for a job started in the background with `&` (CI may run so): a terminal's Ctrl-C reaches it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    output_dir = tmp_path / "run"
    try:
        assert main(pretrain_argv(run_flags, output_dir)) == status
    finally:
        signal.signal(signal.SIGINT, previous)
    out, err = capsys.readouterr()
    assert f"interrupted at step 3: the last checkpoint is {output_dir / 'checkpoints' / 'step-2'}; `--resume` continues from it" in out
    assert err.strip().splitlines()[-1] == f"scratchbert pretrain: stopped by {signal.Signals(signum).name}" and "Traceback" not in err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and not (output_dir / LOCK_FILE).exists()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_to_the_console_command_exits_143_without_a_traceback(run_flags, tmp_path):
    """The real thing: `kill PID` to a running `python -m scratchbert pretrain`, once it has saved a checkpoint."""
    output_dir = tmp_path / "run"
    argv = pretrain_argv(run_flags, output_dir, "--max-steps", "100000", "--save-every", "2")
    env = {**os.environ, "PYTHONPATH": python_path(REPO), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "scratchbert", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = 120
        while not ckpt.list_checkpoints(output_dir) and process.poll() is None and deadline > 0:
            subprocess.run(["sleep", "0.2"])
            deadline -= 0.2
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 143, err[-3000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "scratchbert pretrain: stopped by SIGTERM", err[-3000:]
    assert "`--resume` continues from it" in out, out[-3000:]


@pytest.mark.usefixtures("fresh_accelerator_state")
def test_an_interrupted_rotation_leaves_every_checkpoint_complete_or_gone(tmp_path, monkeypatch):
    accelerator, _, _ = _accelerator_and_model()
    state = {"epoch": 0, "batches_in_epoch": 0, "config": {}}
    for step in (1, 2):
        ckpt.save_checkpoint(accelerator, tmp_path, step, {**state, "step": step}, keep_last=2)
    real_rmtree = shutil.rmtree

    def interrupted_rmtree(path, *args, **kwargs):  # Ctrl-C after the first file of the oldest checkpoint
        next(p for p in Path(path).iterdir() if p.is_file()).unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", interrupted_rmtree)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(accelerator, tmp_path, 3, {**state, "step": 3}, keep_last=2)
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    root = tmp_path / "checkpoints"
    names = sorted(p.name for p in root.iterdir())
    assert names == [".deleting-step-1", "step-2", "step-3"], names
    complete = lambda path: {"model.safetensors", "optimizer.bin", ckpt.STATE_FILE} <= {p.name for p in path.iterdir()}  # noqa: E731
    assert all(complete(root / name) for name in names if name.startswith("step-"))
    assert [step for step, _ in ckpt.list_checkpoints(tmp_path)] == [2, 3]

    ckpt.save_checkpoint(accelerator, tmp_path, 4, {**state, "step": 4}, keep_last=2)  # finishes the deletion
    assert sorted(p.name for p in root.iterdir()) == ["step-3", "step-4"]


@pytest.mark.usefixtures("fresh_accelerator_state")
def test_a_run_that_finishes_in_a_new_folder_while_another_prepares_its_data_is_not_overwritten(finished_run, run_flags, tmp_path, capsys, monkeypatch):
    """Two runs into one new folder, no --overwrite: the slower one, still preparing its data when the
    other finished there, must refuse the folder rather than overwrite the finished model."""
    output_dir = tmp_path / "new"
    real_new_model = PretrainConfig.new_model

    def the_other_run_finishes_meanwhile(config, *args, **options):
        shutil.copytree(finished_run, output_dir)  # made, written and let go by the other run
        return real_new_model(config, *args, **options)

    monkeypatch.setattr(PretrainConfig, "new_model", the_other_run_finishes_meanwhile)
    err = one_line_error(capsys, pretrain_argv(run_flags, output_dir))
    assert f"--output-dir {output_dir} was empty when this run started, but another run has since written a run (checkpoints up to step-4)" in err
    assert snapshot(output_dir) == snapshot(finished_run)


def two_process_launch(port: int, argv: list[str]) -> list[str]:
    """`accelerate launch` of `scratchbert <argv>` in two CPU processes (gloo)."""
    return [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
        "-m", f"scratchbert.commands.{argv[0]}", *argv[1:],
    ]  # fmt: skip


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_to_a_two_process_launch_stops_every_rank_with_one_message(run_flags, tmp_path):
    """SIGTERM to the whole job, as `scancel` or Kubernetes send it: every rank says nothing but the one
    message of the main process, and lets go of the folder. (The launcher, torch's elastic agent,
    prints its own traceback of the signal; that is not scratchbert's to change.)"""
    output_dir = tmp_path / "run"
    command = two_process_launch(29533, pretrain_argv(run_flags, output_dir, "--max-steps", "100000", "--save-every", "2"))
    env = {**os.environ, "PYTHONPATH": python_path(REPO), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        for _ in range(1200):
            if ckpt.list_checkpoints(output_dir) or process.poll() is not None:
                break
            subprocess.run(["sleep", "0.2"])
        os.killpg(process.pid, signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
    assert output.count("interrupted at step ") == 1 and output.count("scratchbert pretrain: stopped by SIGTERM") == 1, output[-4000:]
    assert "`--resume` continues from it" in output and "Terminated" not in output and "KeyboardInterrupt" not in output, output[-4000:]
    assert not (output_dir / LOCK_FILE).exists() and ckpt.list_checkpoints(output_dir)


# Another run finishes in the folder while this launch prepares its data (run by each process at start).
FINISH_MEANWHILE = """
import os, shutil
from scratchbert.training.pretraining.config import PretrainConfig

real_new_model = PretrainConfig.new_model

def the_other_run_finishes_meanwhile(config, *args, **options):
    if os.environ.get("RANK", "0") == "0":
        shutil.copytree(os.environ["FINISHED_RUN"], os.environ["OUTPUT_DIR"])
    return real_new_model(config, *args, **options)

PretrainConfig.new_model = the_other_run_finishes_meanwhile
"""


@pytest.mark.slow  # about 40 s: two processes, each importing the training code twice
def test_a_two_process_launch_refuses_a_folder_another_run_finished_in_meanwhile_on_every_rank(finished_run, run_flags, tmp_path):
    output_dir = tmp_path / "new"
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text("import os\nif os.environ.get('OUTPUT_DIR'):\n    exec(" + repr(FINISH_MEANWHILE) + ")\n")
    env = {
        **os.environ, "PYTHONPATH": python_path(tmp_path / "site", REPO), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
        "FINISHED_RUN": str(finished_run), "OUTPUT_DIR": str(output_dir),
    }  # fmt: skip
    result = subprocess.run(two_process_launch(29534, pretrain_argv(run_flags, output_dir)), capture_output=True, text=True, env=env, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and output.count("another run has since written a run (checkpoints up to step-4)") == 1, output[-4000:]
    assert snapshot(output_dir) == snapshot(finished_run)
