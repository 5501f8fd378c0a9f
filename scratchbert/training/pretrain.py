"""Pretrain BERT from scratch: masked-language modelling, with next-sentence prediction in the paper's recipe.

One loop, the same on a laptop core or a cluster, written with Hugging Face Accelerate:

    scratchbert pretrain                                      # one process; no arguments: the demo
    accelerate launch -m scratchbert.training.pretrain ...    # as many processes as `accelerate config` says
    accelerate launch scripts/pretrain.py ...                 # the same, through the thin script

What happens, in order (each step is a function below):
  1. `PretrainConfig` (file + flags) -> an `Accelerator` (mixed precision, gradient accumulation).
  2. The tokenizer: loaded, or trained on the training text and saved into the run.
  3. Documents -> examples (`datasets`, under `main_process_first`); a held-out split. The
     recipe (config.RECIPES) decides what they are: contiguous text packed to full length
     (`packed`, the default) or NSP sentence pairs (`paper`).
  4. A `ScratchBertForMaskedLM` (or, with NSP, `ScratchBertForPreTraining`) of the preset's
     geometry, AdamW (no decay on biases and LayerNorm), linear warmup then linear decay,
     over steps or, with `--time-budget`, over elapsed training time.
  5. The loop: `accumulate` / `backward` / clip / step; logs, evaluation every N steps
     (`gather_for_metrics`), atomic checkpoints every N steps; `--resume` continues exactly.
  6. The end: `save_pretrained` of model and tokenizer (loadable with the Auto classes and
     `pipeline("fill-mask")`), a PNG of the curves, and fill-mask predictions.

Exact resumption needs every random draw to be reproducible from the checkpoint:
  - data order: Accelerate's seedable sampler (seed + epoch) and `skip_first_batches`;
  - dropout: torch's global RNG, saved per process by `save_state`, and used by nothing
    else (the DataLoaders get generators of their own);
  - MLM masks: drawn by the collator from a generator seeded by (seed, epoch, example
    indices) — not from the global stream, because the DataLoader prepares the next batch
    before the current step runs, which would interleave mask and dropout draws
    differently in a resumed run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed
from torch.utils.data import DataLoader, Dataset

from scratchbert.training import checkpoint as ckpt
from scratchbert.training.collator import IGNORE_INDEX
from scratchbert.training.config import DEFAULT_VOCAB_SIZE, PretrainConfig, add_config_arguments, config_from_args

LOG_FILE = "train_log.jsonl"
CURVES_FILE = "training_curves.png"
TOKENIZER_DIR = "tokenizer"
CONFIG_FILE = "pretrain_config.json"
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "labels", "next_sentence_label")
EVAL_MLM_PROBABILITY = 0.15  # held-out MLM accuracy is always measured at BERT's masking rate

# Shown after the demo run (no --train-files / --dataset): sentences in the style of the
# Python documentation the embedded corpus comes from, not copied from it.
DEMO_SENTENCES = (
    "the [MASK] statement is used to leave a loop early.",
    "a function is defined with the def [MASK].",
    "if the condition is true, the [MASK] block is executed.",
    "this method returns a new [MASK] object.",
)


class NonFiniteLossError(ValueError):
    """The loss became NaN or infinite: training stops and nothing new is saved."""


# ---------------------------------------------------------------------------------------------
# 1. The accelerator
# ---------------------------------------------------------------------------------------------
def _has_accelerator_device() -> bool:
    return torch.cuda.is_available() or (hasattr(torch, "accelerator") and torch.accelerator.is_available())


def build_accelerator(config: PretrainConfig) -> Accelerator:
    """An Accelerator for this run; on a machine without GPUs, several processes use gloo on CPU."""
    has_device = _has_accelerator_device()
    if config.mixed_precision == "fp16" and not has_device:
        raise ValueError("mixed_precision='fp16' needs a GPU; on CPU use --mixed-precision bf16 (or no).")
    trackers = _trackers(config.report_to)
    return Accelerator(
        # Without an accelerator device, `cpu=True` makes a multi-process launch (even
        # `--multi_gpu`) use gloo DDP on CPU instead of quietly running N copies alone.
        cpu=not has_device,
        mixed_precision=config.mixed_precision,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        log_with=trackers or None,
        project_config=ProjectConfiguration(project_dir=config.output_dir, logging_dir=str(Path(config.output_dir) / "logs")),
        # The seedable sampler shuffles with (data_seed + epoch), so the order of any epoch
        # can be replayed after a restart.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=config.seed),
        # We step the scheduler once per optimizer step ourselves; by default Accelerate
        # steps it once per process, for schedules written in single-process steps.
        step_scheduler_with_optimizer=False,
    )


def _trackers(report_to: str) -> list[str]:
    if report_to == "none":
        return []
    if report_to == "auto":
        from accelerate.utils import is_tensorboard_available

        return ["tensorboard"] if is_tensorboard_available() else []
    return [name.strip() for name in report_to.split(",") if name.strip()]


# ---------------------------------------------------------------------------------------------
# 2. The output directory and the tokenizer
# ---------------------------------------------------------------------------------------------
def check_output_dir(config: PretrainConfig) -> dict | None:
    """Decide between a fresh start and a resumption; return the checkpoint's state to resume from.

    Raises a ValueError when output_dir holds checkpoints and neither --resume nor
    --overwrite says what to do, or when the checkpoint belongs to a different run.
    """
    if Path(config.output_dir).exists() and not Path(config.output_dir).is_dir():
        raise ValueError(f"--output-dir {config.output_dir} is a file, not a directory: choose another path.")
    existing = ckpt.list_checkpoints(config.output_dir)
    if not existing:
        return None
    latest = existing[-1][1]
    if config.overwrite:
        return None
    if not config.resume:
        raise ValueError(
            f"{config.output_dir} already holds a run (checkpoints up to {latest.name}). Pass --resume to continue "
            "it, --overwrite to start over (its checkpoints are deleted), or choose another --output-dir."
        )
    state = ckpt.check_compatible(latest, config.to_dict())
    state["path"] = str(latest)
    return state


def load_or_train_tokenizer(config: PretrainConfig, accelerator: Accelerator, resuming: bool, texts):
    """The run's tokenizer, saved in output_dir/tokenizer so a resumed run uses the same one.

    Order of preference: the run's own copy when resuming; `--tokenizer` (a saved
    directory or a vocab.txt); otherwise a WordPiece vocabulary trained on `texts()`
    (by the main process; the others load what it saved).
    """
    from transformers import AutoTokenizer

    from scratchbert.tokenization import tokenizer_from_vocab, train_tokenizer

    own_copy = Path(config.output_dir) / TOKENIZER_DIR
    with accelerator.main_process_first():
        if resuming and own_copy.is_dir():
            return AutoTokenizer.from_pretrained(own_copy)
        if not accelerator.is_main_process:
            return AutoTokenizer.from_pretrained(own_copy)
        if config.tokenizer:
            source = Path(config.tokenizer)
            if source.is_dir():
                tokenizer = AutoTokenizer.from_pretrained(source)
            elif source.is_file():
                tokenizer = tokenizer_from_vocab(source, lowercase=config.lowercase, model_max_length=config.max_position_embeddings)
            else:
                raise FileNotFoundError(f"--tokenizer {source}: no such directory or vocab.txt file.")
        else:
            tokenizer = train_tokenizer(
                texts(),
                vocab_size=config.vocab_size or DEFAULT_VOCAB_SIZE,
                lowercase=config.lowercase,
                model_max_length=config.max_position_embeddings,
                show_progress=False,
            )
        tokenizer.save_pretrained(own_copy)
        return tokenizer


def check_vocabulary(tokenizer, model_config) -> None:
    """The tokenizer's ids must index the model's embedding table one to one."""
    if len(tokenizer) != model_config.vocab_size:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {model_config.vocab_size}: "
            "ids would index the wrong (or no) embedding rows. Use the tokenizer the model was built for, or "
            "set --vocab-size to the tokenizer's size (or leave it out)."
        )
    if tokenizer.pad_token_id != model_config.pad_token_id:
        raise ValueError(
            f"the tokenizer's [PAD] id is {tokenizer.pad_token_id} but the model's pad_token_id is {model_config.pad_token_id}."
        )


# ---------------------------------------------------------------------------------------------
# 3. Data
# ---------------------------------------------------------------------------------------------
def load_corpus(config: PretrainConfig) -> list[str]:
    """The run's documents: --train-files, --dataset, or the embedded default corpus."""
    from scratchbert.training import data

    if config.train_files:
        documents = data.load_documents(config.train_files)["text"]
    elif config.dataset:
        documents = data.load_documents(config.dataset, text_column=config.text_column)["text"]
    else:
        documents = data.default_corpus_documents()
    documents = [doc for doc in documents if doc.strip()]
    if not documents:
        raise ValueError("the training corpus holds no text: check --train-files / --dataset.")
    return documents


