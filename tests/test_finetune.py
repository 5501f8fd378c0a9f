"""Fine-tuning under transformers.Trainer: `scratchbert finetune`, its errors, the token
classification and question answering heads on rule-checkable toy tasks, and gradient
accumulation. Tiny models (hidden 32, 2 layers, 4 heads) and a word-level vocabulary, so
every test trains for seconds."""

from __future__ import annotations

import csv
import json
import logging
import os
import random
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import forget_kernel_choices, write_jsonl
from datasets import ClassLabel, Dataset, DatasetDict
from safetensors.torch import load_file
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    DataCollatorForTokenClassification,
    EvalPrediction,
    TrainerCallback,
    TrainingArguments,
    pipeline,
)

import scratchbert.commands
from scratchbert import (
    ScratchBertConfig,
    ScratchBertForMaskedLM,
    ScratchBertForQuestionAnswering,
    ScratchBertForSequenceClassification,
    ScratchBertForTokenClassification,
    cpu_gemm,
)
from scratchbert.tokenization import tokenizer_from_vocab
from scratchbert.training.finetuning.config import DEFAULT_EARLY_STOPPING_PATIENCE, DEFAULT_EPOCHS, DEFAULT_MIN_STEPS, FinetuneConfig
from scratchbert.training.finetuning.data import (
    carve_splits,
    check_columns,
    classify_texts,
    encode_labels,
    fitted_inputs,
    head_and_tail,
    hold_out_by_label,
    in_head_order,
    label_names_of,
    label_warnings,
    long_text_advice,
    tokenize_splits,
    windows_of,
)
from scratchbert.training.finetuning.metrics import (
    COLLAPSE_ADVICE,
    classification_metrics,
    collapse_of,
    document_predictions,
    token_classification_metrics,
)
from scratchbert.training.finetuning.run import finetune_text_classification
from scratchbert.training.finetuning.steps import (
    CheckpointInfo,
    default_learning_rate,
    default_pooling,
    fitted_schedule,
    load_sequence_classifier,
    make_trainer,
)

REPO = Path(__file__).resolve().parents[1]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
FILLERS = [f"w{i}" for i in range(24)]
EVEN_FILLERS, ODD_FILLERS = FILLERS[0::2], FILLERS[1::2]  # the token-tagging rule: odd words are tag 1
VOCAB = SPECIALS + ["good", "bad", "@", "#"] + FILLERS  # "@ ... #" mark the answer span in the QA task
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run on one thread


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    vocab_file = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab_file.write_text("\n".join(VOCAB) + "\n")
    return tokenizer_from_vocab(vocab_file)


def tiny_config(**overrides) -> ScratchBertConfig:
    return ScratchBertConfig(vocab_size=len(VOCAB), **TINY, **overrides)


