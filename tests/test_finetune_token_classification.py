"""`scratchbert finetune --task token-classification`: word lists and CoNLL files, first-piece labels,
seqeval's scores, the saved folder in transformers' pipeline giving the figures the command printed, and
every error.

The sentences are real: the Brown Corpus press sentences of the shared data (part-of-speech tags), and an
entity task made of them (runs of proper nouns as NAME entities in IOB2). The fast runs train a tiny model
(hidden 32, 2 layers); scripts/bench_token_classification.py measures all-MiniLM-L6-v2's weights."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import random

import pytest
from conftest import assert_refused, finetune_cli, write_jsonl

import scratchbert.commands
from scratchbert.ingestion import DataError, read_conll
from scratchbert.modeling_scratchbert import IGNORE_INDEX
from scratchbert.training.finetuning.entity_metrics import entities, is_entity_scheme, tagging_scores
from scratchbert.training.finetuning.token_classification import tokenize_words

RUN = ["--text-column", "tokens", "--label-column", "tags", "--max-length", "64", "--batch-size", "16", "--learning-rate", "3e-3", "--no-progress-bar"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models run on one thread


def brown(shared_data, split: str, count: int) -> list[dict]:
    """The first `count` Brown press sentences of a split, {"tokens", "tags"}, of up to 30 words."""
    with gzip.open(shared_data / "brown-pos" / f"{split}.jsonl.gz", "rt") as lines:
        rows = [json.loads(line) for line in lines]
    return [{"tokens": row["tokens"], "tags": row["tags"]} for row in rows if len(row["tokens"]) <= 30][:count]


def names_as_entities(row: dict) -> dict:
    """Runs of proper nouns (Brown's np, nps, np$) as NAME entities, IOB2; every other word O."""
    tags, previous = [], False
    for tag in row["tags"]:
        name = tag.startswith("np")
        tags.append(("I-NAME" if previous else "B-NAME") if name else "O")
        previous = name
    return {"tokens": row["tokens"], "tags": tags}


def write_conll(path, rows):
    lines = ["-DOCSTART- -X- O", ""]
    for row in rows:
        lines += [f"{word}\tX\t{tag}" for word, tag in zip(row["tokens"], row["tags"])] + [""]
    path.write_text("\n".join(lines))
    return path


# --------------------------------------------------------------------------- seqeval's scores


def test_scores_are_seqevals_on_its_documented_example():
    """seqeval's README: a MISC entity one word too early, a PER entity right -> F1 0.5, accuracy 0.8."""
    gold = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    predicted = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    scores = tagging_scores(gold, predicted, entity_scheme=True)
    assert (scores["accuracy"], scores["precision"], scores["recall"], scores["f1"]) == (0.8, 0.5, 0.5, 0.5)
    assert scores["per_type"] == {"MISC": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "number": 1},
                                  "PER": {"precision": 1.0, "recall": 1.0, "f1": 1.0, "number": 1}}  # fmt: skip


def test_chunks_are_read_leniently_as_seqeval_reads_them():
    assert entities([["I-PER", "I-PER", "O"]]) == {("PER", 0, 1)}  # IOB1: I- opens a chunk after O
    assert entities([["B-PER", "I-LOC"]]) == {("PER", 0, 0), ("LOC", 1, 1)}  # a change of type ends one
    assert entities([["B-PER", "B-PER"]]) == {("PER", 0, 0), ("PER", 1, 1)}
    assert entities([["S-LOC", "B-PER", "E-PER", "E-PER"]]) == {("LOC", 0, 0), ("PER", 1, 2), ("PER", 3, 3)}  # BIOES
    assert entities([["B-PER"], ["I-PER"]]) == {("PER", 0, 0), ("PER", 2, 2)}  # no entity runs across two sentences
    assert is_entity_scheme(["O", "B-PER", "I-PER"]) and is_entity_scheme(["S-LOC", "E-LOC", "O"])
    assert not is_entity_scheme(["nn", "vb", "at"]) and not is_entity_scheme(["O"]) and not is_entity_scheme(["B-PER", "nn"])