def split_documents(documents: list[str], eval_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Hold out whole documents (never halves of one) for evaluation, chosen by a seeded shuffle."""
    if len(documents) < 4:
        raise ValueError(
            f"the corpus has {len(documents)} document(s); NSP needs several documents for random "
            "'NotNext' partners and a held-out split needs at least 2 more. Add text or split it into documents "
            "(blank lines separate documents in text files)."
        )
    order = torch.randperm(len(documents), generator=torch.Generator().manual_seed(seed)).tolist()
    n_eval = max(2, round(eval_fraction * len(documents)))
    held_out = sorted(order[:n_eval])
    kept = sorted(order[n_eval:])
    return [documents[i] for i in kept], [documents[i] for i in held_out]


def build_datasets(config: PretrainConfig, tokenizer, train_docs: list[str], eval_docs: list[str]):
    """Example datasets for training and evaluation (`datasets.Dataset`s), as `config.packing` says.

    full-sentences: the documents' text packed into examples of exactly max_seq_length
    tokens (`build_packed_dataset`); dynamic masking makes each epoch new.
    sentence-pairs: the documents are tokenized once and paired `dupe_factor` times with
    different seeds (as BERT's create_pretraining_data.py does): each copy cuts the
    documents into other A/B segments and draws other NotNext partners, so a small corpus
    offers more distinct sentence pairs than one pass over it would. Without NSP every B
    is the text that follows A.
    """
    import datasets

    from scratchbert.training.data import build_packed_dataset, build_pretraining_dataset, tokenize_documents

    def examples(tokenized, seed: int):
        if config.packing == "full-sentences":
            return build_packed_dataset(tokenized, tokenizer, max_seq_length=config.max_seq_length)
        pairing = {"max_seq_length": config.max_seq_length, "short_seq_prob": config.short_seq_prob}
        return build_pretraining_dataset(tokenized, tokenizer, seed=seed, nsp_probability=0.5 if config.nsp else 0.0, **pairing)

    splits = []
    for name, docs, copies, seed in (
        ("training", train_docs, config.dupe_factor if config.packing == "sentence-pairs" else 1, config.seed),
        ("held-out", eval_docs, 1, config.seed + 10_000),  # a seed no training copy uses
    ):
        tokenized = tokenize_documents(docs, tokenizer)
        try:
            dataset = datasets.concatenate_datasets([examples(tokenized, seed + copy) for copy in range(copies)])
        except ValueError as err:
            raise ValueError(f"the {name} split ({len(docs)} documents): {err}") from None
        if len(dataset) == 0:
            raise ValueError(
                f"the {name} split produced no examples ({len(docs)} documents): the text is too short for "
                f"examples of up to {config.max_seq_length} tokens. Add text or lower --max-seq-length"
                + (" / raise --eval-fraction." if name == "held-out" else ".")
            )
        splits.append(dataset)
    train_dataset, eval_dataset = splits
    if config.max_eval_examples and len(eval_dataset) > config.max_eval_examples:
        # A spread-out, fixed subset, so evaluation costs the same at every step and on every run.
        step = len(eval_dataset) / config.max_eval_examples
        eval_dataset = eval_dataset.select([int(i * step) for i in range(config.max_eval_examples)])
    return train_dataset, eval_dataset


class IndexedDataset(Dataset):
    """Yields `(index, example)` so the collator can seed its masks from which examples it got."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return index, self.dataset[index]


class SeededCollator:
    """Runs the MLM collator with a generator seeded by (seed, epoch, example indices).

    The masks of a batch are then a pure function of what is in it, independent of how
    many batches the DataLoader prefetched, of the process count and of `num_workers`:
    a resumed run draws exactly the masks the uninterrupted run drew, and the global RNG
    is left to dropout alone. Set `epoch` before each epoch.
    """

    def __init__(self, collator, seed: int, epoch: int = 0, model_inputs=MODEL_INPUTS):
        self.collator = collator
        self.seed = seed
        self.epoch = epoch
        self.model_inputs = model_inputs

    def batch_seed(self, indices) -> int:
        key = f"{self.seed}:{self.epoch}:{','.join(map(str, indices))}".encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1

    def __call__(self, items):
        indices, examples = zip(*items)
        self.collator.generator = torch.Generator().manual_seed(self.batch_seed(indices))
        batch = self.collator(list(examples))
        return {name: batch[name] for name in self.model_inputs if name in batch}


def make_dataloaders(config: PretrainConfig, tokenizer, train_dataset, eval_dataset):
    from scratchbert.training.collator import DataCollatorForPretraining

    def collator(mlm_probability: float):
        return DataCollatorForPretraining(tokenizer, mlm_probability=mlm_probability, whole_word_mask=config.whole_word_mask)

    # Without NSP the model takes no next_sentence_label (sentence pairs still carry one).
    inputs = MODEL_INPUTS if config.nsp else tuple(name for name in MODEL_INPUTS if name != "next_sentence_label")
    train_collate = SeededCollator(collator(config.mlm_probability), config.seed, model_inputs=inputs)
    # Fixed masks at BERT's 15% whatever the training rate: every evaluation, and every
    # recipe, is scored on the same kind of task.
    eval_collate = SeededCollator(collator(EVAL_MLM_PROBABILITY), config.seed + 1, model_inputs=inputs)
    # Each DataLoader gets its own generator: starting an iteration draws a worker base seed
    # from it, and from torch's global RNG (dropout's stream) if it had none — which would
    # shift dropout in a resumed run, since it starts iterating at a different moment.
    train_loader = DataLoader(
        IndexedDataset(train_dataset),
        batch_size=config.batch_size,
        shuffle=True,
        collate_fn=train_collate,
        num_workers=config.num_workers,
        generator=torch.Generator().manual_seed(config.seed),
    )
    eval_loader = DataLoader(
        IndexedDataset(eval_dataset),
        batch_size=config.batch_size,
        collate_fn=eval_collate,
        num_workers=config.num_workers,
        generator=torch.Generator().manual_seed(config.seed + 1),
    )
    return train_loader, eval_loader, train_collate


# ---------------------------------------------------------------------------------------------
# 4. Model, optimizer, schedule
# ---------------------------------------------------------------------------------------------
def build_model(config: PretrainConfig, tokenizer, vocab_size: int, model_class=None, config_class=None):
    """A freshly initialised pretraining model of `vocab_size` tokens, checked against the tokenizer.

    With NSP: `ScratchBertForPreTraining` (pooler, MLM and NSP heads). Without: the MLM
    head alone, `ScratchBertForMaskedLM`, with no pooler, so nothing untrained is saved and
    a fine-tuned classifier starts its pooler fresh (as from transformers' `run_mlm.py`).
    """
    if model_class is None:
        from scratchbert import ScratchBertConfig, ScratchBertForMaskedLM, ScratchBertForPreTraining

        model_class, config_class = ScratchBertForPreTraining if config.nsp else ScratchBertForMaskedLM, ScratchBertConfig
    model_config = config_class(vocab_size=vocab_size, pad_token_id=tokenizer.pad_token_id, **config.model_kwargs())
    check_vocabulary(tokenizer, model_config)
    return model_class(model_config)


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: decay matrices, but not biases or LayerNorm weights (as in BERT).

    Decay pulls weights towards 0; for a bias or a LayerNorm gain that is a bias
    towards "no offset" / "scale 0", which only hurts.
    """
    no_decay = set()
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            if isinstance(module, torch.nn.LayerNorm) or name == "bias" or name.endswith("bias"):
                no_decay.add(id(parameter))
    decay = [p for p in model.parameters() if p.requires_grad and id(p) not in no_decay]
    keep = [p for p in model.parameters() if p.requires_grad and id(p) in no_decay]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


def warmup_then_linear_decay(max_steps: int, warmup_steps: int):
    """Learning-rate multiplier: 0 -> 1 over `warmup_steps`, then 1 -> 0 at `max_steps`."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (max_steps - step) / max(1, max_steps - warmup_steps))

    return factor


class TimeBudgetSchedule:
    """Learning-rate multiplier of a time-budgeted run: the same warmup and decay, on elapsed time.

    As in "How to Train BERT with an Academic Budget" (Izsak et al. 2021): the rate rises
    linearly over the first `warmup_ratio` of the budget and falls linearly to 0 at its
    end, so the run ends annealed whatever speed the machine has. The loop sets
    `elapsed` (seconds of training, the same on every process) before each scheduler step.
    """

    def __init__(self, budget_seconds: float, warmup_ratio: float):
        self.budget_seconds = budget_seconds
        self.warmup_ratio = warmup_ratio
        self.elapsed = 0.0

    def __call__(self, step: int) -> float:
        progress = min(self.elapsed / self.budget_seconds, 1.0)
        if progress < self.warmup_ratio:
            return max(progress / self.warmup_ratio, 1e-3)  # never exactly 0: the first step must move
        return max(0.0, (1.0 - progress) / max(1e-9, 1.0 - self.warmup_ratio))


class TrainingClock:
    """Seconds spent training, carried over when a run is resumed.

    Evaluation and checkpoint writing are left out (`pause` / `start` around them), so a
    budget buys the same amount of training whatever the bookkeeping costs. `timer` is
    injectable so tests can run a budget on a clock of their own.
    """

    def __init__(self, elapsed: float = 0.0, timer=time.perf_counter):
        self.timer = timer
        self._elapsed = elapsed
        self._since: float | None = None

    def start(self) -> None:
        if self._since is None:
            self._since = self.timer()

    def pause(self) -> None:
        if self._since is not None:
            self._elapsed += self.timer() - self._since
            self._since = None

    def seconds(self) -> float:
        return self._elapsed + (self.timer() - self._since if self._since is not None else 0.0)


# ---------------------------------------------------------------------------------------------
# 5. Evaluation
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model, eval_loader, accelerator: Accelerator) -> dict:
    """MLM loss / accuracy / perplexity, and NSP accuracy when the model has NSP, over the held-out split.

    Each process scores its shard; `gather_for_metrics` collects per-example counts from
    all processes and drops the examples Accelerate repeated to even out the shards.
    """
    model.eval()
    unwrapped = accelerator.unwrap_model(model)  # the encoder and heads by name (BERT's: .bert, .cls)
    totals = torch.zeros(5, dtype=torch.float64, device=accelerator.device)
    has_nsp = False
    for batch in eval_loader:
        labels = batch["labels"]
        has_nsp = "next_sentence_label" in batch
        inputs = {name: batch[name] for name in ("input_ids", "attention_mask", "token_type_ids")}
        with accelerator.autocast():
            encoded = unwrapped.bert(**inputs)
            masked = labels != IGNORE_INDEX  # (B, S)
            # The MLM head only where a label is: (N, V) scores instead of (B, S, V).
            logits = unwrapped.cls.predictions(encoded.last_hidden_state[masked]).float()  # (N, V)
            nsp_logits = unwrapped.cls.seq_relationship(encoded.pooler_output) if has_nsp else None  # (B, 2)
        row = torch.nonzero(masked)[:, 0]  # (N,) the example each scored token belongs to
        token_loss = F.cross_entropy(logits, labels[masked], reduction="none")  # (N,)
        hits = (logits.argmax(dim=-1) == labels[masked]).double()  # (N,)
        zeros = torch.zeros(labels.shape[0], dtype=torch.float64, device=labels.device)  # (B,)
        nsp_correct = (nsp_logits.argmax(dim=-1) == batch["next_sentence_label"]).double() if has_nsp else zeros
        per_example = torch.stack(
            [
                zeros.index_add(0, row, token_loss.double()),
                masked.sum(dim=1).double(),
                zeros.index_add(0, row, hits),
                nsp_correct,
                torch.ones_like(zeros),
            ],
            dim=1,
        )  # (B, 5)
        totals += accelerator.gather_for_metrics(per_example).sum(dim=0)
    model.train()
    loss_sum, n_masked, n_correct, nsp_correct, n_examples = totals.tolist()
    mlm_loss = loss_sum / max(n_masked, 1.0)
    metrics = {
        "mlm_loss": mlm_loss,
        "mlm_accuracy": n_correct / max(n_masked, 1.0),
        "perplexity": math.exp(min(mlm_loss, 50.0)),
        "eval_examples": int(n_examples),
        "eval_masked_tokens": int(n_masked),
    }
    if has_nsp:
        metrics["nsp_accuracy"] = nsp_correct / max(n_examples, 1.0)
    return metrics


# ---------------------------------------------------------------------------------------------
# 6. Logging
# ---------------------------------------------------------------------------------------------
class RunLog:
    """The always-on JSONL log (main process) plus Accelerate's trackers."""

    def __init__(self, accelerator: Accelerator, path: Path, resume_step: int | None):
        self.accelerator = accelerator
        self.path = path
        if accelerator.is_main_process:
            path.parent.mkdir(parents=True, exist_ok=True)
            if resume_step is None:
                path.write_text("", encoding="utf-8")
            elif path.exists():  # drop what the interrupted run logged after its last checkpoint
                kept = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
                kept = [line for line in kept if json.loads(line).get("step", 0) <= resume_step]
                path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def write(self, record: dict) -> None:
        if not self.accelerator.is_main_process:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        numbers = {f"{record['type']}/{k}": v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        self.accelerator.log(numbers, step=record.get("step"))


def weight_checksum(model: torch.nn.Module) -> float:
    """A number that differs when any weight differs (to confirm all processes agree)."""
    total = torch.zeros((), dtype=torch.float64)
    for index, parameter in enumerate(model.parameters()):
        total += (parameter.detach().double().cpu().flatten() * (1.0 + 1e-3 * index)).sum()
    return total.item()


# ---------------------------------------------------------------------------------------------
# 7. The loop
# ---------------------------------------------------------------------------------------------
@dataclass
class PretrainResult:
    output_dir: Path
    steps: int
    eval_metrics: dict
    seconds: float


def pretrain(config: PretrainConfig, model_class=None, config_class=None, timer=time.perf_counter) -> PretrainResult:
    """Run (or resume) pretraining as `config` says; see the module docstring.

    `timer` is the clock a `--time-budget` is measured on (tests pass one of their own).
    """
    started, cpu_started = time.perf_counter(), time.process_time()
    output_dir = Path(config.output_dir)
    accelerator = build_accelerator(config)
    resume_state = check_output_dir(config)
    set_seed(config.seed)  # weights and dropout; the data order and masks have seeds of their own
    if accelerator.is_main_process:
        if config.overwrite and (output_dir / ckpt.CHECKPOINTS).is_dir():
            import shutil

            shutil.rmtree(output_dir / ckpt.CHECKPOINTS)
        output_dir.mkdir(parents=True, exist_ok=True)
        config.save(output_dir / CONFIG_FILE)
    accelerator.wait_for_everyone()

    documents = load_corpus(config)
    train_docs, eval_docs = split_documents(documents, config.eval_fraction, config.seed)
    tokenizer = load_or_train_tokenizer(config, accelerator, resume_state is not None, lambda: train_docs)
    with accelerator.main_process_first():  # the main process builds (and caches) the datasets first
        train_dataset, eval_dataset = build_datasets(config, tokenizer, train_docs, eval_docs)
    train_loader, eval_loader, train_collate = make_dataloaders(config, tokenizer, train_dataset, eval_dataset)

    # The model's vocabulary: the checkpoint's when resuming, --vocab-size when given with
    # --tokenizer, else the tokenizer's own size (a trained one may come out smaller than asked).
    if resume_state is not None:
        vocab_size = resume_state["model_vocab_size"]
    elif config.tokenizer and config.vocab_size is not None:
        vocab_size = config.vocab_size
    else:
        vocab_size = len(tokenizer)
    model = build_model(config, tokenizer, vocab_size, model_class, config_class)
    optimizer = torch.optim.AdamW(
        parameter_groups(model, config.weight_decay),
        lr=config.learning_rate,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_epsilon,
    )
    if config.time_budget is not None:
        budget_schedule = TimeBudgetSchedule(60.0 * config.time_budget, config.warmup_ratio)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, budget_schedule)
    else:
        budget_schedule = None
        warmup_steps = max(1, round(config.warmup_ratio * config.max_steps))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_linear_decay(config.max_steps, warmup_steps))
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler
    )

    step, epoch, batches_in_epoch, tokens_seen, training_seconds = 0, 0, 0, 0, 0.0
    if config.resume and resume_state is None:
        accelerator.print(f"--resume: no checkpoint in {output_dir} yet, so training starts at step 0")
    if resume_state is not None:
        ckpt.load_checkpoint(accelerator, resume_state["path"])
        step, epoch = resume_state["step"], resume_state["epoch"]
        batches_in_epoch, tokens_seen = resume_state["batches_in_epoch"], resume_state.get("tokens_seen", 0)
        training_seconds = resume_state.get("training_seconds", 0.0)
        accelerator.print(f"resuming from {resume_state['path']} (step {step}, epoch {epoch})")
        saved_processes = resume_state.get("num_processes", accelerator.num_processes)
        if saved_processes != accelerator.num_processes:
            # Each process skips its own batches; keep the number of examples seen about the same.
            batches_in_epoch = batches_in_epoch * saved_processes // accelerator.num_processes
            accelerator.print(
                f"note: the checkpoint was written by {saved_processes} process(es), this run has "
                f"{accelerator.num_processes}: data shards differ, so the run continues but not bit-exactly."
            )
    accelerator.init_trackers("pretrain", config={k: str(v) if isinstance(v, list) else v for k, v in config.to_dict().items()})
    log = RunLog(accelerator, output_dir / LOG_FILE, step if resume_state is not None else None)
    log.write(
        {
            "type": "start", "step": step, "num_processes": accelerator.num_processes,
            "train_examples": len(train_dataset), "eval_examples": len(eval_dataset),
            "parameters": sum(p.numel() for p in model.parameters()), "vocab_size": len(tokenizer),
        }
    )  # fmt: skip
    examples_per_step = config.batch_size * config.gradient_accumulation_steps * accelerator.num_processes
    if config.time_budget is None:
        length = f"{config.max_steps} steps"
    else:
        length = f"{config.time_budget:g} minutes" + (f" (at most {config.max_steps} steps)" if config.max_steps else "")
    accelerator.print(
        f"pretraining a {config.preset} BERT (L={config.num_hidden_layers}, H={config.hidden_size}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, vocabulary {len(tokenizer)}) with the "
        f"{config.recipe} recipe ({'MLM + NSP' if config.nsp else 'MLM'} on {config.packing}, "
        f"{config.mlm_probability:.0%} masking, learning rate {config.learning_rate:g}) on {len(train_dataset)} examples "
        f"({len(eval_dataset)} held out), {accelerator.num_processes} process(es), "
        + f"{length} of {examples_per_step} examples"
    )

    clock = TrainingClock(training_seconds, timer)
    progress = _progress_bar(config, accelerator, step, training_seconds)
    window = {"loss": torch.zeros((), device=accelerator.device), "batches": 0, "tokens": 0, "start": time.perf_counter()}
    last_saved = resume_state["path"] if resume_state is not None else None
    eval_metrics: dict = {}
    model.train()

    def out_of_time() -> bool:
        return config.time_budget is not None and training_seconds >= 60.0 * config.time_budget

    def done() -> bool:
        return (config.max_steps is not None and step >= config.max_steps) or out_of_time()

    clock.start()
    try:
        while not done():
            train_collate.epoch = epoch
            train_loader.set_epoch(epoch)
            loader = accelerator.skip_first_batches(train_loader, batches_in_epoch) if batches_in_epoch else train_loader
            for batch in loader:
                batches_in_epoch += 1
                with accelerator.accumulate(model):
                    loss = model(**batch).loss
                    _stop_if_not_finite(accelerator, loss, step, last_saved, config)
                    accelerator.backward(loss)
                    if accelerator.sync_gradients and config.max_grad_norm > 0:
                        accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                    optimizer.step()
                    optimizer.zero_grad()
                window["loss"] += loss.detach().float()
                window["batches"] += 1
                window["tokens"] += batch["attention_mask"].sum()  # a tensor: no device sync per step
                if not accelerator.sync_gradients:
                    continue
                before = training_seconds
                training_seconds = _synchronized_seconds(accelerator, clock) if config.time_budget is not None else clock.seconds()
                if budget_schedule is not None:
                    budget_schedule.elapsed = training_seconds
                scheduler.step()
                step += 1
                progress.update(training_seconds - before if config.time_budget is not None else 1)
                if step % config.log_every == 0 or done():
                    record = _train_record(accelerator, window, step, epoch, scheduler)
                    tokens_seen += record.pop("tokens")
                    record.update(tokens_seen=tokens_seen, training_seconds=training_seconds)
                    log.write(record)
                    progress.set_postfix(step=step, loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_second']:.0f}")
                if config.eval_every and step % config.eval_every == 0 and not done():
                    clock.pause()
                    eval_metrics = evaluate(model, eval_loader, accelerator)
                    log.write({"type": "eval", "step": step, "training_seconds": training_seconds, **eval_metrics})
                    clock.start()
                    window["start"] = time.perf_counter()
                if config.save_every and step % config.save_every == 0:
                    clock.pause()
                    state = {"step": step, "epoch": epoch, "batches_in_epoch": batches_in_epoch,
                             "tokens_seen": tokens_seen, "training_seconds": training_seconds,
                             "num_processes": accelerator.num_processes, "model_vocab_size": vocab_size,
                             "config": config.to_dict()}  # fmt: skip
                    last_saved = str(save_checkpoint(accelerator, output_dir, step, state, config.keep_last))
                    clock.start()
                    window["start"] = time.perf_counter()  # throughput counts training time only
                if done():
                    break
            else:  # the epoch ran out before max_steps: start the next one
                epoch += 1
                batches_in_epoch = 0
    except KeyboardInterrupt:
        progress.close()
        where = f"the last checkpoint is {last_saved}; `--resume` continues from it" if last_saved else "no checkpoint was written yet"
        accelerator.print(f"interrupted at step {step}: {where}.")
        raise
    clock.pause()
    progress.close()
    if out_of_time():
        accelerator.print(f"the time budget of {config.time_budget:g} minutes is spent after {step} steps")

    eval_metrics = evaluate(model, eval_loader, accelerator)
    log.write({"type": "eval", "step": step, "training_seconds": training_seconds, **eval_metrics})
    checksums = accelerator.gather(torch.tensor([weight_checksum(model)], dtype=torch.float64, device=accelerator.device))
    save_final_model(accelerator, model, tokenizer, output_dir)
    log.write(
        {
            "type": "final", "step": step, "epoch": epoch, "tokens_seen": tokens_seen, "training_seconds": training_seconds,
            "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
            "weight_checksums": checksums.tolist(), **eval_metrics,
        }
    )  # fmt: skip
    if accelerator.is_main_process:
        from scratchbert.training.plotting import plot_training_curves, read_log

        plot_training_curves(read_log(output_dir / LOG_FILE), output_dir / CURVES_FILE, title=f"{config.preset} BERT")
    nsp = f", NSP accuracy {eval_metrics['nsp_accuracy']:.3f}" if "nsp_accuracy" in eval_metrics else ""
    accelerator.print(
        f"done in {time.perf_counter() - started:.0f}s ({training_seconds:.0f}s of training): held-out MLM accuracy "
        f"{eval_metrics['mlm_accuracy']:.3f} (perplexity {eval_metrics['perplexity']:.1f}){nsp}; "
        f"model and tokenizer saved in {output_dir}"
    )
    accelerator.wait_for_everyone()
    accelerator.end_training()  # closes the trackers (and, when distributed, the process group)
    return PretrainResult(output_dir, step, eval_metrics, time.perf_counter() - started)


def save_checkpoint(accelerator, output_dir, step, state, keep_last):
    """Indirection point of the loop's checkpoint writes (see `checkpoint.save_checkpoint`)."""
    return ckpt.save_checkpoint(accelerator, output_dir, step, state, keep_last)


def _progress_bar(config: PretrainConfig, accelerator: Accelerator, step: int, training_seconds: float):
    """Steps out of max_steps; with a time budget, seconds of training out of the budget."""
    from tqdm.auto import tqdm

    timed = config.time_budget is not None
    return tqdm(
        total=60.0 * config.time_budget if timed else config.max_steps,
        initial=training_seconds if timed else step,
        desc="pretrain",
        unit="s" if timed else "step",
        bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}s [{elapsed}<{remaining}{postfix}]" if timed else None,
        disable=not (accelerator.is_local_main_process and config.progress_bar),
        dynamic_ncols=True,
    )


