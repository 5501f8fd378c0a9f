"""The `scratchbert` command line as a whole: one error path, globs everywhere, corrupt weights.

Each command is run in-process through `scratchbert.commands.main`, exactly as the console
script runs it, on a tiny model and a few lines of text.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_bert_config

from scratchbert import ScratchBertForMaskedLM
from scratchbert.commands import COMMANDS, main
from scratchbert.tokenization import train_tokenizer

REPO = Path(__file__).resolve().parents[1]
SENTENCES = [
    "the cat sat on the mat and the dog sat on the log.",
    "a good film with a good story and good actors.",
    "a bad film with a bad story and bad actors.",
    "the loop ends early when the break statement runs.",
]


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory) -> Path:
    """Three small text files (documents separated by blank lines) in one folder."""
    folder = tmp_path_factory.mktemp("texts")
    for index in range(3):
        documents = [" ".join(SENTENCES[(index + k) % 4] for _ in range(6)) for k in range(4)]
        (folder / f"part{index}.txt").write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, text_dir) -> Path:
    """A tiny masked-LM checkpoint with its tokenizer, as `scratchbert pretrain` leaves one."""
    folder = tmp_path_factory.mktemp("model")
    tokenizer = train_tokenizer(sorted(map(str, text_dir.glob("*.txt"))), vocab_size=80, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    ScratchBertForMaskedLM(tiny_bert_config(vocab_size=len(tokenizer), max_position_embeddings=64)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def corrupt_model_dir(model_dir, tmp_path) -> Path:
    """The checkpoint with its model.safetensors cut in half (a copy interrupted mid-way)."""
    folder = tmp_path / "corrupt"
    folder.mkdir()
    for path in model_dir.iterdir():
        data = path.read_bytes()
        (folder / path.name).write_bytes(data[: len(data) // 2] if path.name == "model.safetensors" else data)
    return folder


@pytest.fixture(scope="module")
def labelled_csvs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("labelled")
    for part in range(2):
        rows = [f"{SENTENCES[(i + part) % 3]},{'pos' if 'good' in SENTENCES[(i + part) % 3] else 'neg'}" for i in range(12)]
        (folder / f"train{part}.csv").write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return folder


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- the command line depends on the library, never the reverse ------------------------------


def test_the_library_never_imports_the_command_line():
    """No module of the library names `scratchbert.commands` in an import."""
    offenders = []
    for path in (REPO / "scratchbert").rglob("*.py"):
        if path.parts[-2] == "commands" or path.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [alias.name for alias in node.names]
                if any(module.startswith("scratchbert.commands") for module in modules):
                    offenders.append(f"{path.name}: {', '.join(modules)}")
    assert not offenders, offenders


def test_every_command_has_help_and_one_error_path(capsys):
    names = {command.__name__.rsplit(".", 1)[-1].replace("_", "-") for command in COMMANDS}
    assert {"train-tokenizer", "pretrain", "finetune", "fill-mask", "attention-map", "export-bert", "export-onnx"} <= names
    for name in names:
        with pytest.raises(SystemExit) as exit_info:
            main([name, "--help"])
        assert exit_info.value.code == 0
    assert "usage: scratchbert" in capsys.readouterr().out


# One concept, one flag: what each command reads and writes is named alike wherever it appears.
SHARED_FLAGS = {
    "--train-files": ("train-tokenizer", "prepare-data", "pretrain", "finetune"),
    "--output-dir": ("train-tokenizer", "prepare-data", "pretrain", "finetune"),
    "--tokenizer": ("prepare-data", "pretrain"),  # finetune: the checkpoint's own, or `tokenizer:` in --config
    "--no-progress-bar": ("prepare-data", "pretrain", "finetune"),
    "--overwrite": ("train-tokenizer", "prepare-data", "pretrain", "finetune"),
}


@pytest.mark.parametrize("flag", sorted(SHARED_FLAGS))
def test_one_concept_has_one_flag_in_every_command(flag):
    from scratchbert.commands import build_parser

    subcommands = next(action for action in build_parser()._actions if action.dest == "command").choices
    lacking = [name for name in SHARED_FLAGS[flag] if flag not in subcommands[name]._option_string_actions]
    assert not lacking, f"{flag} is not a flag of: {', '.join(lacking)}"


# --- globs work the same in every command that takes files -----------------------------------


def test_train_tokenizer_expands_quoted_globs(text_dir, tmp_path, capsys):
    code, out, err = run(capsys, "train-tokenizer", "--train-files", f"{text_dir}/*.txt", "--vocab-size", "70", "--min-frequency", "1", "--output-dir", tmp_path / "tok")
    assert code == 0, err
    assert (tmp_path / "tok" / "vocab.txt").is_file() and "saved an uncased WordPiece tokenizer" in out
    code, _, err = run(capsys, "train-tokenizer", "--train-files", f"{text_dir}/*.md", "--output-dir", tmp_path / "tok2")
    assert code == 2 and "matches the glob" in err and len(err.strip().splitlines()) == 1


def test_pretrain_expands_quoted_globs(text_dir, model_dir, tmp_path, capsys, fresh_accelerator_state):
    out = tmp_path / "run"
    flags = ["--hidden-size", "32", "--num-hidden-layers", "1", "--num-attention-heads", "4", "--intermediate-size", "64",
             "--max-position-embeddings", "64", "--max-seq-length", "32", "--batch-size", "4", "--max-steps", "2",
             "--eval-every", "0", "--save-every", "0", "--no-progress-bar", "--report-to", "none"]  # fmt: skip
    code, out_text, err = run(capsys, "pretrain", "--train-files", f"{text_dir}/part*.txt", "--tokenizer", model_dir, "--output-dir", out, *flags)
    assert code == 0, err
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["type"] == "final" and log[-1]["step"] == 2
    # On the user's own text the run ends with held-out passages, a word hidden in each, beside the word.
    shown = out_text.split("what the model fills in (held-out text, the hidden word in brackets; ", 1)[1].splitlines()[1:]
    passages = [line for line in shown if "[MASK]" in line]
    assert passages and all(line.rstrip().endswith("]") and line.count("[MASK]") == 1 for line in passages), out_text


def test_finetune_expands_quoted_globs(labelled_csvs, model_dir, tmp_path, capsys):
    code, out, err = run(
        capsys, "finetune", model_dir, "--train-file", f"{labelled_csvs}/train*.csv", "--output-dir", tmp_path / "clf",
        "--epochs", "1", "--batch-size", "8", "--max-length", "32", "--no-progress-bar",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert 0.0 <= summary["validation"]["accuracy"] <= 1.0


# --- truncated or corrupt weights: the same one line in every command ------------------------


def test_corrupt_weights_give_one_line_in_every_command(corrupt_model_dir, labelled_csvs, tmp_path, capsys):
    commands = {
        "finetune": ["finetune", corrupt_model_dir, "--train-file", labelled_csvs / "train0.csv", "--output-dir", tmp_path / "clf"],
        "export-bert": ["export-bert", corrupt_model_dir, tmp_path / "bert"],
        "fill-mask": ["fill-mask", "the cat sat on the [MASK].", "--model", corrupt_model_dir],
        "attention-map": ["attention-map", "the cat sat.", "--model", corrupt_model_dir, "--out", tmp_path / "a.png"],
        "export-onnx": ["export-onnx", corrupt_model_dir, tmp_path / "onnx"],
    }
    for name, argv in commands.items():
        code, _, err = run(capsys, *argv)
        assert code == 2, (name, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, (name, err)
        assert lines[0].startswith(f"scratchbert {name}: error: ") and "model.safetensors is corrupt or incomplete" in lines[0], err
    assert not (tmp_path / "bert" / "model.safetensors").exists()  # nothing exported from a corrupt file
    assert not (tmp_path / "clf").exists() and not (tmp_path / "onnx").exists()


def test_export_onnx_command_runs_and_checks_the_graph(model_dir, tmp_path, capsys):
    pytest.importorskip("onnxruntime", reason="onnxruntime is in the test extra (pip install -e .[test])")
    code, out, err = run(capsys, "export-onnx", model_dir, tmp_path / "onnx", "--task", "fill-mask")
    assert code == 0, err
    assert (tmp_path / "onnx" / "model.onnx").is_file() and "onnxruntime matches PyTorch" in out


def test_export_bert_reads_back_what_it_wrote(model_dir, tmp_path, capsys):
    from transformers import BertForMaskedLM

    code, out, err = run(capsys, "export-bert", model_dir, tmp_path / "bert")
    assert code == 0, err
    ours = ScratchBertForMaskedLM.from_pretrained(model_dir).eval()
    theirs = BertForMaskedLM.from_pretrained(tmp_path / "bert").eval()
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    torch.testing.assert_close(theirs(ids).logits, ours(ids).logits, atol=1e-5, rtol=1e-5)


@pytest.fixture
def hub_cache(model_dir, tmp_path, monkeypatch) -> Path:
    """An offline Hugging Face Hub cache holding one repository, "scratchbert-test/tiny-mlm": the
    layout `snapshot_download` writes (refs/main names the commit, snapshots/<commit>/ holds its files)."""
    import huggingface_hub

    from scratchbert import weights

    cache, commit = tmp_path / "hub", "0123456789abcdef0123456789abcdef01234567"
    repository = cache / "models--scratchbert-test--tiny-mlm"
    (repository / "refs").mkdir(parents=True)
    (repository / "refs" / "main").write_text(commit)
    snapshot = repository / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for path in model_dir.iterdir():
        (snapshot / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    weights.hub_snapshot.cache_clear()
    yield snapshot
    weights.hub_snapshot.cache_clear()


def test_a_hugging_face_hub_name_is_read_from_the_hubs_cache(hub_cache, model_dir, labelled_csvs, tmp_path, capsys, monkeypatch):
    """`scratchbert fill-mask --model owner/name` as `from_pretrained("owner/name")`: fetched (here, offline,
    found in the Hub's cache) instead of "no such model folder"; the tokenizer alone for --tokenizer."""
    monkeypatch.chdir(tmp_path)  # no folder named scratchbert-test here
    code, out, err = run(capsys, "fill-mask", "the cat sat on the [MASK].", "--model", "scratchbert-test/tiny-mlm")
    assert code == 0, err
    code, local_out, err = run(capsys, "fill-mask", "the cat sat on the [MASK].", "--model", model_dir)
    assert out == local_out  # the same model
    code, _, err = run(capsys, "export-bert", "scratchbert-test/tiny-mlm", tmp_path / "bert")
    assert code == 0 and (tmp_path / "bert" / "model.safetensors").is_file(), err
    assert (tmp_path / "bert" / "tokenizer.json").is_file()  # the tokenizer too
    code, out, err = run(
        capsys, "finetune", "scratchbert-test/tiny-mlm", "--train-file", f"{labelled_csvs}/train*.csv", "--output-dir",
        tmp_path / "clf", "--epochs", "1", "--batch-size", "8", "--max-length", "32", "--no-progress-bar",
    )  # fmt: skip
    assert code == 0 and "accuracy" in out.strip().splitlines()[-1], err

    from scratchbert.tokenization import load_tokenizer

    assert load_tokenizer("scratchbert-test/tiny-mlm").get_vocab() == load_tokenizer(model_dir).get_vocab()

    code, _, err = run(capsys, "fill-mask", "a [MASK].", "--model", "scratchbert-test/absent")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "no such model folder: scratchbert-test/absent, and fetching it from the Hugging Face Hub failed" in err
    with pytest.raises(FileNotFoundError, match="no such tokenizer folder: scratchbert-test/absent, and fetching it from the Hugging Face Hub"):
        load_tokenizer("scratchbert-test/absent")


def test_a_mistyped_local_folder_is_not_looked_for_on_the_hub(model_dir, tmp_path, capsys, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("went to the Hub"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for typo in ("runs/tiny2", "./tiny2", str(tmp_path / "tiny2")):
        code, _, err = run(capsys, "fill-mask", "a [MASK].", "--model", typo)
        assert code == 2 and "no such model folder" in err and "Hub" not in err, err


def test_missing_weights_are_named(model_dir, tmp_path, capsys):
    folder = tmp_path / "no_weights"
    folder.mkdir()
    (folder / "config.json").write_bytes((model_dir / "config.json").read_bytes())
    code, _, err = run(capsys, "fill-mask", "a [MASK].", "--model", folder)
    assert code == 2 and "has a config.json but no weights" in err