@pytest.fixture(scope="module")
def scratch_checkpoint(tmp_path_factory, tokenizer):
    """A scratchbert pretraining-style checkpoint (MLM head, no classifier) with its tokenizer."""
    folder = tmp_path_factory.mktemp("scratch_mlm")
    torch.manual_seed(0)
    ScratchBertForMaskedLM(tiny_config()).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bert_checkpoint(tmp_path_factory, tokenizer):
    """A transformers BERT checkpoint (model_type "bert") with its tokenizer."""
    folder = tmp_path_factory.mktemp("bert_mlm")
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(vocab_size=len(VOCAB), **TINY)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def sentiment_rows(n: int, seed: int) -> list[dict]:
    """Filler sentences holding one "good" (label pos) or one "bad" (label neg)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = rng.choices(FILLERS, k=rng.randint(3, 8))
        label = rng.choice(["neg", "pos"])
        words.insert(rng.randint(0, len(words)), "good" if label == "pos" else "bad")
        rows.append({"text": " ".join(words), "label": label})
    return rows


def write_csv(path, rows: list[dict], fieldnames=None):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fieldnames or list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def trainer_args(tmp_path, **overrides) -> TrainingArguments:
    settings = dict(
        output_dir=str(tmp_path / "trainer"), report_to="none", disable_tqdm=True, save_strategy="no",
        use_cpu=True, seed=0, logging_steps=1000,
    )  # fmt: skip
    return TrainingArguments(**{**settings, **overrides})


# --------------------------------------------------------------------------- reproducibility


@pytest.mark.skipif(not cpu_gemm.ONEDNN or cpu_gemm.CAPABILITIES is None, reason="one kernel only here: nothing is chosen by timing")
@pytest.mark.skipif(torch.cuda.is_available(), reason="Trainer trains on the GPU here: no CPU kernel is timed or chosen")
def test_full_determinism_gives_the_same_weights_whatever_the_kernel_timings(tmp_path, monkeypatch, scratch_checkpoint, deterministic_mode):
    """Two runs of one seed whose kernel measurements disagree (as two processes on a busy machine
    can) end with identical weights under --full-determinism; without it the kernels are timed."""
    monkeypatch.setattr(cpu_gemm, "MIN_FLOPS", 0)  # the tiny model's products are rerouted as a real model's are
    measured = []

    def measure(gemm):  # each measurement finds the other kernel faster
        measured.append(gemm)
        fastest = ("mkl", "onednn")[len(measured) % 2]
        return {kernel: 0.5 if kernel == fastest else 1.0 for kernel in cpu_gemm.candidates(gemm)}

    monkeypatch.setattr(cpu_gemm, "measure", measure)
    train = write_csv(tmp_path / "train.csv", sentiment_rows(48, seed=1))

    def run(name: str, full_determinism: bool) -> dict:
        forget_kernel_choices(monkeypatch)  # what a new process starts with
        finetune_text_classification(
            scratch_checkpoint, tmp_path / name, train_files=[str(train)], epochs=2, batch_size=8, learning_rate=3e-3,
            seed=0, full_determinism=full_determinism, progress_bar=False,
        )  # fmt: skip
        return load_file(tmp_path / name / "model.safetensors")

    first, second = run("first", True), run("second", True)
    assert measured == []
    assert first.keys() == second.keys() and all(torch.equal(first[name], second[name]) for name in first)
    run("timed", False)
    assert measured and not torch.are_deterministic_algorithms_enabled()  # without the flag (and after one) the kernels are timed


# --------------------------------------------------------------------------- metrics and labels


def test_classification_metrics_match_hand_computation():
    # class 0: TP 1, FP 1, FN 0 -> F1 2/3; class 1: TP 1, FP 0, FN 2 -> 1/2; class 2: TP 0, FP 1 -> 0
    metrics = classification_metrics(np.array([0, 0, 1, 2]), np.array([0, 1, 1, 1]))
    assert metrics["accuracy"] == pytest.approx(0.5)
    assert metrics["macro_f1"] == pytest.approx((2 / 3 + 1 / 2 + 0) / 3)
    assert classification_metrics(np.array([1, 0, 1]), np.array([1, 0, 1])) == {"accuracy": 1.0, "macro_f1": 1.0}


def test_token_metrics_skip_ignored_positions():
    logits = np.zeros((1, 4, 2))
    logits[0, [0, 1], 1] = 1.0  # predicts tag 1 at positions 0, 1 and tag 0 at 2, 3
    labels = np.array([[-100, 1, 0, -100]])  # only positions 1 and 2 count: both right
    assert token_classification_metrics(EvalPrediction(logits, labels))["accuracy"] == 1.0


def test_head_and_tail_truncation_keeps_the_start_and_the_end(tokenizer):
    assert head_and_tail(list(range(10)), 20) == list(range(10))  # short texts are kept whole
    assert head_and_tail(list(range(100)), 8) == [0, 1, 94, 95, 96, 97, 98, 99]  # a quarter from the start
    text = " ".join(FILLERS)  # 24 words, one token each
    splits = DatasetDict({"train": Dataset.from_dict({"text": [text, "good"], "labels": [0, 1]})})
    kept = tokenize_splits(splits, tokenizer, "text", None, max_length=10, truncation="head+tail")["train"]
    ids = tokenizer.convert_ids_to_tokens(kept[0]["input_ids"])
    assert ids == ["[CLS]", "w0", "w1", "w18", "w19", "w20", "w21", "w22", "w23", "[SEP]"]
    assert kept[0]["token_type_ids"] == [0] * 10 and kept[0]["attention_mask"] == [1] * 10
    assert tokenizer.convert_ids_to_tokens(kept[1]["input_ids"]) == ["[CLS]", "good", "[SEP]"]
    head = tokenize_splits(splits, tokenizer, "text", None, max_length=10)["train"]
    assert tokenizer.convert_ids_to_tokens(head[0]["input_ids"]) == ["[CLS]"] + FILLERS[:8] + ["[SEP]"]
    with pytest.raises(ValueError, match="head\\+tail truncation and windows cut single texts"):
        tokenize_splits(splits, tokenizer, "text", "text", max_length=10, truncation="head+tail")
    with pytest.raises(ValueError, match="truncation='tail'"):
        tokenize_splits(splits, tokenizer, "text", None, max_length=10, truncation="tail")


def test_a_one_window_run_on_texts_it_cuts_is_told_that_windows_read_more(tokenizer):
    long, short = " ".join(FILLERS), "good"  # 24 tokens and 1

    def advice(texts, windows=1, pair=None):
        splits = DatasetDict({"train": Dataset.from_dict({"text": texts, "labels": [0] * len(texts)})})
        train = tokenize_splits(splits, tokenizer, "text", None, max_length=10, windows=windows)["train"]
        return long_text_advice(train, 10, windows, pair)

    assert advice([long, short, short, short]).startswith("25% of the training texts are cut at 10 tokens: --windows 4")
    assert advice([long, short, short, short, short]) is None  # 20%: below the share that is worth a line
    assert advice([short] * 4) is None
    assert advice([long] * 4, windows=2) is None  # windows already read more
    assert advice([long] * 4, pair="hypothesis") is None  # pairs are not cut into windows


def test_windows_split_a_long_text_evenly_and_carry_its_label_and_index(tokenizer):
    assert windows_of(list(range(5)), window=4, windows=3) == [[0, 1, 2], [3, 4]]  # 1.25 windows: two even pieces, no scrap
    assert windows_of(list(range(12)), window=4, windows=3) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert windows_of(list(range(40)), window=4, windows=2) == [[0, 1, 34, 35], [36, 37, 38, 39]]  # cut head+tail to 8 first
    assert windows_of(list(range(40)), window=4, windows=2, truncation="head") == [list(range(4)), list(range(4, 8))]
    assert windows_of([], window=4, windows=2) == [[]]  # an empty text is still one example: [CLS] [SEP]
    text = " ".join(FILLERS[:10])  # 10 tokens: windows of 4 give 3 pieces (4, 3, 3)
    splits = DatasetDict({"train": Dataset.from_dict({"text": ["good", text], "labels": [1, 0]})})
    rows = tokenize_splits(splits, tokenizer, "text", None, max_length=6, truncation="head+tail", windows=3)["train"]
    tokens = [tokenizer.convert_ids_to_tokens(ids) for ids in rows["input_ids"]]
    assert tokens == [["[CLS]", "good", "[SEP]"], ["[CLS]", *FILLERS[0:4], "[SEP]"], ["[CLS]", *FILLERS[4:7], "[SEP]"], ["[CLS]", *FILLERS[7:10], "[SEP]"]]
    assert rows["labels"] == [1, 0, 0, 0] and rows["document"] == [0, 1, 1, 1]
    assert [sum(mask) for mask in rows["attention_mask"]] == [3, 6, 5, 5]
    one = tokenize_splits(splits, tokenizer, "text", None, max_length=6, truncation="head+tail")["train"]
    assert one["document"] == [0, 1] and one["input_ids"][1] == rows["input_ids"][1][:2] + tokenizer.convert_tokens_to_ids(FILLERS[7:10]) + [tokenizer.sep_token_id]
    with pytest.raises(ValueError, match="with a text pair use truncation='head' and windows=1"):
        tokenize_splits(splits, tokenizer, "text", "text", max_length=6, truncation="head", windows=2)
    with pytest.raises(ValueError, match="windows=0: it must be a whole number, 1 or more"):
        FinetuneConfig("ckpt", output_dir="out", windows=0)
    with pytest.raises(ValueError, match="with --text-pair-column leave --windows 1 and --truncation head"):
        FinetuneConfig("ckpt", output_dir="out", windows=2, text_pair_column="hypothesis")


def test_a_texts_windows_are_scored_together():
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [0.0, 4.0], [3.0, 0.0]])  # text 7: windows 0-2, text 9: window 3
    mean, labels = document_predictions(logits, np.array([1, 1, 1, 0]), [7, 7, 7, 9])
    np.testing.assert_allclose(mean, [[2 / 3, 5 / 3], [3.0, 0.0]])
    assert labels.tolist() == [1, 0]
    same, same_labels = document_predictions((logits, None), np.array([1, 0, 1, 0]), range(4))  # one window each: unchanged
    np.testing.assert_array_equal(same, logits) and np.testing.assert_array_equal(same_labels, [1, 0, 1, 0])


def test_validation_rows_are_held_out_in_each_labels_share_and_every_label_keeps_training_rows():
    labels = ["common"] * 90 + ["rare"] * 8 + ["twice"] * 2 + ["once"]  # 101 rows, sorted by label as files often are
    for seed in range(30):
        train, validation = hold_out_by_label(labels, 0.1, seed)
        assert sorted(train + validation) == list(range(101))
        assert len(validation) == 11  # `datasets`' ceil(0.1 * 101)
        # shares 9, 0.8, 0.2, 0.1: the floors, then the largest remainders; "once" has no row to spare
        assert {label: [labels[row] for row in validation].count(label) for label in set(labels)} == {"common": 9, "rare": 1, "twice": 1, "once": 0}
        assert {labels[row] for row in train} == set(labels)
    assert hold_out_by_label(labels, 0.1, 0) == hold_out_by_label(labels, 0.1, 0)
    assert hold_out_by_label(labels, 0.1, 0)[1] != hold_out_by_label(labels, 0.1, 1)[1]
    # no label with two rows: nothing to stratify, a seeded random hold-out of the same size
    train, validation = hold_out_by_label(["a", "b", "c", "d"], 0.5, 0)
    assert len(validation) == 2 and sorted(train + validation) == [0, 1, 2, 3]

    rows = Dataset.from_dict({"text": [f"text {i}" for i in range(40)], "label": ["neg"] * 30 + ["pos"] * 10})
    splits = carve_splits({"train": rows}, "label", validation_fraction=0.2, seed=3)
    assert sorted(splits["validation"]["label"]) == ["neg"] * 6 + ["pos"] * 2
    assert sorted([*splits["train"]["text"], *splits["validation"]["text"]]) == sorted(rows["text"])


def test_label_names_from_strings_integers_and_class_labels():
    strings = DatasetDict(train=Dataset.from_dict({"label": ["pos", "neg", "pos"]}), validation=Dataset.from_dict({"label": ["neutral"]}))
    assert label_names_of(strings, "label") == ["neg", "neutral", "pos"]
    integers = DatasetDict(train=Dataset.from_dict({"label": [2, 0, 2]}), validation=Dataset.from_dict({"label": [0]}))
    names = label_names_of(integers, "label")
    assert names == ["0", "2"]  # named by value, ids 0..K-1 in value order
    assert encode_labels(integers, "label", names)["train"]["labels"] == [1, 0, 1]
    classes = DatasetDict(train=Dataset.from_dict({"label": [1, 0]}).cast_column("label", ClassLabel(names=["no", "yes"])))
    assert label_names_of(classes, "label") == ["no", "yes"]
    assert encode_labels(classes, "label", ["yes", "no"])["train"]["labels"] == [0, 1]  # e.g. a head's order
    unlabelled = Dataset.from_dict({"text": ["w1", "w2"], "label": [1, -1]}).cast_column("label", ClassLabel(names=["no", "yes"]))
    with pytest.raises(ValueError, match="row 2 of the train data .* has no label"):  # `datasets`' -1 for "no label"
        check_columns(DatasetDict(train=unlabelled), "text", None, "label")


def test_labels_only_validation_or_test_rows_have_and_look_alike_labels_are_warned(caplog):
    names = ["Neg", "neg", "other", "pos"]
    splits = DatasetDict(
        train=Dataset.from_dict({"labels": [0, 1, 3, 3]}),
        validation=Dataset.from_dict({"labels": [1, 3]}),
        test=Dataset.from_dict({"labels": [2, 2, 1]}),
    )
    with caplog.at_level(logging.WARNING, logger="scratchbert.training.finetuning.run"):
        found = label_warnings(splits, names)
    assert found == {"not_in_train": {"test": {"other": 2}}, "look_alike": [["Neg", "neg"]]}
    assert "'other' in 2 rows" in caplog.text and "count as errors" in caplog.text and "'Neg' / 'neg'" in caplog.text
    assert label_warnings(DatasetDict(train=splits["train"], validation=splits["validation"]), ["neg", "pos", "x", "y"]) is None


# --------------------------------------------------------------------------- clear errors


@pytest.fixture
def cli_main(monkeypatch):
    """The `scratchbert` command line's entry point."""
    return scratchbert.commands.main