def _synchronized_seconds(accelerator: Accelerator, clock: TrainingClock) -> float:
    """The training time of the slowest process: every process then agrees on the learning rate and on when to stop."""
    seconds = torch.tensor([clock.seconds()], dtype=torch.float64, device=accelerator.device)
    return accelerator.reduce(seconds, reduction="max").item() if accelerator.num_processes > 1 else seconds.item()


def _train_record(accelerator: Accelerator, window: dict, step: int, epoch: int, scheduler) -> dict:
    """Mean training loss over the logging window on all processes, and throughput."""
    mean_loss = accelerator.reduce(window["loss"] / max(window["batches"], 1), reduction="mean").item()
    local_tokens = torch.as_tensor(window["tokens"], device=accelerator.device)
    tokens = int(accelerator.reduce(local_tokens, reduction="sum").item())
    seconds = time.perf_counter() - window["start"]
    window.update(loss=torch.zeros_like(window["loss"]), batches=0, tokens=0, start=time.perf_counter())
    return {
        "type": "train", "step": step, "epoch": epoch, "loss": mean_loss,
        "learning_rate": scheduler.get_last_lr()[0], "tokens": tokens, "tokens_per_second": tokens / max(seconds, 1e-9),
    }  # fmt: skip


def _stop_if_not_finite(accelerator: Accelerator, loss: torch.Tensor, step: int, last_saved, config) -> None:
    """Stop before a NaN/inf loss reaches the weights; every process agrees through the reduce."""
    worst = accelerator.reduce(loss.detach().float().reshape(1), reduction="sum")
    if torch.isfinite(worst).all():
        return
    kept = (
        f"the last good checkpoint is {last_saved} (resume from it with --resume"
        if last_saved
        else "no checkpoint had been written yet (start again"
    )
    raise NonFiniteLossError(
        f"the training loss became {loss.item()} at step {step + 1}; training stopped and nothing was saved "
        f"after it. {kept} after lowering --learning-rate (now {config.learning_rate:g})"
        + (", or using --mixed-precision bf16 instead of fp16" if config.mixed_precision == "fp16" else "")
        + ")."
    )


