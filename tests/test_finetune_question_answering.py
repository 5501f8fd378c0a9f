"""`scratchbert finetune --task question-answering` and `scratchbert answer`: SQuAD's data forms, long
contexts in overlapping windows, the post-processing from window logits to each question's answer,
SQuAD v2's no-answer, exact match and F1 as the official script computes them, and every error.

The questions are asked of real text (the Python documentation CPython carries), and their answers are
real spans of it (`text_questions`): the fast run trains a tiny model (hidden 32, 2 layers) on cloze
questions whose answer is a paragraph's one quoted literal, which it learns in seconds."""

from __future__ import annotations

import contextlib
import io
import json
import random

import numpy as np
import pytest
from conftest import assert_refused, finetune_cli, write_jsonl

import scratchbert.commands
from scratchbert.training.finetuning.question_answering import answer_questions, check_questions, question_rows
from scratchbert.training.finetuning.spans import SpanReading, answer_pieces, best_answers, check_stride, tokenize_windows
from scratchbert.training.finetuning.squad_metrics import exact_match, f1, normalize_answer, squad_scores
from scratchbert.training.finetuning.text_questions import questions_from_text, squad_json

READING = SpanReading(max_length=48, doc_stride=8, n_best=20, max_answer_length=30, null_answers=False)
RUN = ["--max-length", "48", "--doc-stride", "8", "--batch-size", "8", "--learning-rate", "3e-3", "--no-progress-bar"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run on one thread


@pytest.fixture(scope="module")
def quoted_questions() -> dict[str, list[dict]]:
    """Cloze questions on single paragraphs that quote one literal (the answer), of up to 20 words;
    one question in five for testing, by its number."""
    rows = [row for row in questions_from_text(context_words=1) if not row["question"].startswith("What")]
    rows = [row for row in rows if row["context"].count('"') == 2 and len(row["question"].split()) <= 20]
    return {"train": [r for r in rows if int(r["id"][1:]) % 5], "test": [r for r in rows if int(r["id"][1:]) % 5 == 0]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_mlm_checkpoint, quoted_questions):
    """One run of the command: train on a SQuAD v1.1 JSON file, score a JSON-lines test file; what it printed."""
    folder = tmp_path_factory.mktemp("qa_run")
    train = folder / "train.json"
    train.write_text(json.dumps(squad_json(quoted_questions["train"], version="1.1")))
    test = write_jsonl(folder / "test.jsonl", quoted_questions["test"])
    out = folder / "out"
    argv = ["finetune", str(tiny_mlm_checkpoint), "--task", "question-answering", "--train-file", str(train), "--test-file", str(test),
            "--output-dir", str(out), "--epochs", "15", *RUN]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert scratchbert.commands.main(argv) == 0
    return {"out": out, "test": test, "summary": json.loads(printed.getvalue().splitlines()[-1])}


# --------------------------------------------------------------------------- exact match and F1


def test_exact_match_and_f1_are_the_official_scripts_on_hand_computed_cases():
    assert normalize_answer("The  Cat, sat!") == "cat sat"  # lower case, no punctuation, no article, single spaces
    assert normalize_answer("an apple a day") == "apple day"
    assert exact_match("the Cat.", "cat") == 1.0 and exact_match("cats", "cat") == 0.0
    # "quick brown fox" vs "quick fox jumps": 2 words in common, precision = recall = 2/3
    assert f1("the quick brown fox", "quick fox jumps") == pytest.approx(2 / 3)
    assert f1("fox fox", "fox") == pytest.approx(2 * 0.5 * 1 / 1.5)  # bags: one "fox" in common of two predicted
    assert f1("dog", "cat") == 0.0 and f1("", "cat") == 0.0 and f1("", "") == 1.0
    scores = squad_scores(["quick brown fox", "Paris", ""], [["quick fox jumps", "brown fox"], ["paris", "Paris, France"], []])
    # best gold of each: "brown fox" (P 2/3, R 1: F1 0.8, EM 0), "paris" (EM 1), unanswerable and "" (EM 1)
    assert scores == pytest.approx({"exact_match": 100 * 2 / 3, "f1": 100 * (0.8 + 1 + 1) / 3})
    assert squad_scores(["an answer"], [[]]) == {"exact_match": 0.0, "f1": 0.0}  # a span for an unanswerable question
    with pytest.raises(ValueError, match="one prediction per question"):
        squad_scores([], [])


def test_the_metrics_agree_with_the_evaluate_squad_metric_where_it_installs():
    evaluate = pytest.importorskip("evaluate")
    try:
        squad = evaluate.load("squad")
    except Exception as err:  # the metric's script comes from the Hub, not reachable here
        pytest.skip(f"the squad metric did not load: {err}")
    predictions, golds = ["the quick brown fox", "Paris", "1990s"], [["quick fox jumps"], ["paris", "Paris, France"], ["the 1990s"]]
    theirs = squad.compute(predictions=[{"id": str(i), "prediction_text": p} for i, p in enumerate(predictions)],
                           references=[{"id": str(i), "answers": {"text": g, "answer_start": [0] * len(g)}} for i, g in enumerate(golds)])  # fmt: skip
    assert squad_scores(predictions, golds) == pytest.approx(theirs)


# --------------------------------------------------------------------------- the data


def test_text_questions_are_real_spans_of_real_text():
    rows = questions_from_text()
    assert len(rows) > 500
    for row in rows:
        (text,), (start,) = row["answers"]["text"], row["answers"]["answer_start"]
        assert row["context"][start : start + len(text)] == text
    kinds = {row["question"].startswith(("What is", "What are")) for row in rows}
    assert kinds == {True, False}  # definitions and clozes
    unanswerable = questions_from_text(unanswerable=0.2, seed=1)
    empty = [row for row in unanswerable if not row["answers"]["text"]]
    assert 0.1 < len(empty) / len(rows) < 0.3
    assert all(row["question"] in {r["question"] for r in rows} for row in empty)


def test_squad_json_files_and_flat_rows_read_as_the_same_questions(tmp_path):
    from scratchbert.training.finetuning.data import read_splits

    rows = questions_from_text(unanswerable=0.2, seed=1)[:40]
    nested = tmp_path / "squad.json"
    nested.write_text(json.dumps(squad_json(rows)))
    flat = write_jsonl(tmp_path / "flat.jsonl", rows)
    for files in ([nested], [flat]):
        split = question_rows(read_splits(files)["train"], "train")
        by_id = {row["id"]: row for row in split}
        assert set(by_id) == {row["id"] for row in rows}
        for row in rows:
            assert (by_id[row["id"]]["context"], by_id[row["id"]]["answers"]["text"]) == (row["context"], row["answers"]["text"])
    check_questions({"train": split})


# --------------------------------------------------------------------------- windows


def long_question(tokenizer) -> dict:
    """A question whose context is over 300 tokens, so windows of 48 tokens cut it many times."""
    rows = questions_from_text(context_words=250)
    return next(row for row in rows if len(tokenizer(row["context"])["input_ids"]) > 300 and len(row["question"].split()) < 12)


def windows_of_one(tokenizer, row, reading=READING) -> dict:
    batch = {key: [row[key]] for key in ("question", "context", "answers")}
    return tokenize_windows(batch, [0], tokenizer, reading)


def test_a_long_context_becomes_windows_that_share_doc_stride_tokens(minilm_vocab_tokenizer):
    row = long_question(minilm_vocab_tokenizer)
    windows = windows_of_one(minilm_vocab_tokenizer, row)
    pieces = [[span for span in offsets if span is not None] for offsets in windows["offset_mapping"]]
    assert len(pieces) > 5 and set(windows["example"]) == {0}
    assert all(len(ids) <= READING.max_length for ids in windows["input_ids"])
    for before, after in zip(pieces, pieces[1:]):
        assert before[-READING.doc_stride :] == after[: READING.doc_stride]  # the stride: shared context pieces
    covered = sorted({span for window in pieces for span in window})
    assert covered[0][0] == 0 and covered[-1][1] == len(row["context"].rstrip())  # every character is in some window
    question_ids = minilm_vocab_tokenizer(row["question"], add_special_tokens=False)["input_ids"]
    assert all(ids[1 : 1 + len(question_ids)] == question_ids for ids in windows["input_ids"])  # every window reads the question


def test_an_answer_split_across_windows_is_labelled_in_the_window_that_holds_all_of_it(minilm_vocab_tokenizer):
    row = long_question(minilm_vocab_tokenizer)
    context = row["context"]
    probe = windows_of_one(minilm_vocab_tokenizer, row)
    first_window = [span for span in probe["offset_mapping"][0] if span is not None]
    # an answer of the three pieces across the first window's end: its last piece and the two after it
    start_char = first_window[-1][0]
    second_window = [span for span in probe["offset_mapping"][1] if span is not None]
    following = [span for span in second_window if span[0] > first_window[-1][0]]
    end_char = following[1][1]
    answer = {"text": [context[start_char:end_char]], "answer_start": [start_char]}
    windows = windows_of_one(minilm_vocab_tokenizer, {**row, "answers": answer})
    assert (windows["start_positions"][0], windows["end_positions"][0]) == (0, 0)  # cut by the window's end: [CLS]
    labelled = [w for w, start in enumerate(windows["start_positions"]) if start != 0]
    assert labelled and labelled[0] == 1
    for window in labelled:
        offsets = windows["offset_mapping"][window]
        start, end = windows["start_positions"][window], windows["end_positions"][window]
        assert context[offsets[start][0] : offsets[end][1]] == answer["text"][0]
    # the pieces that hold a character: the one it is inside, also mid-piece
    assert answer_pieces([None, (0, 5), (6, 9), None], {"text": ["ell"], "answer_start": [1]}) == (1, 1)
    assert answer_pieces([None, (0, 5), (6, 9), None], {"text": ["o wo"], "answer_start": [4]}) == (1, 2)
    assert answer_pieces([None, (0, 5), (6, 9), None], {"text": [], "answer_start": []}) == (0, 0)  # no answer (v2)


def test_doc_stride_must_leave_a_window_room_to_move_on(minilm_vocab_tokenizer):
    check_stride(minilm_vocab_tokenizer, ["what is it?"], READING)  # 4 question tokens: 41 context tokens, stride 8
    with pytest.raises(Exception, match=r"doc_stride 41 must be less than the 41 context tokens a window has .*lower --doc-stride or raise --max-length"):
        check_stride(minilm_vocab_tokenizer, ["what is it?"], SpanReading(48, 41, 20, 30, False))
    with pytest.raises(Exception, match="leaves no room for its context"):
        check_stride(minilm_vocab_tokenizer, [" ".join(["word"] * 60)], READING)


# --------------------------------------------------------------------------- post-processing


def logits_of(*peaks, length=8) -> np.ndarray:
    """(N, T) logits, 0 but at each window's {position: value} peaks."""
    rows = np.zeros((len(peaks), length))
    for row, window in zip(rows, peaks):
        for position, value in window.items():
            row[position] = value
    return rows


def test_the_best_span_over_all_windows_of_a_question_is_its_answer():
    context = "alpha beta gamma delta epsilon"
    # two windows of one question: [CLS] q [SEP] then context pieces; None outside the context
    windows = {"example": [0, 0], "offset_mapping": [
        [None, None, None, (0, 5), (6, 10), (11, 16), None],
        [None, None, None, (11, 16), (17, 22), (23, 30), None],
    ]}  # fmt: skip
    starts = logits_of({3: 1.0}, {4: 3.0, 1: 9.0, 3: -9.0})  # 1: a question token, never a start
    ends = logits_of({5: 1.0}, {5: 2.0, 3: 8.0})  # 3 is before the best start 4: not an end for it
    (answer,) = best_answers(starts, ends, windows, [context], READING)
    assert answer == {"text": "delta epsilon", "start": 17, "end": 30, "score": 5.0}
    (short,) = best_answers(starts, ends, windows, [context], SpanReading(48, 8, 20, 1, False))  # one piece at most
    assert short == {"text": "delta", "start": 17, "end": 22, "score": 3.0}
    # v2: [CLS] (position 0) scores higher than the best span in every window: no answer; v1.1 has no such choice
    null = (logits_of({0: 4.0, 3: 1.0}, {0: 4.0, 4: 3.0}), logits_of({0: 3.0, 5: 1.0}, {0: 3.0, 5: 2.0}))
    assert best_answers(*null, windows, [context], SpanReading(48, 8, 20, 30, True))[0]["text"] == ""
    assert best_answers(*null, windows, [context], READING)[0]["text"] == "delta epsilon"
    # the null score is the smallest over the windows (run_qa.py): the first window's 4, below the best span's 5
    lower = (logits_of({0: 2.0, 3: 1.0}, {0: 4.0, 4: 3.0}), logits_of({0: 2.0, 5: 1.0}, {0: 3.0, 5: 2.0}))
    assert best_answers(*lower, windows, [context], SpanReading(48, 8, 20, 30, True))[0]["text"] == "delta epsilon"


def test_windows_padded_past_their_pieces_never_answer_with_padding():
    context = "alpha beta"
    windows = {"example": [0], "offset_mapping": [[None, None, None, (0, 5), (6, 10), None]]}
    starts, ends = logits_of({3: 1.0, 7: 50.0}), logits_of({4: 1.0, 7: 50.0})  # 7: batch padding (Trainer pads with -100)
    assert best_answers(starts, ends, windows, [context], READING)[0]["text"] == "alpha beta"


# --------------------------------------------------------------------------- the run and `scratchbert answer`


def test_finetune_learns_the_questions_and_answer_gives_the_answers_it_scored(trained, quoted_questions, capsys):
    summary = trained["summary"]
    assert set(summary) == {"validation", "test"} and set(summary["test"]) == {"f1", "exact_match"}
    assert summary["test"]["exact_match"] > 20  # the untrained head: 0 (it answers with a span of the window's start)
    test = quoted_questions["test"]
    answers = answer_questions(trained["out"], [row["question"] for row in test], [row["context"] for row in test])
    scores = squad_scores([answer["text"] for answer in answers], [row["answers"]["text"] for row in test])
    assert scores == summary["test"]  # the very figures the command printed
    for answer, row in zip(answers, test):
        assert row["context"][answer["start"] : answer["end"]] == answer["text"]

    assert scratchbert.commands.main(["answer", "--model", str(trained["out"]), "--file", str(trained["test"])]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["id"] for line in printed] == [row["id"] for row in test]
    assert [line["text"] for line in printed] == [answer["text"] for answer in answers]
    row = test[0]
    assert scratchbert.commands.main(["answer", "--model", str(trained["out"]), "--question", row["question"], "--context", row["context"]]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == answers[0]["text"]


def test_the_saved_folder_records_how_it_read_and_answered(trained):
    config = json.loads((trained["out"] / "config.json").read_text())
    assert config["question_answering"] == {"max_length": 48, "doc_stride": 8, "n_best": 20, "max_answer_length": 30, "null_answers": False}
    metrics = json.loads((trained["out"] / "metrics.json").read_text())
    assert metrics["test"]["f1"] == trained["summary"]["test"]["f1"] and metrics["windows"]["test"] > len(metrics["reading"])
    assert not (trained["out"] / "checkpoints").exists()


def test_squad_v2_questions_without_an_answer_are_recognised_and_scored(tmp_path, tiny_mlm_checkpoint, capsys):
    rows = [row for row in questions_from_text(context_words=1, unanswerable=0.3, seed=2) if len(row["question"].split()) <= 20][:60]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    out = tmp_path / "out"
    code, printed, err = finetune_cli(capsys, tiny_mlm_checkpoint, "--task", "question-answering", "--train-file", train, "--output-dir", out, "--epochs", "1", *RUN)
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["question_answering"]["null_answers"] is True
    assert set(json.loads(printed.splitlines()[-1])["validation"]) == {"f1", "exact_match"}


def bad_rows(quoted_questions, change) -> list[dict]:
    rows = [json.loads(json.dumps(row)) for row in quoted_questions["train"][:12]]
    change(rows)
    return rows


@pytest.mark.parametrize(
    "change, flags, message",
    [
        (lambda rows: [row.pop("question") for row in rows], [], "the train data has no column 'question'"),
        (lambda rows: rows[3]["answers"].update(answer_start=[rows[3]["answers"]["answer_start"][0] + 2]), [],
         r"question 'q\d+' \(row 4 of the train data\): answer '.+' is not at answer_start \d+ of its context \(it is at character \d+: set answer_start to \d+\)"),
        (lambda rows: rows[0]["answers"].update(text=["not in the text at all"]), [], "the context does not contain it: fix the answer's text"),
        (lambda rows: rows[1].update(context=" "), [], r"question 'q\d+' \(row 2 of the train data\) has no context"),
        (lambda rows: None, ["--doc-stride", "47"], "doc_stride 47 must be less than the"),
        (lambda rows: None, ["--windows", "2"], "--windows belong to text classification"),
    ],
)  # fmt: skip
def test_bad_questions_stop_in_one_line_and_write_nothing(tmp_path, tiny_mlm_checkpoint, quoted_questions, capsys, change, flags, message):
    train = write_jsonl(tmp_path / "train.jsonl", bad_rows(quoted_questions, change))
    out = tmp_path / "out"
    code, _, err = finetune_cli(capsys, tiny_mlm_checkpoint, "--task", "question-answering", "--train-file", train, "--output-dir", out, *RUN, *flags)
    assert_refused(code, err, message, out)


def test_squad_files_without_questions_are_refused(tmp_path, tiny_mlm_checkpoint, capsys):
    for number, data in enumerate(([], [{"title": "t", "paragraphs": []}])):
        empty = tmp_path / f"empty{number}.json"
        empty.write_text(json.dumps({"version": "1.1", "data": data}))
        code, _, err = finetune_cli(capsys, tiny_mlm_checkpoint, "--task", "question-answering", "--train-file", empty, "--output-dir", tmp_path / "out", *RUN)
        assert code == 2 and "the train data is a SQuAD file without questions" in err, err
    assert not (tmp_path / "out").exists()


def test_answer_refuses_a_model_not_fine_tuned_for_questions_and_bad_arguments(tiny_mlm_checkpoint, minilm_vocab_tokenizer, tmp_path, capsys):
    from transformers import AutoModelForQuestionAnswering

    folder = tmp_path / "plain_qa"  # a QA head never fine-tuned by the command: its config records no reading
    AutoModelForQuestionAnswering.from_pretrained(str(tiny_mlm_checkpoint)).save_pretrained(folder)
    minilm_vocab_tokenizer.save_pretrained(folder)
    assert scratchbert.commands.main(["answer", "--model", str(folder), "--question", "what?", "--context", "it"]) == 2
    assert "was not fine-tuned by `scratchbert finetune --task question-answering`" in capsys.readouterr().err
    assert scratchbert.commands.main(["answer", "--model", str(folder), "--question", "what?"]) == 2
    assert "give --question and --context, or --file" in capsys.readouterr().err
    with pytest.raises(Exception, match="one context per question"):
        answer_questions(folder, ["a?", "b?"], ["only one"])
    (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:1000])  # cut short
    assert scratchbert.commands.main(["answer", "--model", str(folder), "--question", "what?", "--context", "it"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "model.safetensors is corrupt or incomplete" in err, err
    assert scratchbert.commands.main(["answer", "--model", str(tmp_path / "absent"), "--question", "what?", "--context", "it"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_questions_drawn_at_random_are_reproducible():
    assert questions_from_text(unanswerable=0.2, seed=5) == questions_from_text(unanswerable=0.2, seed=5)
    random.seed(0)  # the module's draws use their own generator, not the global one
    assert questions_from_text(unanswerable=0.2, seed=5) == questions_from_text(unanswerable=0.2, seed=5)