def run_cli(cli_main, capsys, *argv) -> tuple[int, str]:
    code = cli_main(["finetune", *map(str, argv)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "rows, flags, message",
    [
        ([{"sentence": "w1 good", "label": "pos"}], [], "no column 'text'"),
        ([{"text": "w1 good", "sentiment": "pos"}], [], "no column 'label'"),
        ([{"text": "w1 good", "label": 0.5}, {"text": "w2 bad", "label": 1.5}], [], "labels must be strings or integers"),
        ([{"text": "w1 good", "label": [1]}, {"text": "w2 bad", "label": [0]}], [], "labels must be strings or integers"),
        ([{"text": "w1 good", "label": "pos"}, {"text": "w2 bad", "label": None}], [], "row 2 of the train data (the first row is 1) has no label"),
        ([{"text": "w1 good", "label": "pos"}, {"text": " ", "label": "neg"}], [], "row 2 of the train data (the first row is 1) has no text"),
        ([{"text": "w1 good", "label": "pos"}, {"text": 7, "label": "neg"}], [], "holds 7, not a text string"),
        ([{"text": "w1 good", "label": "pos"}, {"text": "w2 bad", "label": "pos"}], [], "single label"),
        ([{"text": "w1 good", "label": "pos"}], ["--text-pair-column", "premise"], "--text-pair-column"),
        ([{"text": "w1 good", "label": "pos"}, {"text": "w2 bad", "label": 1}], [], "mixes strings and integers"),
        ([{"text": "w1 good", "label": "pos"}], ["--max-length", "100"], "model's 64 positions"),
        ([{"text": "w1 good", "label": "pos"}], ["--train-split", "train"], "go with --dataset"),
    ],
)
def test_bad_data_gives_one_line_error(tmp_path, capsys, cli_main, scratch_checkpoint, rows, flags, message):
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    code, err = run_cli(cli_main, capsys, scratch_checkpoint, "--train-file", data, "--validation-file", data, "--output-dir", tmp_path / "out", *flags)
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # nothing is written before the data checks pass


def test_a_bad_cell_is_named_by_its_row_in_the_file_though_validation_rows_are_held_out(tmp_path, capsys, cli_main, scratch_checkpoint):
    rows = sentiment_rows(40, seed=3)
    rows[30]["text"] = ""  # a CSV's empty cell: `datasets` reads it as None
    data = write_csv(tmp_path / "train.csv", rows)
    code, err = run_cli(cli_main, capsys, scratch_checkpoint, "--train-file", data, "--output-dir", tmp_path / "out")
    assert code == 2 and "row 31 of the train data (the first row is 1) has no text in column 'text'" in err


def test_a_test_label_that_training_lacks_is_warned_and_saved(tmp_path, capsys, cli_main, scratch_checkpoint):
    train = write_csv(tmp_path / "train.csv", sentiment_rows(48, seed=4))
    test = write_csv(tmp_path / "test.csv", sentiment_rows(8, seed=5) + [{"text": "w1 w2", "label": "neutral"}])
    out = tmp_path / "out"
    argv = ["--train-file", train, "--test-file", test, "--output-dir", out, "--epochs", "1"]
    assert cli_main(["finetune", str(scratch_checkpoint), *map(str, argv)]) == 0
    expected = {"not_in_train": {"test": {"neutral": 1}}}
    assert json.loads((out / "metrics.json").read_text())["label_warnings"] == expected
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["label_warnings"] == expected  # the printed summary


def test_script_is_the_cli_command(cli_main, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["scripts/finetune.py", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO / "scripts" / "finetune.py"), run_name="__main__")
    assert exit_info.value.code == 0 and "usage: scratchbert finetune" in capsys.readouterr().out


def test_help_stays_short_and_the_finetune_modules_small(monkeypatch, capsys):
    """At most 32 option lines in `scratchbert finetune --help` (issue 75; the rest are set in --config); the
    length of functions is tests/test_structure.py's."""
    with pytest.raises(SystemExit):
        scratchbert.commands.main(["finetune", "--help"])
    options = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("--")]
    assert 20 < len(options) <= 32, options


def test_empty_or_missing_data_and_occupied_output_dir(tmp_path, capsys, cli_main, scratch_checkpoint):
    empty = tmp_path / "empty.csv"
    empty.write_text("text,label\n")
    code, err = run_cli(cli_main, capsys, scratch_checkpoint, "--train-file", empty, "--output-dir", tmp_path / "out")
    assert code == 2 and "train data is empty" in err
    code, err = run_cli(cli_main, capsys, scratch_checkpoint, "--train-file", tmp_path / "nope.csv", "--output-dir", tmp_path / "out")
    assert code == 2 and "no such data file" in err
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("precious")
    code, err = run_cli(cli_main, capsys, scratch_checkpoint, "--train-file", empty, "--output-dir", occupied)
    assert code == 2 and "--overwrite" in err and (occupied / "keep.txt").read_text() == "precious"