def save_final_model(accelerator: Accelerator, model, tokenizer, output_dir: Path) -> None:
    """`save_pretrained` of model (safetensors + config.json) and tokenizer into `output_dir`."""
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    unwrapped.save_pretrained(
        output_dir,
        is_main_process=accelerator.is_main_process,
        save_function=accelerator.save,
        state_dict=accelerator.get_state_dict(model),
    )
    if accelerator.is_main_process:
        tokenizer.save_pretrained(output_dir)
    accelerator.wait_for_everyone()


# ---------------------------------------------------------------------------------------------
# 8. Showing what the model learned
# ---------------------------------------------------------------------------------------------
def fill_mask_predictions(model_dir: str | Path, sentences, top_k: int = 5) -> list[tuple[str, list[tuple[str, float]]]]:
    """Top-k fill-mask predictions of the saved model, loaded back through `pipeline("fill-mask")`."""
    from transformers import pipeline
    from transformers.utils import logging as transformers_logging

    import scratchbert  # noqa: F401  (registers the model type with the Auto classes)

    # The fill-mask model is the MLM head alone, so the pooler and NSP weights of the saved
    # pretraining model are (rightly) unused; silence the load report that lists them.
    verbosity, bars = transformers_logging.get_verbosity(), transformers_logging.is_progress_bar_enabled()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    try:
        fill = pipeline("fill-mask", model=str(model_dir), tokenizer=str(model_dir), device="cpu")
    finally:
        transformers_logging.set_verbosity(verbosity)
        if bars:
            transformers_logging.enable_progress_bar()
    mask = fill.tokenizer.mask_token
    results = []
    for sentence in sentences:
        predictions = fill(sentence.replace("[MASK]", mask), top_k=top_k)
        results.append((sentence, [(p["token_str"], p["score"]) for p in predictions]))
    return results


