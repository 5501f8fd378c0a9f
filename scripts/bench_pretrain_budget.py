"""Does pretraining pay off? One CPU budget, four ways to get a sentiment classifier, one table.

Not a test (an hour or more of CPU). On the IMDB reviews of ../shared/data/imdb:

  (a) scratchbert: `scratchbert pretrain --time-budget MINUTES` (the default recipe) on the
      text of the training reviews, then fine-tuned;
  (b) the same architecture and tokenizer at random initialisation, fine-tuned the same way;
  (c) TF-IDF (1-2-grams) + logistic regression on the same labelled reviews (scikit-learn);
  (d) transformers' own recipe for the same wall-clock budget on the same text, tokenizer and
      geometry, i.e. what `run_mlm.py` does: `BertForMaskedLM` + `DataCollatorForLanguageModeling`
      (15%) + `Trainer`, the reviews tokenized, concatenated and cut into blocks, peak learning
      rate 5e-4 with 6% warmup and linear decay, bf16 where the CPU has it. Its step count is
      calibrated from timed steps so that its schedule ends at the budget, and a callback stops
      it at the budget in any case.

Each classifier is fine-tuned (`scratchbert.training.finetune`, head+tail truncation) on
`--train-reviews` labelled training reviews and scored on `--test-reviews` test reviews; every
seed draws another labelled subset (the same subset for every row). The table gives test
accuracy as mean ± 1 sample standard deviation over the seeds, held-out MLM accuracy of (a)
and (d) on test reviews (15% masking, the same masks for both) and their training throughput.

    pip install -e .[bench]
    python scripts/bench_pretrain_budget.py                          # 60 minutes, 3 seeds
    python scripts/bench_pretrain_budget.py --minutes 15 --out runs/bench-15

Needs ../shared/data (or --imdb DIR). Name the CPU with the figures: the script prints it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
IMDB = REPO.parent / "shared" / "data" / "imdb"


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


def write_review_text(source: Path, target: Path) -> int:
    """The reviews' text, one review per document (blank-line separated), for pretraining."""
    count = 0
    with gzip.open(source, "rt", encoding="utf-8") as rows, open(target, "w", encoding="utf-8") as out:
        for line in rows:
            text = " ".join(json.loads(line)["text"].split())
            if text:
                out.write(text + "\n\n")
                count += 1
    return count


# ---------------------------------------------------------------------------------------------
# (a) scratchbert
# ---------------------------------------------------------------------------------------------
def pretrain_scratchbert(args, text_file: Path, tokenizer_dir: Path, out: Path) -> dict:
    from scratchbert.training.config import PretrainConfig
    from scratchbert.training.pretrain import pretrain
    from scratchbert.training.plotting import read_log

    config = PretrainConfig(
        preset=args.preset, train_files=[str(text_file)], tokenizer=str(tokenizer_dir), max_seq_length=args.max_seq_length,
        batch_size=args.batch_size, time_budget=args.minutes, mixed_precision=args.mixed_precision, output_dir=str(out),
        eval_every=200, save_every=0, report_to="none", overwrite=True, seed=args.seed,  # evaluations do not count against the budget
    )  # fmt: skip
    pretrain(config)
    final = [r for r in read_log(out / "train_log.jsonl") if r["type"] == "final"][-1]
    return {"steps": final["step"], "tokens": final["tokens_seen"], "seconds": final["training_seconds"]}


# ---------------------------------------------------------------------------------------------
# (b) random initialisation
# ---------------------------------------------------------------------------------------------
def save_random_init(args, tokenizer, out: Path) -> None:
    from scratchbert import ScratchBertConfig, ScratchBertForMaskedLM
    from scratchbert.training.config import PretrainConfig

    if args.reuse and (out / "model.safetensors").is_file():
        return
    geometry = PretrainConfig(preset=args.preset).saved_model_kwargs()  # as (a) is saved: fine-tuning dropout
    torch.manual_seed(args.seed)
    model = ScratchBertForMaskedLM(ScratchBertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **geometry))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


# ---------------------------------------------------------------------------------------------
# (d) transformers' run_mlm.py recipe
# ---------------------------------------------------------------------------------------------
def group_texts(tokenizer, texts: list[str], block_size: int) -> list[list[int]]:
    """run_mlm.py's preprocessing: tokenize each text (with its [CLS]/[SEP]), concatenate, cut into blocks."""
    ids = tokenizer(texts, return_attention_mask=False, return_token_type_ids=False, verbose=False)["input_ids"]
    stream = [token for row in ids for token in row]
    return [stream[i : i + block_size] for i in range(0, len(stream) - block_size + 1, block_size)]