def test_scores_equal_seqevals_on_random_tag_sequences():
    """Against the package itself where it installs (run_ner.py's metric), IOB1, IOB2 and BIOES mixed."""
    seqeval = pytest.importorskip("seqeval.metrics", reason="seqeval is not installed (pip install seqeval)")
    rng = random.Random(0)
    tags = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "E-LOC", "S-ORG", "I-ORG"]
    for _ in range(50):
        gold = [[rng.choice(tags) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 6))]
        predicted = [[tag if rng.random() < 0.7 else rng.choice(tags) for tag in sentence] for sentence in gold]
        scores = tagging_scores(gold, predicted, entity_scheme=True)
        assert scores["accuracy"] == pytest.approx(seqeval.accuracy_score(gold, predicted))
        for name in ("precision", "recall", "f1"):
            assert scores[name] == pytest.approx(getattr(seqeval, f"{name}_score")(gold, predicted, zero_division=0)), (name, gold, predicted)
        report = seqeval.classification_report(gold, predicted, output_dict=True, zero_division=0)
        for kind, figures in scores["per_type"].items():
            assert figures["f1"] == pytest.approx(report[kind]["f1-score"]) and figures["number"] == report[kind]["support"]


# --------------------------------------------------------------------------- data


def test_conll_files_read_as_tokens_and_tags(tmp_path, shared_data):
    rows = brown(shared_data, "train", 5)
    path = write_conll(tmp_path / "train.conll", rows)
    read = read_conll([str(path)])
    assert read["tokens"] == [row["tokens"] for row in rows] and read["tags"] == [row["tags"] for row in rows]
    with gzip.open(tmp_path / "train.conll.gz", "wt") as packed:
        packed.write(path.read_text())
    assert read_conll([str(tmp_path / "train.conll.gz")])["tags"] == read["tags"]
    (tmp_path / "bad.conll").write_text("The at\nbad\n")
    with pytest.raises(DataError, match=r"line 2 of .*bad.conll is 'bad': a CoNLL line is a word and its tag"):
        read_conll([str(tmp_path / "bad.conll")])


def test_a_words_first_piece_carries_its_tag_and_label_all_pieces_every_piece(minilm_vocab_tokenizer):
    batch = {"tokens": [["Unaffable", "Jo", "smiled"]], "tags": [["B-ADJ", "B-PER", "O"]]}
    names = ["B-ADJ", "B-PER", "I-ADJ", "I-PER", "O"]
    options = dict(tokenizer=minilm_vocab_tokenizer, words_column="tokens", tags_column="tags", tag_names=names, tag_name=str, max_length=64)
    first = tokenize_words(batch, all_pieces=False, **options)
    every = tokenize_words(batch, all_pieces=True, **options)
    pieces = minilm_vocab_tokenizer.convert_ids_to_tokens(first["input_ids"][0])
    assert pieces[:4] == ["[CLS]", "una", "##ffa", "##ble"]  # one word, three pieces
    assert first["labels"][0] == [IGNORE_INDEX, 0, IGNORE_INDEX, IGNORE_INDEX, 1, 4, IGNORE_INDEX]
    assert every["labels"][0] == [IGNORE_INDEX, 0, 2, 2, 1, 4, IGNORE_INDEX]  # B-ADJ continues as I-ADJ
    cut = tokenize_words(batch, all_pieces=False, **{**options, "max_length": 5})  # [CLS] una ##ffa ##ble jo [SEP]: too long
    assert (cut["words"], cut["words_read"]) == ([3], [1])


# --------------------------------------------------------------------------- the command, end to end


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_mlm_checkpoint, shared_data):
    """One run of the command on Brown's part-of-speech tags (JSON lines); what it printed."""
    folder = tmp_path_factory.mktemp("tagging_run")
    train = write_jsonl(folder / "train.jsonl", brown(shared_data, "train", 600))
    test = write_jsonl(folder / "test.jsonl", brown(shared_data, "test", 150))
    out = folder / "out"
    argv = ["finetune", str(tiny_mlm_checkpoint), "--task", "token-classification", "--train-file", str(train), "--test-file", str(test),
            "--output-dir", str(out), "--epochs", "4", *RUN]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert scratchbert.commands.main(argv) == 0
    return {"out": out, "test": test, "summary": json.loads(printed.getvalue().splitlines()[-1])}


