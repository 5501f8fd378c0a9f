"""Bad input a user hands the commands: one line naming the problem and the fix, exit status 2, no traceback.

Each case is one a new user met (issue 79): compressed files that are cut short or are not
compressed, a model folder whose config.json is not JSON, an image name matplotlib cannot
write, export folders that are a file or the model's own folder, a tokenizer larger than the
model's vocabulary. The commands run in-process through `scratchbert.commands.main`, as the
console script runs them.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import shutil
from pathlib import Path

import pytest
import torch

from scratchbert import ScratchBertForMaskedLM
from scratchbert.commands import main
from scratchbert.errors import ScratchBertError
from scratchbert.ingestion import DataError, load_documents, load_table, read_lines
from scratchbert.tokenization import train_tokenizer
from scratchbert.weights import model_folder
from conftest import tiny_bert_config

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