def test_a_folder_another_run_is_writing_to_is_refused_even_with_overwrite(tmp_path, capsys, cli_main, scratch_checkpoint, monkeypatch):
    from scratchbert.training.finetuning import run as finetune_module
    from scratchbert.training.run_setup import LOCK_FILE, OutputDirLock

    train = write_csv(tmp_path / "train.csv", sentiment_rows(48, seed=4))
    out = tmp_path / "out"
    out.mkdir()
    argv = ["--train-file", train, "--output-dir", out, "--epochs", "1", "--overwrite"]
    main_process = type("Main", (), {"is_main_process": True, "num_processes": 1})()
    with OutputDirLock(out, "scratchbert finetune") as other:  # as a first fine-tuning still running there
        other.claim(main_process, writing=True)
        code, err = run_cli(cli_main, capsys, scratch_checkpoint, *argv)
        assert code == 2 and f"{out} is in use by another run (scratchbert finetune, process {os.getpid()} on " in err
        assert sorted(path.name for path in out.iterdir()) == [LOCK_FILE]  # nothing of the refused run's

    held = []  # and a run holds its folder while it trains, and lets go at the end
    real = finetune_module.load_sequence_classifier

    def load_while_another_tries(*args, **kwargs):
        with OutputDirLock(out, "test") as second, pytest.raises(ValueError, match="in use by another run"):
            second.claim(main_process)
        held.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(finetune_module, "load_sequence_classifier", load_while_another_tries)
    code, err = run_cli(cli_main, capsys, scratch_checkpoint, *argv)
    assert code == 0 and held, err
    assert (out / "metrics.json").is_file() and not (out / LOCK_FILE).exists()


@pytest.fixture(scope="module")
def three_label_checkpoint(tmp_path_factory, tokenizer):
    """A transformers BERT classifier for three labels, saved as pytorch_model.bin."""
    folder = tmp_path_factory.mktemp("bert_cls3")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(VOCAB), id2label={0: "c", 1: "a", 2: "b"}, **TINY)
    torch.save(BertForSequenceClassification(config).state_dict(), folder / "pytorch_model.bin")
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_head_size_mismatch_is_refused_unless_reinitialised(three_label_checkpoint, scratch_checkpoint, caplog):
    assert CheckpointInfo.read(three_label_checkpoint).head_size == 3
    assert CheckpointInfo.read(scratch_checkpoint).head_size is None  # an MLM checkpoint has no classifier
    with pytest.raises(ValueError, match="head for 3 labels, but the data has 2.*--reinit-head"):
        load_sequence_classifier(CheckpointInfo.read(three_label_checkpoint), ["neg", "pos"])
    with caplog.at_level(logging.INFO, logger="scratchbert"):
        model = load_sequence_classifier(CheckpointInfo.read(three_label_checkpoint), ["neg", "pos"], reinit_head=True)
    assert f"{three_label_checkpoint}'s classification head for 3 labels is replaced by a new one for 2 (--reinit-head)" in caplog.messages
    state = torch.load(three_label_checkpoint / "pytorch_model.bin", weights_only=True)
    assert model.classifier.weight.shape == (2, TINY["hidden_size"])
    torch.testing.assert_close(model.bert.encoder.layer[1].output.dense.weight, state["bert.encoder.layer.1.output.dense.weight"])
    assert model.config.id2label == {0: "neg", 1: "pos"} and model.config.label2id == {"neg": 0, "pos": 1}
    kept = load_sequence_classifier(CheckpointInfo.read(three_label_checkpoint), ["a", "b", "c"])
    torch.testing.assert_close(kept.classifier.weight, state["classifier.weight"])
    # the same names keep the rows their head learned them on; a new head (--reinit-head: no head labels) takes the data's order
    head_labels = CheckpointInfo.read(three_label_checkpoint).head_labels
    assert head_labels == ("c", "a", "b") and in_head_order(["a", "b", "c"], head_labels) == ["c", "a", "b"]
    assert in_head_order(["a", "b", "c"], None) == ["a", "b", "c"]
    assert in_head_order(["x", "y", "z"], head_labels) == ["x", "y", "z"]
    fresh = load_sequence_classifier(CheckpointInfo.read(three_label_checkpoint), ["a", "b", "c"], reinit_head=True)
    assert not torch.equal(fresh.classifier.weight, state["classifier.weight"])
    assert isinstance(fresh, ScratchBertForSequenceClassification)


def test_loading_says_in_words_what_is_unused_and_new_and_warns_of_a_missing_encoder_weight(tmp_path, scratch_checkpoint, caplog, capfd):
    from safetensors.torch import save_file

    with caplog.at_level(logging.INFO, logger="scratchbert"):
        load_sequence_classifier(CheckpointInfo.read(scratch_checkpoint), ["neg", "pos"], pooling="cls")
    said = [record.getMessage() for record in caplog.records]
    assert f"not used from {scratch_checkpoint}: the MLM head" in said
    assert f"{scratch_checkpoint} has no pooler: it starts from random weights and is trained with the head" in said
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert "LOAD REPORT" not in capfd.readouterr().err  # transformers' table of the same keys, held back

    cut_short = tmp_path / "cut_short"
    cut_short.mkdir()
    (cut_short / "config.json").write_text((scratch_checkpoint / "config.json").read_text())
    state = load_file(scratch_checkpoint / "model.safetensors")
    del state["bert.encoder.layer.1.output.dense.weight"]
    save_file(state, cut_short / "model.safetensors", metadata={"format": "pt"})
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="scratchbert"):
        load_sequence_classifier(CheckpointInfo.read(cut_short), ["neg", "pos"])
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warned == [
        f"1 weight(s) of the encoder are not in {cut_short} and start from random values (bert.encoder.layer.1.output.dense.weight): "
        "it may be a checkpoint of another architecture or size, or one cut short. Fine-tuning goes on; check the checkpoint."
    ]


# --------------------------------------------------------------------------- the finetune command


