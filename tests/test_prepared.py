"""`scratchbert prepare-data` and `pretrain --prepared-data`: the same examples and the same run as building them in place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import first_documents_file

from scratchbert.commands import main

pytestmark = pytest.mark.usefixtures("fresh_accelerator_state")

TINY = [
    "--hidden-size", "32", "--num-hidden-layers", "2", "--num-attention-heads", "4", "--intermediate-size", "64",
    "--max-position-embeddings", "64", "--batch-size", "8", "--max-steps", "6", "--eval-every", "3", "--save-every", "0",
    "--log-every", "1", "--max-eval-examples", "16", "--report-to", "none", "--no-progress-bar",
]  # fmt: skip


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    return first_documents_file(tmp_path_factory.mktemp("prepared-corpus"), documents=30, words=150)


def losses(run: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if r["type"] in ("train", "eval") and "loss" in r]


@pytest.mark.parametrize("recipe", ["packed", "paper"])
def test_a_run_on_prepared_data_is_the_run_on_the_corpus(corpus_file, tmp_path, recipe, capsys):
    corpus = ["--train-files", str(corpus_file), "--vocab-size", "300", "--recipe", recipe, "--max-seq-length", "32", "--dupe-factor", "1"]
    assert main(["prepare-data", *corpus, "--output-dir", str(tmp_path / "prepared"), "--no-progress-bar"]) == 0
    assert "prepared" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prepared"]  # written under a temporary name, then renamed
    manifest = json.loads((tmp_path / "prepared" / "prepared.json").read_text())
    assert manifest["options"]["max_seq_length"] == 32 and manifest["options"]["nsp"] == (recipe == "paper")

    # The run from the folder takes its recipe, packing and length from prepared.json.
    assert main(["pretrain", "--prepared-data", str(tmp_path / "prepared"), "--output-dir", str(tmp_path / "from-prepared"), *TINY]) == 0
    assert main(["pretrain", *corpus, "--output-dir", str(tmp_path / "in-place"), *TINY]) == 0
    assert losses(tmp_path / "from-prepared") == losses(tmp_path / "in-place")
    assert (tmp_path / "from-prepared" / "tokenizer" / "vocab.txt").read_text() == (tmp_path / "prepared" / "tokenizer" / "vocab.txt").read_text()


def test_prepared_data_errors_name_the_problem_and_the_fix(corpus_file, tmp_path, capsys):
    prepared = tmp_path / "prepared"
    run = ["pretrain", "--output-dir", str(tmp_path / "run"), *TINY]

    def error(argv) -> str:
        assert main(argv) == 2
        return capsys.readouterr().err

    assert "needs --output-dir" in error(["prepare-data", "--train-files", str(corpus_file)])
    assert "does not exist" in error([*run, "--prepared-data", str(prepared)])
    assert main(["prepare-data", "--train-files", str(corpus_file), "--vocab-size", "300", "--max-seq-length", "32", "--output-dir", str(prepared), "--no-progress-bar"]) == 0
    assert "not empty" in error(["prepare-data", "--train-files", str(corpus_file), "--output-dir", str(prepared)])
    assert "max_seq_length: prepared 32, this run 48" in error([*run, "--prepared-data", str(prepared), "--max-seq-length", "48"])
    assert "leave out --train-files" in error([*run, "--prepared-data", str(prepared), "--train-files", str(corpus_file)])
    for flag in ("--streaming", "--hidden-size"):  # prepare-data takes the options that shape the examples only
        with pytest.raises(SystemExit):
            main(["prepare-data", "--train-files", str(corpus_file), flag, "1", "--output-dir", str(tmp_path / "p2")])
        assert f"unrecognized arguments: {flag}" in capsys.readouterr().err
    (tmp_path / "streamed.yaml").write_text("streaming: true\n")  # a run's file may still say so
    assert "keeps none" in error(["prepare-data", "--train-files", str(corpus_file), "--config", str(tmp_path / "streamed.yaml"), "--output-dir", str(tmp_path / "p2")])
    (tmp_path / "long.yaml").write_text("long_phase: 0.1\n")
    assert "does not keep --long-phase" in error(["prepare-data", "--train-files", str(corpus_file), "--max-seq-length", "32", "--config", str(tmp_path / "long.yaml"), "--output-dir", str(tmp_path / "p3")])
    (prepared / "prepared.json").write_text("{ not json", encoding="utf-8")
    assert "damaged" in error([*run, "--prepared-data", str(prepared)])
    assert "not a prepared-data folder" in error([*run, "--prepared-data", str(corpus_file.parent)])