def pretrain_transformers(args, texts: list[str], tokenizer, out: Path) -> dict:
    from datasets import Dataset
    from transformers import BertConfig, BertForMaskedLM, DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments

    from scratchbert.training.config import PretrainConfig

    geometry = PretrainConfig(preset=args.preset).model_kwargs()
    blocks = Dataset.from_dict({"input_ids": group_texts(tokenizer, texts, args.max_seq_length)})
    torch.manual_seed(args.seed)
    model = BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **geometry))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    budget = 60.0 * args.minutes

    class Clock(TrainerCallback):
        """Stops at the budget; records when training started, when each step ended and how many it made."""

        def __init__(self, stop_at: float | None):
            self.stop_at, self.started, self.steps, self.step_ends = stop_at, None, 0, []

        def on_train_begin(self, *_, **__):
            self.started = time.perf_counter()

        def on_step_end(self, _args, state, control, **__):
            self.steps = state.global_step
            self.step_ends.append(time.perf_counter())
            if self.stop_at is not None and time.perf_counter() - self.started >= self.stop_at:
                control.should_training_stop = True

    def trainer(max_steps: int, clock: Clock) -> Trainer:
        training_args = TrainingArguments(
            output_dir=str(out / "trainer"), max_steps=max_steps, per_device_train_batch_size=args.batch_size,
            learning_rate=5e-4, warmup_steps=0.06, lr_scheduler_type="linear", weight_decay=0.01,
            bf16=args.mixed_precision == "bf16", use_cpu=True, save_strategy="no", eval_strategy="no",
            logging_steps=50, report_to="none", seed=args.seed, disable_tqdm=True, dataloader_drop_last=True,
        )  # fmt: skip
        return Trainer(model=model, args=training_args, train_dataset=blocks, data_collator=collator, callbacks=[clock])

    # Calibrate: time a few steps on a throwaway copy of the weights, then size the schedule to the budget.
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    probe = Clock(None)
    trainer(args.calibration_steps, probe).train()
    # The first steps are slow (allocations, autocast's first casts): time the ones after them.
    settled = probe.step_ends[len(probe.step_ends) // 4 :]
    seconds_per_step = (settled[-1] - settled[0]) / (len(settled) - 1)
    model.load_state_dict(initial)
    max_steps = max(1, int(budget / seconds_per_step))
    print(f"(d) transformers: {seconds_per_step:.3f} s/step in calibration -> max_steps {max_steps} for {args.minutes:g} minutes")

    clock = Clock(budget)
    result = trainer(max_steps, clock).train()
    # Saved as (a) is: pretraining dropout is the recipe's, fine-tuning gets BERT's 0.1.
    model.config.hidden_dropout_prob = model.config.attention_probs_dropout_prob = PretrainConfig().finetune_dropout
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    steps = clock.steps
    return {"steps": steps, "tokens": steps * args.batch_size * args.max_seq_length, "seconds": result.metrics["train_runtime"]}


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------
def held_out_mlm_accuracy(model_dir: Path, tokenizer, texts: list[str], max_seq_length: int) -> float:
    """MLM accuracy on packed blocks of unseen reviews, 15% masking, the same masks for every model."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from scratchbert import ScratchBertForMaskedLM
    from scratchbert.training.collator import DataCollatorForPretraining
    from scratchbert.training.data import build_packed_dataset
    from scratchbert.training.collator import IndexedDataset, SeededCollator
    from scratchbert.training.evaluation import EVAL_MLM_PROBABILITY, evaluate

    blocks = build_packed_dataset(texts, tokenizer, max_seq_length=max_seq_length)
    collate = SeededCollator(DataCollatorForPretraining(tokenizer, mlm_probability=EVAL_MLM_PROBABILITY), seed=1)
    loader = DataLoader(IndexedDataset(blocks), batch_size=32, collate_fn=collate)
    model = ScratchBertForMaskedLM.from_pretrained(str(model_dir))
    return evaluate(model, loader, Accelerator(cpu=True))["mlm_accuracy"]


# What a fine-tuning run depends on besides its model: with --reuse, a run made with the same
# values after the model was saved is not repeated.
FINETUNE_ARGS = ("train_reviews", "validation_reviews", "test_reviews", "finetune_length", "epochs", "finetune_lr", "seed")


def finetune_accuracy(args, model_dir: Path, data: dict, seed: int, out: Path) -> float:
    from scratchbert.training.finetune import finetune_text_classification

    record = out / "bench_finetune.json"
    settings = {name: getattr(args, name) for name in FINETUNE_ARGS} | {"run_seed": seed}
    if args.reuse and record.is_file() and record.stat().st_mtime > (model_dir / "model.safetensors").stat().st_mtime:
        saved = json.loads(record.read_text())
        if saved["settings"] == settings:
            return saved["accuracy"]
    results = finetune_text_classification(
        str(model_dir), str(out), train_files=[str(data["train"])], validation_files=[str(data["validation"])],
        test_files=[str(data["test"])], max_train_samples=args.train_reviews, max_length=args.finetune_length,
        truncation="head+tail", epochs=args.epochs, learning_rate=args.finetune_lr, batch_size=16,
        best_metric="accuracy", seed=seed, show_progress=False, overwrite=True,
    )  # fmt: skip
    record.write_text(json.dumps({"settings": settings, "accuracy": results["test"]["accuracy"]}) + "\n")
    return results["test"]["accuracy"]


def tfidf_accuracy(args, data: dict, seed: int) -> float:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    from scratchbert.training.finetune import load_splits

    splits = load_splits([str(data["train"])], [str(data["validation"])], [str(data["test"])], max_train_samples=args.train_reviews, seed=seed)
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
    features = vectorizer.fit_transform(splits["train"]["text"])
    classifier = LogisticRegression(C=10.0, max_iter=2000).fit(features, splits["train"]["label"])
    return float((classifier.predict(vectorizer.transform(splits["test"]["text"])) == splits["test"]["label"]).mean())


def labelled_files(imdb: Path, out: Path, test_reviews: int, validation_reviews: int, seed: int) -> dict:
    """train (all labelled training reviews but the validation ones), validation and test JSONL files."""
    import random

    def rows(name: str) -> list[str]:
        with gzip.open(imdb / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
            return f.read().splitlines()

    train, test = rows("train"), rows("test")
    random.Random(seed).shuffle(train)
    random.Random(seed + 1).shuffle(test)
    files = {"validation": train[:validation_reviews], "train": train[validation_reviews:], "test": test[:test_reviews]}
    paths = {}
    for name, lines in files.items():
        paths[name] = out / f"{name}.jsonl"
        paths[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


def mean_std(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{statistics.mean(values):.4f} ± {spread:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="pretraining budget of (a) and of (d)")
    parser.add_argument("--imdb", default=str(IMDB), help="folder with train.jsonl.gz and test.jsonl.gz")
    parser.add_argument("--corpus", help="pretraining text file(s) instead of the IMDB training reviews' text")
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--mixed-precision", default="bf16", choices=["no", "bf16"])
    parser.add_argument("--vocab-size", type=int, default=16384)
    parser.add_argument("--train-reviews", type=int, default=2000, help="labelled reviews to fine-tune on")
    parser.add_argument("--validation-reviews", type=int, default=500, help="labelled reviews that pick the best epoch")
    parser.add_argument("--test-reviews", type=int, default=2000)
    parser.add_argument("--mlm-eval-reviews", type=int, default=1000, help="unseen reviews for held-out MLM accuracy")
    parser.add_argument("--finetune-length", type=int, default=256, help="tokens per review (head+tail)")
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--finetune-lr", type=float, default=1e-4)
    parser.add_argument("--seeds", type=int, default=3, help="fine-tuning runs per row (each on another labelled subset)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calibration-steps", type=int, default=20, help="timed steps of (d) before its run, to size its schedule")
    parser.add_argument("--reuse", action="store_true", help="keep the tokenizer, the finished pretraining runs and the fine-tuning runs (made with the same settings) already in --out")
    parser.add_argument("--skip", nargs="*", default=[], choices=["a", "b", "c", "d"], help="rows to leave out")
    parser.add_argument("--out", default="runs/bench-pretrain-budget")
    args = parser.parse_args()
    if args.minutes <= 0:
        sys.exit("--minutes must be positive")
    imdb = Path(args.imdb)
    if not (imdb / "train.jsonl.gz").is_file():
        sys.exit(f"no IMDB data at {imdb} (train.jsonl.gz, test.jsonl.gz): pass --imdb DIR")

    from scratchbert.tokenization import train_tokenizer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}; budget {args.minutes:g} minutes")

    text_file = out / "imdb_train.txt"
    if args.corpus:
        text_file = Path(args.corpus)
    else:
        print(f"pretraining text: {write_review_text(imdb / 'train.jsonl.gz', text_file)} training reviews")
    texts = [t for t in text_file.read_text(encoding="utf-8").split("\n\n") if t.strip()]
    if args.reuse and (out / "tokenizer").is_dir():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer")
    else:
        tokenizer = train_tokenizer(texts, vocab_size=args.vocab_size, model_max_length=512, show_progress=False)
        tokenizer.save_pretrained(out / "tokenizer")
    data = labelled_files(imdb, out, args.test_reviews, args.validation_reviews, args.seed)
    with gzip.open(imdb / "test.jsonl.gz", "rt", encoding="utf-8") as f:
        mlm_texts = [json.loads(line)["text"] for _, line in zip(range(args.mlm_eval_reviews), f)]

    rows: dict[str, dict] = {}
    if "a" not in args.skip:
        if args.reuse and (out / "a" / "model.safetensors").is_file():
            from scratchbert.training.plotting import read_log

            final = [r for r in read_log(out / "a" / "train_log.jsonl") if r["type"] == "final"][-1]
            stats = {"steps": final["step"], "tokens": final["tokens_seen"], "seconds": final["training_seconds"]}
        else:
            stats = pretrain_scratchbert(args, text_file, out / "tokenizer", out / "a")
        rows["a"] = {"name": "(a) scratchbert pretrain", "dir": out / "a", **stats}
    if "b" not in args.skip:
        save_random_init(args, tokenizer, out / "b")
        rows["b"] = {"name": "(b) random init", "dir": out / "b"}
    if "d" not in args.skip:
        if args.reuse and (out / "d" / "stats.json").is_file():
            stats = json.loads((out / "d" / "stats.json").read_text())
        else:
            stats = pretrain_transformers(args, texts, tokenizer, out / "d")
            (out / "d" / "stats.json").write_text(json.dumps(stats) + "\n")
        rows["d"] = {"name": "(d) transformers run_mlm recipe", "dir": out / "d", **stats}
    for key in ("a", "d"):
        if key in rows:
            rows[key]["mlm_accuracy"] = held_out_mlm_accuracy(rows[key]["dir"], tokenizer, mlm_texts, args.max_seq_length)
            rows[key]["tokens_per_second"] = rows[key]["tokens"] / rows[key]["seconds"]
    seeds = [args.seed + i for i in range(args.seeds)]
    for key, row in rows.items():
        row["accuracy"] = [finetune_accuracy(args, row["dir"], data, seed, out / f"finetune-{key}-{seed}") for seed in seeds]
        print(f"{row['name']}: test accuracy {row['accuracy']}")
    if "c" not in args.skip:
        rows["c"] = {"name": "(c) TF-IDF + logistic regression", "accuracy": [tfidf_accuracy(args, data, seed) for seed in seeds]}

    lines = [
        f"pretraining budget {args.minutes:g} min, {args.preset} (seq {args.max_seq_length}), fine-tuned on {args.train_reviews} "
        f"reviews ({args.finetune_length} tokens head+tail, {args.epochs:g} epochs), scored on {args.test_reviews} test reviews, "
        f"{len(seeds)} seeds; CPU: {cpu_name()}, {torch.get_num_threads()} threads",
        "",
        "| model | test accuracy (mean ± 1σ) | held-out MLM accuracy | pretraining steps | tokens/s |",
        "|---|---|---|---|---|",
    ]
    for key in sorted(rows):
        row = rows[key]
        mlm = f"{row['mlm_accuracy']:.3f}" if "mlm_accuracy" in row else ""
        steps = str(row.get("steps", ""))
        speed = f"{row['tokens_per_second']:,.0f}" if "tokens_per_second" in row else ""
        lines.append(f"| {row['name']} | {mean_std(row['accuracy'])} | {mlm} | {steps} | {speed} |")
    table = "\n".join(lines)
    print("\n" + table)
    summary = {k: {n: (str(v) if isinstance(v, Path) else v) for n, v in row.items()} for k, row in rows.items()}
    (out / "results.json").write_text(json.dumps({"args": vars(args), "rows": summary, "cpu": cpu_name()}, indent=2) + "\n")
    (out / "results.md").write_text(table + "\n")
    print(f"\n{math.ceil((time.perf_counter() - started) / 60)} minutes in all; results in {out}/results.md")


if __name__ == "__main__":
    main()