def test_finetune_cli_trains_saves_and_serves_a_pipeline(tmp_path, capsys, cli_main, scratch_checkpoint):
    train = write_csv(tmp_path / "train.csv", sentiment_rows(192, seed=1))
    validation = write_csv(tmp_path / "validation.csv", sentiment_rows(64, seed=2))
    out = tmp_path / "out"
    code = cli_main(
        ["finetune", str(scratch_checkpoint), "--train-file", str(train), "--validation-file", str(validation),
         "--test-file", str(validation), "--output-dir", str(out), "--epochs", "6", "--batch-size", "16",
         "--learning-rate", "3e-3", "--best-metric", "accuracy"]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "'loss'" in printed and "eval_macro_f1" in printed  # progress and metrics are logged

    results = json.loads((out / "metrics.json").read_text())
    assert results["labels"] == ["neg", "pos"]
    assert results["validation"]["accuracy"] > 0.9  # the keyword task is learned, chance is 0.5
    assert results["collapsed"] is None and json.loads(printed.strip().splitlines()[-1])["collapsed"] is None
    # the flags win over the defaults fitted to the model and the data
    assert results["schedule"]["learning_rate"] == 3e-3 and results["schedule"]["epochs"] == 6
    assert results["schedule"]["chosen_by"] == {"learning_rate": "given", "epochs": "given"}
    assert results["inputs"] == {"max_length": 64, "truncation": "head", "windows": 1, "positions": 64}  # 256 capped by the model's 64 positions
    assert results["test"]["accuracy"] == results["validation"]["accuracy"]  # same rows, same (best) model
    epochs = [entry for entry in results["log_history"] if "eval_accuracy" in entry]  # evaluated every epoch, kept the best one
    assert len(epochs) == 6 and results["validation"]["accuracy"] == max(e["eval_accuracy"] for e in epochs)
    assert not (out / "checkpoints").exists()  # the epoch checkpoints, removed once the best is saved (keep_checkpoints keeps them)
    assert results["best_checkpoint"] is None  # metrics.json names no folder that is gone

    model = AutoModelForSequenceClassification.from_pretrained(out)
    assert isinstance(model, ScratchBertForSequenceClassification)
    assert model.config.id2label == {0: "neg", 1: "pos"}
    classify = pipeline("text-classification", model=str(out), device="cpu")
    predictions = classify(["w3 w5 good w7", "w3 bad w5 w7", "w10 w2 w9 w4 good"])
    assert [p["label"] for p in predictions] == ["pos", "neg", "pos"]


def test_finetune_transformers_checkpoint_on_text_pairs(tmp_path, capsys, cli_main, bert_checkpoint):
    """A transformers BERT checkpoint loads into ScratchBertForSequenceClassification; integer
    labels and a text pair (label 1 when both halves carry the same keyword)."""
    rng = random.Random(3)
    rows = []
    for _ in range(96):
        first, second = rng.choice(["good", "bad"]), rng.choice(["good", "bad"])
        rows.append({"premise": f"w1 {first} w2", "hypothesis": f"{second} w3", "same": int(first == second)})
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    out = tmp_path / "out"
    code = cli_main(
        ["finetune", str(bert_checkpoint), "--train-file", str(data), "--output-dir", str(out), "--text-column",
         "premise", "--text-pair-column", "hypothesis", "--label-column", "same", "--epochs", "1",
         "--validation-fraction", "0.25"]
    )  # fmt: skip
    assert code == 0
    results = json.loads((out / "metrics.json").read_text())
    assert results["labels"] == ["0", "1"] and set(results["validation"]) >= {"accuracy", "macro_f1", "loss"}
    reloaded = AutoModelForSequenceClassification.from_pretrained(out)
    assert isinstance(reloaded, ScratchBertForSequenceClassification)
    assert reloaded.config.label2id == {"0": 0, "1": 1}
    assert (out / "tokenizer.json").is_file()  # the tokenizer was saved beside the model


def test_finetune_from_a_datasets_folder_with_its_splits(tmp_path, capsys, cli_main, scratch_checkpoint):
    """`--dataset` takes anything `datasets.load_dataset` does; here a folder of split files."""
    folder = tmp_path / "sentiment"
    folder.mkdir()
    write_csv(folder / "train.csv", sentiment_rows(48, seed=10))
    write_csv(folder / "test.csv", sentiment_rows(16, seed=11))
    out = tmp_path / "out"
    argv = ["--dataset", folder, "--test-split", "test", "--epochs", "1", "--validation-fraction", "0.25"]
    code, err = run_cli(cli_main, capsys, scratch_checkpoint, "--output-dir", out, *argv)
    assert code == 0, err
    results = json.loads((out / "metrics.json").read_text())
    assert results["test"]["accuracy"] >= 0 and results["labels"] == ["neg", "pos"]
    code, err = run_cli(cli_main, capsys, scratch_checkpoint, "--output-dir", tmp_path / "out2", "--dataset", folder, "--test-split", "dev")
    assert code == 2 and "has no split 'dev'" in err


# --------------------------------------------------------------------------- defaults and collapse


def test_defaults_follow_the_model_width_and_the_number_of_examples():
    assert default_learning_rate(128) == 1e-3 and default_learning_rate(256) == 3e-4  # tiny, mini (the BERT miniatures)
    assert default_learning_rate(512) == 1e-4 and default_learning_rate(768) == 5e-5  # small/medium, base
    config = FinetuneConfig("ckpt", output_dir="out")
    assert config.learning_rate is None and config.epochs is None and config.min_steps == DEFAULT_MIN_STEPS
    few = fitted_schedule(config, hidden_size=128, train_rows=405)  # 26 steps of 16 an epoch
    assert few["learning_rate"] == 1e-3 and few["steps_per_epoch"] == 26
    assert few["epochs"] == 12 and few["optimizer_steps"] == 312 >= DEFAULT_MIN_STEPS  # whole epochs, at least 300 steps
    many = fitted_schedule(config, hidden_size=768, train_rows=25_000)
    assert many["epochs"] == DEFAULT_EPOCHS and many["learning_rate"] == 5e-5
    accumulated = fitted_schedule(FinetuneConfig("ckpt", output_dir="out", gradient_accumulation_steps=2, min_steps=100), 128, 405)
    assert accumulated["steps_per_epoch"] == 13 and accumulated["epochs"] == 8
    given = fitted_schedule(FinetuneConfig("ckpt", output_dir="out", learning_rate=1e-5, epochs=1), 128, 405)
    assert (given["learning_rate"], given["epochs"], given["optimizer_steps"]) == (1e-5, 1, 26)
    assert given["chosen_by"] == {"learning_rate": "given", "epochs": "given"}
    with pytest.raises(ValueError, match="min_steps=-1"):
        FinetuneConfig("ckpt", output_dir="out", min_steps=-1)


def test_inputs_default_to_one_window_of_256_tokens_cut_at_the_end_and_given_values_win():
    # As transformers' run_classification reads a text; head+tail and windows are options (docs/finetuning.md).
    single = fitted_inputs(FinetuneConfig("ckpt", output_dir="out"), positions=512)
    assert single == {"max_length": 256, "truncation": "head", "windows": 1, "positions": 512}
    assert fitted_inputs(FinetuneConfig("ckpt", output_dir="out"), positions=64)["max_length"] == 64  # a shorter position table
    given = fitted_inputs(FinetuneConfig("ckpt", output_dir="out", max_length=100, truncation="head+tail", windows=4), positions=512)
    assert (given["max_length"], given["truncation"], given["windows"]) == (100, "head+tail", 4)
    with pytest.raises(ValueError, match="between 2 .* the model's 64 positions, got 100"):
        fitted_inputs(FinetuneConfig("ckpt", output_dir="out", max_length=100), positions=64)
    with pytest.raises(ValueError, match="truncation must be one of head, head\\+tail, got 'tail'"):
        FinetuneConfig("ckpt", output_dir="out", truncation="tail")
    with pytest.raises(ValueError, match="with --text-pair-column leave --windows 1 and --truncation head"):
        FinetuneConfig("ckpt", output_dir="out", truncation="head+tail", text_pair_column="hypothesis")


def test_a_config_file_sets_what_the_defaults_would_and_flags_win_over_it(tmp_path):
    from scratchbert.training.run_setup import read_config_file

    path = tmp_path / "finetune.yaml"
    path.write_text("learning_rate: 2.0e-4\nepochs: 5\n")
    config, sources = FinetuneConfig.resolve(read_config_file(path), {"checkpoint": "ckpt", "output_dir": "out", "learning_rate": 1e-3})
    assert (config.learning_rate, config.epochs) == (1e-3, 5) and sources["learning_rate"] == "flag" and sources["epochs"] == "file"
    assert fitted_schedule(config, 128, 405)["chosen_by"] == {"learning_rate": "given", "epochs": "given"}


def test_collapse_is_one_class_predicted_where_the_labels_are_spread():
    names = ["neg", "pos"]
    labels = np.array([0] * 70 + [1] * 30)
    assert collapse_of(np.zeros(100, dtype=int), labels, names) == {"class": "neg", "predicted_share": 1.0, "label_share": 0.7}
    assert collapse_of(np.array([1] * 96 + [0] * 4), labels, names)["class"] == "pos"  # 96% one class is collapsed
    assert collapse_of(np.array([0] * 94 + [1] * 6), labels, names) is None  # 94% is not
    assert collapse_of(labels, labels, names) is None
    assert collapse_of(np.zeros(100, dtype=int), np.array([0] * 97 + [1] * 3), names) is None  # the labels are one class too


@pytest.fixture(scope="module")
def one_class_checkpoint(tmp_path_factory, tokenizer):
    """A classifier whose head's bias says "neg" whatever the text: a collapsed classifier to start from."""
    folder = tmp_path_factory.mktemp("one_class")
    torch.manual_seed(0)
    model = ScratchBertForSequenceClassification(tiny_config(num_labels=2, id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1}))
    with torch.no_grad():
        model.classifier.bias.copy_(torch.tensor([20.0, -20.0]))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_collapsed_classifier_is_reported(tmp_path, caplog, capsys, cli_main, one_class_checkpoint):
    train = write_csv(tmp_path / "train.csv", sentiment_rows(64, seed=12))
    validation = write_csv(tmp_path / "validation.csv", sentiment_rows(48, seed=13))
    out = tmp_path / "out"
    argv = ["--train-file", train, "--validation-file", validation, "--test-file", validation, "--output-dir", out,
            "--epochs", "2", "--learning-rate", "1e-7", "--no-progress-bar"]  # fmt: skip
    with caplog.at_level("WARNING"):
        code = cli_main(["finetune", str(one_class_checkpoint), *map(str, argv)])
    assert code == 0
    results = json.loads((out / "metrics.json").read_text())
    collapsed = results["collapsed"]
    labels = [row["label"] for row in sentiment_rows(48, seed=13)]
    assert collapsed["validation"] == {"class": "neg", "predicted_share": 1.0, "label_share": round(labels.count("neg") / 48, 4)}
    assert collapsed["test"] == collapsed["validation"] and collapsed["epochs_collapsed"] == "2 of 2"  # every epoch
    assert collapsed["advice"] == COLLAPSE_ADVICE and "--learning-rate" in COLLAPSE_ADVICE and "labels" in COLLAPSE_ADVICE
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["collapsed"] == collapsed  # the printed summary
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert any("COLLAPSED" in message and "'neg' to 100% of the validation examples" in message for message in warnings), warnings