def print_fill_mask(model_dir: str | Path, sentences) -> None:
    print("\nwhat the model fills in (top 5, loaded back with pipeline('fill-mask')):")
    for sentence, predictions in fill_mask_predictions(model_dir, sentences):
        guesses = ", ".join(f"{token} ({score:.2f})" for token, score in predictions)
        print(f"  {sentence}\n      -> {guesses}")


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def _add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument(
        "--fill-mask",
        nargs="*",
        metavar="SENTENCE",
        default=None,
        help="sentences with [MASK] to complete at the end (default: Python-docs examples for the embedded corpus)",
    )


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    result = pretrain(config)
    sentences = args.fill_mask
    if sentences is None:
        sentences = DEMO_SENTENCES if not (config.train_files or config.dataset) else ()
    if sentences and _is_main_process():
        print_fill_mask(result.output_dir, sentences)
    return 0


def _is_main_process() -> bool:
    from accelerate import PartialState

    return PartialState().is_main_process


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser(
        "pretrain",
        help="pretrain BERT from scratch (recipe packed: MLM on packed text; paper: MLM + NSP); with no arguments, a tiny model on the embedded corpus",
        description=__doc__.split("\n\n")[0],
    )
    _add_arguments(parser)
    parser.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `accelerate launch -m scratchbert.training.pretrain` and scripts/pretrain.py."""
    from scratchbert.cli import CommandError

    parser = argparse.ArgumentParser(prog="scratchbert.training.pretrain", description=__doc__.split("\n\n")[0])
    _add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (CommandError, ValueError, FileNotFoundError) as err:
        print(f"pretrain: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