def test_the_pipeline_tags_the_test_words_with_the_accuracy_the_command_printed(trained, shared_data):
    from transformers import pipeline

    summary = trained["summary"]
    assert set(summary["test"]) == {"accuracy"}  # part-of-speech tags: no entities to score
    assert summary["test"]["accuracy"] > 0.4  # 114 tags; the most frequent one (nn) is 13% of the words
    rows = brown(shared_data, "test", 150)
    tagger = pipeline("token-classification", model=str(trained["out"]), aggregation_strategy="none", ignore_labels=[])
    right = words = 0
    for row, pieces in zip(rows, tagger([row["tokens"] for row in rows], is_split_into_words=True)):
        starts, position = {}, 0
        for word in row["tokens"]:  # the pipeline joins the words with a space; a word's first piece starts where it does
            starts[position] = word
            position += len(word) + 1
        tag_at = {piece["start"]: piece["entity"] for piece in pieces if piece["start"] in starts}
        assert len(tag_at) == len(row["tokens"])  # every word read: none of these sentences is cut
        right += sum(tag_at[start] == tag for start, tag in zip(starts, row["tags"]))
        words += len(row["tokens"])
    assert right / words == summary["test"]["accuracy"]  # to the last word


def test_the_saved_folder_names_its_tags_and_the_run_its_figures(trained):
    config = json.loads((trained["out"] / "config.json").read_text())
    metrics = json.loads((trained["out"] / "metrics.json").read_text())
    assert sorted(config["id2label"].values()) == metrics["labels"] and len(metrics["labels"]) > 50
    assert metrics["entity_scheme"] is False and metrics["test"]["accuracy"] == trained["summary"]["test"]["accuracy"]
    assert metrics["words_cut"]["test"] == {"sentences": 0, "words": 0}
    assert not (trained["out"] / "checkpoints").exists()


def test_conll_entities_are_scored_as_seqeval_scores_them(tmp_path, tiny_mlm_checkpoint, shared_data, capsys):
    train = write_conll(tmp_path / "train.conll", [names_as_entities(row) for row in brown(shared_data, "train", 300)])
    test = write_conll(tmp_path / "test.conll", [names_as_entities(row) for row in brown(shared_data, "test", 100)])
    out = tmp_path / "out"
    code, printed, err = finetune_cli(capsys, tiny_mlm_checkpoint, "--task", "token-classification", "--train-file", train, "--test-file", test,
                                      "--output-dir", out, "--epochs", "2", "--label-all-pieces", *RUN)  # fmt: skip
    assert code == 0, err
    summary = json.loads(printed.splitlines()[-1])
    assert set(summary["test"]) == {"f1", "accuracy"} and 0 <= summary["test"]["f1"] <= 1
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["entity_scheme"] is True and metrics["labels"] == ["B-NAME", "I-NAME", "O"]
    assert {"NAME_precision", "NAME_recall", "NAME_f1", "NAME_number"} <= set(metrics["test"]) and metrics["test"]["NAME_number"] > 20


def bad_rows(shared_data, change) -> list[dict]:
    rows = brown(shared_data, "train", 12)
    change(rows)
    return rows


@pytest.mark.parametrize(
    "change, flags, message",
    [
        (lambda rows: [row.pop("tags") for row in rows], [], r"the train data has no column 'tags' \(its columns: tokens\); name the column of word lists"),
        (lambda rows: rows[4]["tags"].pop(), [], r"row 5 of the train data \(the first row is 1\) has (\d+) words but \d+ tags in column 'tags': give one tag per word"),
        (lambda rows: rows[2].update(tokens=[]), [], r"row 3 of the train data .*: column 'tokens' must hold a non-empty list of words"),
        (lambda rows: rows.clear(), [], r"the train data is empty|the training data is empty"),
        (lambda rows: None, ["--windows", "2"], "--windows belong to text classification"),
    ],
)  # fmt: skip
def test_bad_sentences_stop_in_one_line_and_write_nothing(tmp_path, tiny_mlm_checkpoint, shared_data, capsys, change, flags, message):
    train = write_jsonl(tmp_path / "train.jsonl", bad_rows(shared_data, change))
    out = tmp_path / "out"
    code, _, err = finetune_cli(capsys, tiny_mlm_checkpoint, "--task", "token-classification", "--train-file", train, "--output-dir", out, *RUN, *flags)
    assert_refused(code, err, message, out)