def test_without_epochs_training_takes_at_least_min_steps(tmp_path, capsys, cli_main, scratch_checkpoint):
    train = write_csv(tmp_path / "train.csv", sentiment_rows(64, seed=14))  # 4 steps of 16 an epoch
    out = tmp_path / "out"
    (tmp_path / "options.json").write_text(json.dumps({"min_steps": 20}))  # an option of the --config file
    code, err = run_cli(
        cli_main, capsys, scratch_checkpoint, "--train-file", train, "--validation-file", train, "--output-dir", out,
        "--config", tmp_path / "options.json", "--no-progress-bar",
    )  # fmt: skip
    assert code == 0, err
    results = json.loads((out / "metrics.json").read_text())
    assert results["schedule"]["epochs"] == 5 and results["schedule"]["optimizer_steps"] == 20
    assert results["schedule"]["learning_rate"] == default_learning_rate(TINY["hidden_size"])
    assert results["train"]["epoch"] == 5 and len([e for e in results["log_history"] if "eval_accuracy" in e]) == 5


# --------------------------------------------------------------------------- one name per option


def test_options_have_pretrainings_names_and_the_old_spellings_still_read():
    """`--train-files` and `--progress-bar` as `scratchbert pretrain` spells them (issue 84): `--train-file` still
    parses (argparse takes an unambiguous start of a flag), a file with the old field names loads, and the soup is gone."""
    from scratchbert.commands import build_parser

    def parsed(*flags):
        return build_parser().parse_args(["finetune", "ckpt", "--output-dir", "out", *flags])

    assert parsed("--train-file", "x.csv").train_files == ["x.csv"]
    assert parsed("--train-files", "x.csv", "y.csv").train_files == ["x.csv", "y.csv"]
    assert parsed("--no-progress-bar").progress_bar is False and parsed("--dataset", "imdb").dataset == "imdb"
    for gone in (["--show-progress"], ["--soup", "3"]):
        with pytest.raises(SystemExit):
            parsed(*gone)
    old = FinetuneConfig.from_dict({"checkpoint": "ckpt", "output_dir": "out", "show_progress": False, "dataset_name": "imdb"})
    assert (old.progress_bar, old.dataset) == (False, "imdb")


# --------------------------------------------------------------------------- early stopping and pooling


def test_early_stopping_and_pooling_options_are_parsed_and_flags_win(tmp_path):
    from scratchbert.commands import build_parser
    from scratchbert.training.run_setup import read_config_file, resolve_args

    default = FinetuneConfig("ckpt", output_dir="out")
    assert (default.early_stopping_patience, default.pooling) == (DEFAULT_EARLY_STOPPING_PATIENCE, None)
    path = tmp_path / "finetune.yaml"
    path.write_text("early_stopping_patience: 3\npooling: mean\n")
    args = build_parser().parse_args(["finetune", "ckpt", "--output-dir", "out", "--config", str(path), "--early-stopping-patience", "0"])
    config, sources = resolve_args(args, FinetuneConfig)
    assert (config.early_stopping_patience, config.pooling) == (0, "mean")  # the flag wins over the file
    assert (sources["early_stopping_patience"], sources["pooling"]) == ("flag", "file")
    args = build_parser().parse_args(["finetune", "ckpt", "--output-dir", "out", "--early-stopping-patience", "2", "--pooling", "cls"])
    assert (args.early_stopping_patience, args.pooling) == (2, "cls")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["finetune", "ckpt", "--output-dir", "out", "--pooling", "sum"])
    with pytest.raises(SystemExit):  # "max" was removed from the model (issue 75)
        build_parser().parse_args(["finetune", "ckpt", "--output-dir", "out", "--pooling", "max"])
    with pytest.raises(ValueError, match=r"early_stopping_patience=-1: .*--early-stopping-patience"):
        FinetuneConfig("ckpt", output_dir="out", early_stopping_patience=-1)
    with pytest.raises(ValueError, match=r"pooling must be one of cls, mean, got 'sum'"):
        FinetuneConfig.resolve(read_config_file(path), {"checkpoint": "ckpt", "output_dir": "out", "pooling": "sum"})


@pytest.fixture(scope="module")
def untrained_classifier(tmp_path_factory, tokenizer):
    """A classifier with a random head that gives both classes (about half each, on mean pooling): training at
    1e-7 leaves its score where it is."""
    folder = tmp_path_factory.mktemp("untrained_head")
    torch.manual_seed(0)
    labels = dict(num_labels=2, id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
    ScratchBertForSequenceClassification(tiny_config(classifier_pooling="mean", **labels)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_early_stopping_stops_on_a_plateau_and_keeps_the_first_best_epoch(tmp_path, capsys, cli_main, untrained_classifier, one_class_checkpoint):
    """At a learning rate of 1e-7 the validation score stays where epoch 1 put it: patience 2 stops after epoch 3 (a tie
    is no improvement), and the first of the tied epochs is kept, as Trainer's `load_best_model_at_end` keeps it."""
    train = write_csv(tmp_path / "train.csv", sentiment_rows(32, seed=15))  # 2 steps of 16 an epoch
    validation = write_csv(tmp_path / "validation.csv", sentiment_rows(32, seed=16))
    argv = ["--train-file", train, "--validation-file", validation, "--epochs", "6", "--learning-rate", "1e-7", "--no-progress-bar"]
    (tmp_path / "keep.json").write_text(json.dumps({"keep_checkpoints": True}))  # an option of the --config file
    code, err = run_cli(cli_main, capsys, untrained_classifier, *argv, "--output-dir", tmp_path / "stopped", "--early-stopping-patience", "2",
                        "--config", tmp_path / "keep.json")  # fmt: skip
    assert code == 0, err
    results = json.loads((tmp_path / "stopped" / "metrics.json").read_text())
    assert results["early_stopping"] == {"patience": 2, "stopped_early": True, "epochs_run": 3.0, "optimizer_steps_run": 6}
    epochs = [entry for entry in results["log_history"] if "eval_macro_f1" in entry]
    assert len(epochs) == 3 and len({entry["eval_macro_f1"] for entry in epochs}) == 1  # three equal scores: a tie
    assert results["validation"]["epoch"] == 1.0 and results["best_checkpoint"].endswith("checkpoint-2")  # the first of them is kept
    assert (tmp_path / "stopped" / "checkpoints" / "checkpoint-2").is_dir()  # kept, as asked
    assert max(entry["eval_top_class_share"] for entry in epochs) < 0.95  # a plateau of a two-class answer
    assert results["schedule"]["epochs"] == 6 and results["schedule"]["optimizer_steps"] == 12  # what was planned
    # 0 switches it off: every epoch runs
    code, err = run_cli(cli_main, capsys, untrained_classifier, *argv, "--output-dir", tmp_path / "all", "--early-stopping-patience", "0")
    assert code == 0, err
    results = json.loads((tmp_path / "all" / "metrics.json").read_text())
    assert results["early_stopping"] == {"patience": None, "stopped_early": False, "epochs_run": 6.0, "optimizer_steps_run": 12}
    assert results["validation"]["epoch"] == 1.0 and not (tmp_path / "all" / "checkpoints").exists()


def test_pooling_comes_from_the_flag_a_trained_head_or_the_default(tmp_path, one_class_checkpoint, scratch_checkpoint, three_label_checkpoint):
    assert default_pooling(32) == default_pooling(128) == "mean"  # tiny: measured (docs/finetuning.md)
    assert default_pooling(256) == default_pooling(768) == "cls"  # wider: BERT's pooler on [CLS]
    assert CheckpointInfo.read(scratch_checkpoint).pooling() == ("mean", "default for hidden size 32")  # no head yet
    assert CheckpointInfo.read(scratch_checkpoint).pooling("mean") == ("mean", "given")
    assert CheckpointInfo.read(one_class_checkpoint).pooling() == ("cls", "the checkpoint's head")
    with pytest.raises(ValueError, match=r"head trained on 'cls' pooling; it cannot read 'mean' pooling\. Pass --reinit-head"):
        CheckpointInfo.read(one_class_checkpoint).pooling("mean")
    assert CheckpointInfo.read(one_class_checkpoint).pooling("mean", reinit_head=True) == ("mean", "given")
    assert CheckpointInfo.read(three_label_checkpoint).pooling() == ("cls", "the checkpoint's head")  # a transformers BERT head
    mean_head = tmp_path / "mean_head"
    ScratchBertForSequenceClassification(tiny_config(num_labels=2, classifier_pooling="mean")).save_pretrained(mean_head)
    assert CheckpointInfo.read(mean_head).pooling() == ("mean", "the checkpoint's head")
    model = load_sequence_classifier(CheckpointInfo.read(scratch_checkpoint), ["neg", "pos"], pooling="mean")
    assert model.config.classifier_pooling == "mean" and model.bert.pooler is None
    with pytest.raises(ValueError, match="pooling='mean' needs scratchbert's classifier: BertForSequenceClassification pools"):
        load_sequence_classifier(CheckpointInfo.read(scratch_checkpoint), ["neg", "pos"], pooling="mean", model_class=BertForSequenceClassification)
    bert = load_sequence_classifier(CheckpointInfo.read(scratch_checkpoint), ["neg", "pos"], model_class=BertForSequenceClassification)  # [CLS], its only pooling
    assert isinstance(bert, BertForSequenceClassification) and bert.bert.pooler is not None
    assert load_sequence_classifier(CheckpointInfo.read(scratch_checkpoint), ["neg", "pos"], pooling="cls").bert.pooler is not None


def test_finetune_with_mean_pooling_learns_and_saves_it(tmp_path, capsys, cli_main, scratch_checkpoint):
    train = write_csv(tmp_path / "train.csv", sentiment_rows(192, seed=1))
    validation = write_csv(tmp_path / "validation.csv", sentiment_rows(64, seed=2))
    out = tmp_path / "out"
    code, err = run_cli(
        cli_main, capsys, scratch_checkpoint, "--train-file", train, "--validation-file", validation, "--output-dir", out,
        "--epochs", "6", "--learning-rate", "3e-3", "--pooling", "mean", "--no-progress-bar",
    )  # fmt: skip
    assert code == 0, err
    results = json.loads((out / "metrics.json").read_text())
    assert results["pooling"] == "mean" and results["validation"]["accuracy"] > 0.9  # the keyword task, chance 0.5
    model = AutoModelForSequenceClassification.from_pretrained(out)
    assert isinstance(model, ScratchBertForSequenceClassification) and model.config.classifier_pooling == "mean"
    assert model.bert.pooler is None


def keyword_in_the_middle_rows(n: int, seed: int) -> list[dict]:
    """Texts of 11-14 filler words with "good" (pos) or "bad" (neg) where one 8-token head+tail window
    (its first word and last five) never reaches it, and three such windows always do."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = rng.choices(FILLERS, k=rng.randint(11, 14))
        label = rng.choice(["neg", "pos"])
        words.insert(rng.randint(2, len(words) - 5), "good" if label == "pos" else "bad")
        rows.append({"text": " ".join(words), "label": label})
    return rows


def test_windows_read_what_one_window_cuts_off_and_the_saved_folder_scores_what_the_command_reported(tmp_path, capsys, cli_main, scratch_checkpoint):
    """On a held-out test file, the accuracy the command reports is the saved folder's through the documented
    path, example for example: `classify_texts` (which reads the run's windows and truncation from the saved
    config) for three windows, and `pipeline("text-classification")` for one window cut at the end."""
    train = write_csv(tmp_path / "train.csv", keyword_in_the_middle_rows(192, seed=1))
    validation = write_csv(tmp_path / "validation.csv", keyword_in_the_middle_rows(64, seed=2))
    held_out = keyword_in_the_middle_rows(64, seed=3)
    test = write_csv(tmp_path / "test.csv", held_out)
    accuracy = {}
    for windows, truncation in ((1, "head"), (3, "head+tail")):
        out = tmp_path / f"windows-{windows}"
        code, err = run_cli(
            cli_main, capsys, scratch_checkpoint, "--train-file", train, "--validation-file", validation, "--test-file", test,
            "--output-dir", out, "--epochs", "6", "--learning-rate", "3e-3", "--max-length", "8", "--windows", windows,
            "--truncation", truncation, "--no-progress-bar",
        )  # fmt: skip
        assert code == 0, err
        results = json.loads((out / "metrics.json").read_text())
        assert results["inputs"]["windows"] == windows and results["inputs"]["max_length"] == 8
        steps_per_epoch = results["schedule"]["steps_per_epoch"]
        assert steps_per_epoch == 12 if windows == 1 else steps_per_epoch > 12  # 192 texts, or their windows, in batches of 16
        assert (results["test"]["accuracy"] * 64) == pytest.approx(round(results["test"]["accuracy"] * 64))  # scored per text, not per window
        accuracy[windows] = results["test"]["accuracy"]
        texts, truth = [row["text"] for row in held_out], [row["label"] for row in held_out]
        model = AutoModelForSequenceClassification.from_pretrained(out)
        assert (model.config.classifier_windows, model.config.classifier_truncation, model.config.classifier_max_length) == (windows, truncation, 8)
        logits = classify_texts(model, AutoTokenizer.from_pretrained(out), texts)  # the run's reading, from the saved config
        predicted = [model.config.id2label[int(i)] for i in logits.argmax(-1)]
        right = sum(p == label for p, label in zip(predicted, truth))
        assert right == round(results["test"]["accuracy"] * 64), (windows, right, results["test"])  # to the last example
        if windows == 1:  # one window cut at the end: what a pipeline reads (the saved tokenizer cuts at --max-length)
            piped = [p["label"] for p in pipeline("text-classification", model=str(out), device="cpu")(texts, truncation=True)]
            assert piped == predicted
    with pytest.raises(ValueError, match="the model's 64 positions, got 100"):
        classify_texts(model, AutoTokenizer.from_pretrained(out), ["w1 good"], max_length=100)
    with pytest.raises(ValueError, match="windows=0: it must be a whole number"):
        classify_texts(model, AutoTokenizer.from_pretrained(out), ["w1 good"], max_length=8, windows=0)
    with pytest.raises(ValueError, match="got no texts"):
        classify_texts(model, AutoTokenizer.from_pretrained(out), [], max_length=8)
    # The keyword is out of one window's reach in some texts, in three's in every one.
    assert accuracy[1] < 0.9 < accuracy[3], accuracy


# --------------------------------------------------------------------------- token classification and QA


def tagging_dataset(tokenizer, n: int, seed: int) -> Dataset:
    """Tag 1 on odd filler words, 0 on even ones; -100 on [CLS]/[SEP] (not scored)."""
    rng = random.Random(seed)
    rows = {"input_ids": [], "labels": []}
    for _ in range(n):
        words = rng.choices(FILLERS, k=rng.randint(4, 10))
        ids = tokenizer(" ".join(words))["input_ids"]
        rows["input_ids"].append(ids)
        rows["labels"].append([-100] + [int(word in ODD_FILLERS) for word in words] + [-100])
    return Dataset.from_dict(rows)


def test_token_classification_learns_a_token_property(tmp_path, tokenizer):
    torch.manual_seed(0)
    model = ScratchBertForTokenClassification(tiny_config(num_labels=2))
    train, evaluation = tagging_dataset(tokenizer, 160, seed=4), tagging_dataset(tokenizer, 48, seed=5)
    args = trainer_args(tmp_path, num_train_epochs=4, per_device_train_batch_size=16, learning_rate=3e-3)
    trainer = make_trainer(
        model, tokenizer, args, train, evaluation, DataCollatorForTokenClassification(tokenizer), token_classification_metrics
    )
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    assert after["eval_loss"] < 0.5 * before["eval_loss"]
    assert after["eval_accuracy"] > 0.9  # chance: about 0.5 (odd and even words are equally likely)


def span_dataset(tokenizer, n: int, seed: int) -> Dataset:
    """Question "good"; the context holds one span "@ ... #" among filler words, and the answer
    is that span, markers included: start = the position of "@", end = the position of "#"
    (positions in the [CLS] good [SEP] context [SEP] sequence)."""
    rng = random.Random(seed)
    rows = {"input_ids": [], "token_type_ids": [], "start_positions": [], "end_positions": []}
    for _ in range(n):
        before, inside, after = (rng.choices(FILLERS, k=rng.randint(lo, hi)) for lo, hi in ((0, 8), (1, 3), (0, 8)))
        encoded = tokenizer("good", " ".join(before + ["@"] + inside + ["#"] + after))
        start = 3 + len(before)  # [CLS] good [SEP] come first
        rows["input_ids"].append(encoded["input_ids"])
        rows["token_type_ids"].append(encoded["token_type_ids"])
        rows["start_positions"].append(start)
        rows["end_positions"].append(start + len(inside) + 1)
    return Dataset.from_dict(rows)


def both_ends_right(eval_prediction) -> dict[str, float]:
    """The share of windows whose most likely start and end are both the gold ones (the run itself scores
    SQuAD's EM and F1 per question: tests/test_finetune_question_answering.py)."""
    (start_logits, end_logits), (gold_start, gold_end) = eval_prediction.predictions[:2], eval_prediction.label_ids
    return {"exact_match": float(np.mean((start_logits.argmax(-1) == gold_start) & (end_logits.argmax(-1) == gold_end)))}


def test_question_answering_finds_a_marked_span(tmp_path, tokenizer):
    torch.manual_seed(0)
    model = ScratchBertForQuestionAnswering(tiny_config())
    train, evaluation = span_dataset(tokenizer, 192, seed=6), span_dataset(tokenizer, 64, seed=7)
    args = trainer_args(tmp_path, num_train_epochs=4, per_device_train_batch_size=16, learning_rate=3e-3)
    trainer = make_trainer(model, tokenizer, args, train, evaluation, compute_metrics=both_ends_right)
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    assert after["eval_loss"] < 0.5 * before["eval_loss"]
    # guessing both ends among ~15 positions is right well under 5% of the time
    assert after["eval_exact_match"] > 0.8, after


# --------------------------------------------------------------------------- gradient accumulation


class GradientGrabber(TrainerCallback):
    """Keeps a copy of every gradient just before the (single) optimizer step."""

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def one_step(tmp_path, make_model, dataset, collator, batch_size: int, accumulation: int, tokenizer):
    """Train one optimizer step over all 8 examples; return Trainer's loss and the gradients."""
    torch.manual_seed(0)
    model = make_model()
    grabber = GradientGrabber()
    args = trainer_args(
        tmp_path, per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation, max_steps=1, max_grad_norm=0
    )
    trainer = make_trainer(model, tokenizer, args, dataset, data_collator=collator, callbacks=[grabber])
    return trainer.train().training_loss, grabber.grads


@pytest.mark.parametrize("task", ["scratch-sequence", "scratch-token", "transformers-sequence"])
def test_gradient_accumulation_matches_the_large_batch(tmp_path, tokenizer, task):
    """2 micro-batches of 4 give the loss and gradients of 1 batch of 8, including for token
    tagging where the micro-batches hold different numbers of labelled tokens."""
    if task == "scratch-token":
        dataset = tagging_dataset(tokenizer, 8, seed=8)  # 4 to 10 tagged words per example
        collator = DataCollatorForTokenClassification(tokenizer)
        def make_model():
            return ScratchBertForTokenClassification(tiny_config(num_labels=2, **NO_DROPOUT))
    else:
        rows = sentiment_rows(8, seed=9)
        dataset = Dataset.from_dict(dict(tokenizer([r["text"] for r in rows]), labels=[int(r["label"] == "pos") for r in rows]))
        collator = None  # make_trainer's default: DataCollatorWithPadding
        if task == "scratch-sequence":
            def make_model():
                return ScratchBertForSequenceClassification(tiny_config(num_labels=2, **NO_DROPOUT))
        else:
            def make_model():
                return BertForSequenceClassification(BertConfig(vocab_size=len(VOCAB), num_labels=2, **TINY, **NO_DROPOUT))
    large_loss, large_grads = one_step(tmp_path, make_model, dataset, collator, 8, 1, tokenizer)
    small_loss, small_grads = one_step(tmp_path, make_model, dataset, collator, 4, 2, tokenizer)
    assert small_loss == pytest.approx(large_loss, rel=1e-5)
    assert large_grads.keys() == small_grads.keys() and len(large_grads) > 10
    for name, grad in large_grads.items():
        torch.testing.assert_close(small_grads[name], grad, rtol=1e-4, atol=1e-7, msg=name)
