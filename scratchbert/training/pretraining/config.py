"""The one configuration object of a pretraining run.

`PretrainConfig` is a dataclass: every knob of `scratchbert pretrain` is a field with a
default and a one-line help text, declared in three groups as transformers' example scripts
group theirs (`ModelOptions`, `DataOptions`, `TrainingOptions`: named apart from transformers'
`TrainingArguments`, which is Trainer's; the command line stays flat and `--help` shows the
groups). A value comes from the first of these that sets it (`resolve`; `scratchbert pretrain
--print-config` prints each option's value and source):

    flag  >  file (--config run.yaml)  >  recipe  >  preset  >  default

The recipe (`RECIPES`: what the examples look like, the masking rate, dropout, the learning
rate; `packed` by default, `paper` for the BERT paper's) and the preset (the model's size)
fill only the options left unset. The presets are the sizes of the BERT miniatures Google
released with the paper's follow-up ("Well-Read Students Learn Better", Turc et al. 2019) plus
BERT-base:

    preset   layers L  hidden H  heads H/64  intermediate 4H
    tiny          2       128        2            512
    mini          4       256        4           1024
    small         4       512        8           2048
    medium        8       512        8           2048
    base         12       768       12           3072

The model's geometry is checked by `ScratchBertConfig`, the model's own configuration. The
defaults (tiny, the packed recipe, 4000 steps of 32 examples of 64 tokens) are the
no-argument demo (docs/pretraining.md). `--time-budget MINUTES` trains for a length of time
instead of a number of steps, with the learning-rate schedule on elapsed time.

Saved configurations carry `config_version` (`PretrainConfig.VERSION`). An option a save lacks
reads as its default (`upgrade_saved_config`); the one exception is a save from before
`config_version`, which trained the paper's recipe. A save newer than this package, or one that
uses an option since removed, is refused with the fix.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from scratchbert.configuration_scratchbert import ScratchBertConfig
from scratchbert.errors import ScratchBertError
from scratchbert.modeling_scratchbert import ScratchBertForMaskedLM, ScratchBertForPreTraining
from scratchbert.training.run_setup import ConfigFile
from scratchbert.training.pretraining.examples import check_max_seq_length

# (num_hidden_layers, hidden_size); heads and feed-forward width follow BERT's ratios.
PRESETS: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
}

HEAD_DIM = 64  # every released BERT uses 64-dimensional attention heads

MIXED_PRECISION_CHOICES = ("no", "bf16", "fp16", "auto")

DEFAULT_VOCAB_SIZE = 4096  # the embedded corpus has ~65k words; BERT's English vocabularies have ~30k

PACKINGS = ("full-sentences", "sentence-pairs")

DOCS = "docs/pretraining.md"  # what was measured, and why the defaults are what they are

# The training recipes: every option a recipe decides, and its value. A field left at None
# takes the recipe's value; a value given in a file or a flag wins over the recipe.
RECIPES: dict[str, dict] = {
    # What a small budget learns fastest from (RoBERTa's FULL-SENTENCES inputs without NSP,
    # Liu et al. 2019; a higher masking rate, Wettig et al. 2023; no dropout and a learning
    # rate decaying to zero, Geiping & Goldstein 2022 "Cramming" and Izsak et al. 2021 "How
    # to Train BERT with an Academic Budget"). How the peak rate was chosen: DOCS.
    "packed": {
        "nsp": False,
        "packing": "full-sentences",
        "mlm_probability": 0.3,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "learning_rate": 5e-4,
        "warmup_ratio": 0.06,
    },
    # The BERT paper (Devlin et al. 2019): MLM + NSP on sentence pairs, 15% masking,
    # dropout 0.1, peak learning rate 1e-4 after 1% warmup, linear decay.
    "paper": {
        "nsp": True,
        "packing": "sentence-pairs",
        "mlm_probability": 0.15,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "learning_rate": 1e-4,
        "warmup_ratio": 0.01,
    },
}

DEFAULT_RECIPE = "packed"

# A recipe's peak learning rate for one preset, where that preset measured better with another (DOCS).
PRESET_LEARNING_RATES: dict[tuple[str, str], float] = {("packed", "tiny"): 2e-3}

DEFAULT_MAX_STEPS = 4000  # without --time-budget: the demo's length (DOCS)


def preset_geometry(name: str) -> dict[str, int]:
    """The model sizes of a preset: `{"num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size"}`."""
    if name not in PRESETS:
        raise ScratchBertError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}.")
    layers, hidden = PRESETS[name]
    return {"num_hidden_layers": layers, "hidden_size": hidden, **_derived_sizes(hidden)}


def _derived_sizes(hidden: int) -> dict[str, int]:
    """BERT's ratios: 64-dimensional heads, a feed-forward layer 4 times as wide."""
    return {"num_attention_heads": max(1, hidden // HEAD_DIM), "intermediate_size": 4 * hidden}


def recipe_values(recipe: str, preset: str) -> dict:
    """The options `recipe` decides, for a model of size `preset`."""
    if recipe not in RECIPES:
        raise ScratchBertError(f"recipe={recipe!r}: choose one of {', '.join(RECIPES)}.")
    values = dict(RECIPES[recipe])
    if (recipe, preset) in PRESET_LEARNING_RATES:
        values["learning_rate"] = PRESET_LEARNING_RATES[(recipe, preset)]
    return values


def _resumable(help_text: str, **metadata) -> dict:
    """Field metadata of an option that may change when a run is resumed (bookkeeping, not the weights' path)."""
    return {"help": help_text, "resumable": True, **metadata}


@dataclass
class ModelOptions:
    """model: size, initialisation, tokenizer"""

    preset: str = field(default="tiny", metadata={"help": f"model size: {', '.join(PRESETS)}", "choices": PRESETS})
    num_hidden_layers: int | None = field(default=None, metadata={"help": "encoder layers L (default: from the preset)"})
    hidden_size: int | None = field(default=None, metadata={"help": "hidden width H (default: from the preset)"})
    num_attention_heads: int | None = field(default=None, metadata={"help": "attention heads (default: H/64)"})
    intermediate_size: int | None = field(default=None, metadata={"help": "feed-forward width (default: 4H)"})
    max_position_embeddings: int = field(default=512, metadata={"help": "rows of the position table"})
    hidden_dropout_prob: float | None = field(default=None, metadata={"file_only": True, "help": "dropout on hidden states during pretraining (default: from the recipe)"})
    attention_probs_dropout_prob: float | None = field(
        default=None, metadata={"file_only": True, "help": "dropout on attention weights during pretraining (default: from the recipe)"}
    )
    finetune_dropout: float = field(
        default=0.1,
        metadata=_resumable(
            "both dropouts written into the saved model's config.json, i.e. what fine-tuning it uses (BERT's 0.1, "
            f"whatever the pretraining dropout; see {DOCS})",
            file_only=True,
        ),
    )
    tokenizer: str | None = field(
        default=None, metadata=_resumable("a saved tokenizer directory, a vocab.txt or a Hugging Face Hub name; default: train one on the training text")
    )
    vocab_size: int | None = field(
        default=None,
        metadata=_resumable(f"vocabulary size: of the tokenizer trained for this run (default {DEFAULT_VOCAB_SIZE}); with --tokenizer it must match"),
    )
    lowercase: bool = field(default=True, metadata=_resumable("lowercase text (for a tokenizer trained for this run)"))


@dataclass
class DataOptions:
    """data: the corpus and the examples made from it"""

    train_files: list[str] = field(
        default_factory=list,
        metadata={"help": "text files or globs (documents separated by blank lines); default: the embedded corpus"},
    )
    dataset: str | None = field(default=None, metadata={"help": "a `datasets` dataset (local directory or hub name)"})
    text_column: str = field(default="text", metadata={"help": "text column of --dataset"})
    packing: str | None = field(
        default=None,
        metadata={"choices": PACKINGS, "help": "full-sentences (contiguous text, one segment, no padding) or sentence-pairs ([CLS] A [SEP] B [SEP]); default: from the recipe"},
    )
    max_seq_length: int = field(default=64, metadata={"help": "tokens per example, special tokens included"})
    long_phase: float = field(
        default=0.0,
        metadata={
            "help": "the last fraction of the run (of its steps, or of its time budget) trained on examples of the "
            "long-phase length, so that the position table's rows beyond max_seq_length are trained for fine-tuning on "
            "longer inputs (BERT: 0.1 at 512); 0: off"
        },
    )
    long_seq_length: int | None = field(
        default=None,
        metadata={"help": "tokens per example in the --long-phase (default: max_position_embeddings)"},
    )
    short_seq_prob: float = field(default=0.1, metadata={"help": "sentence-pairs: probability of a shorter random target length"})
    dupe_factor: int = field(default=5, metadata={"help": "sentence-pairs: pairings of the training text, each with another seed (BERT used 10)"})
    mlm_probability: float | None = field(default=None, metadata={"help": "fraction of tokens chosen for masking (default: from the recipe)"})
    whole_word_mask: bool = field(default=False, metadata={"help": "mask all ## pieces of a word together"})
    mask_replace_prob: float = field(
        default=0.8, metadata={"help": "of the chosen tokens, the share shown as [MASK] (BERT's 80/10/10: 0.8; 1.0 with --random-replace-prob 0: always [MASK])"}
    )
    random_replace_prob: float = field(
        default=0.1, metadata={"help": "of the chosen tokens, the share shown as a random token (BERT: 0.1); the rest show their own token"}
    )
    eval_fraction: float = field(default=0.1, metadata={"help": "fraction of documents held out for evaluation"})
    max_eval_examples: int = field(default=1000, metadata=_resumable("cap on held-out examples scored per evaluation (0: all)"))
    num_workers: int = field(default=0, metadata=_resumable("DataLoader worker processes (not with --streaming, which reads in the training process)"))
    prepared_data: str | None = field(
        default=None,
        metadata={"help": "a folder written by `scratchbert prepare-data`: its examples and tokenizer, and its data options as defaults"},
    )
    streaming: bool = field(
        default=False,
        metadata={
            "help": "read, tokenize and pack the corpus while training (datasets' IterableDataset): the first step comes at "
            "once and nothing is cached on disk; needs --max-steps or --time-budget; resumes exactly"
        },
    )
    num_proc: int | None = field(
        default=None,
        metadata=_resumable(
            "processes that split, tokenize and pack the corpus (default: the CPU cores this process may use); "
            "the examples are the same for any number"
        ),
    )


@dataclass
class TrainingOptions:
    """training: recipe, optimisation, bookkeeping"""

    recipe: str = field(
        default=DEFAULT_RECIPE,
        metadata={
            "choices": RECIPES,
            "help": "packed (default: MLM only on contiguous text packed to full length, 30%% masking, no dropout, peak "
            "learning rate 5e-4) or paper (BERT's: MLM + NSP on sentence pairs, 15%% masking, dropout 0.1, learning "
            f"rate 1e-4); why the default is packed: {DOCS}",
        },
    )
    nsp: bool | None = field(default=None, metadata={"help": "train next-sentence prediction (needs --packing sentence-pairs; default: from the recipe)"})
    max_steps: int | None = field(
        default=None,
        metadata=_resumable(f"optimizer steps to train for (default: {DEFAULT_MAX_STEPS}; under a time budget: no limit)"),
    )
    time_budget: float | None = field(
        default=None,
        metadata={"help": "minutes of training: the learning-rate schedule runs on elapsed training time and the run stops (and saves) at the budget"},
    )
    # Resumable: a run may continue on another number of processes with the same examples per
    # optimizer step (processes x batch x accumulation), which pretrain.check_same_global_batch checks.
    batch_size: int = field(default=32, metadata=_resumable("examples per process per forward pass"))
    gradient_accumulation_steps: int = field(default=1, metadata=_resumable("forward passes per optimizer step"))
    learning_rate: float | None = field(
        default=None, metadata={"help": "peak learning rate of AdamW (default: from the recipe, for some presets its PRESET_LEARNING_RATES)"}
    )
    warmup_ratio: float | None = field(
        default=None, metadata={"help": "fraction of the steps (or of the time budget) spent warming up linearly (default: from the recipe)"}
    )
    weight_decay: float = field(default=0.01, metadata={"file_only": True, "help": "AdamW weight decay (never on biases or LayerNorm)"})
    adam_beta1: float = field(default=0.9, metadata={"file_only": True, "help": "AdamW beta1"})
    adam_beta2: float = field(default=0.999, metadata={"file_only": True, "help": "AdamW beta2"})
    adam_epsilon: float = field(default=1e-6, metadata={"file_only": True, "help": "AdamW epsilon"})
    max_grad_norm: float = field(default=1.0, metadata={"file_only": True, "help": "gradient clipping norm (0 disables)"})
    mixed_precision: str | None = field(
        default=None,
        metadata={
            "help": "no, bf16 (CPU or GPU), fp16 (GPU only), or auto: on a CPU the faster of fp32 and bf16 in a timed "
            "trial of this model and batch, on a GPU bf16 where it has it (default: auto with --time-budget, else no)",
            "choices": MIXED_PRECISION_CHOICES,
        },
    )
    seed: int = field(default=42, metadata={"help": "seed of weights, data order, masks and dropout"})
    output_dir: str | None = field(default=None, metadata=_resumable("where everything is written (default: runs/<preset>)"))
    eval_every: int = field(default=100, metadata=_resumable("evaluate every N optimizer steps (0: only at the end)"))
    save_every: int = field(default=200, metadata=_resumable("checkpoint every N optimizer steps (0: never)"))
    keep_last: int = field(default=2, metadata=_resumable("checkpoints to keep"))
    ddp_timeout: float = field(
        default=1800,  # torch's gloo default, and transformers' TrainingArguments.ddp_timeout
        metadata=_resumable(
            "seconds a collective waits for the other processes; past it the run stops, naming the process that is gone",
            file_only=True,
        ),
    )
    log_every: int = field(default=10, metadata=_resumable("log training metrics every N optimizer steps"))
    resume: bool = field(default=False, metadata=_resumable("continue from the latest checkpoint in output_dir"))
    overwrite: bool = field(default=False, metadata=_resumable("start over even if output_dir holds checkpoints"))
    report_to: str = field(default="auto", metadata=_resumable("trackers: auto (TensorBoard when installed), none, or names"))
    progress_bar: bool = field(default=True, metadata=_resumable("show a tqdm bar on the main process"))


@dataclass
class PretrainConfig(TrainingOptions, DataOptions, ModelOptions, ConfigFile):
    """Everything a pretraining run needs; see the module docstring for how it is layered."""

    JOB = "pretraining"
    VERSION = 9  # 1: saves without `config_version`; 9: options measured not to help removed (REMOVED_OPTIONS)

    def __post_init__(self) -> None:
        for name, (_, value) in self.unset_values().items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if isinstance(self.train_files, str):
            self.train_files = [self.train_files]
        self.validate()

    def unset_values(self) -> dict[str, tuple[str, object]]:
        """For each option that defaults to None, the layer that fills it when it is unset and its value there."""
        hidden = self.hidden_size or preset_geometry(self.preset)["hidden_size"]
        layers = {
            "default": {
                "max_steps": DEFAULT_MAX_STEPS if self.time_budget is None else None,
                # under a time budget a faster step is more steps; otherwise fp32, the same on every machine
                "mixed_precision": "no" if self.time_budget is None else "auto",
                "num_proc": available_cores(),
                "output_dir": str(Path("runs") / self.preset),
            },
            "preset": {**preset_geometry(self.preset), "hidden_size": hidden, **_derived_sizes(hidden)},
            "recipe": recipe_values(self.recipe, self.preset),
        }
        return {name: (source, value) for source, values in layers.items() for name, value in values.items()}

    def default_layers(self) -> dict[str, str]:
        return {name: source for name, (source, _) in self.unset_values().items()}

    def validate(self) -> None:
        """Raise a ScratchBertError naming the bad value and the fix (the model's geometry: `ScratchBertConfig`'s)."""
        positive = ("max_seq_length", "dupe_factor", "batch_size", "gradient_accumulation_steps", "keep_last", "log_every", "num_proc")
        for name in positive + (("max_steps",) if self.max_steps is not None else ()):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ScratchBertError(f"{name}={value!r}: it must be a positive integer.")
        if self.vocab_size is not None and (not isinstance(self.vocab_size, int) or self.vocab_size <= 5):
            raise ScratchBertError(f"vocab_size={self.vocab_size!r}: it must be an integer above 5 (the special tokens).")
        for name in ("eval_every", "save_every", "num_workers", "max_eval_examples"):
            if getattr(self, name) < 0:
                raise ScratchBertError(f"{name}={getattr(self, name)!r}: it must be 0 or more.")
        if self.max_seq_length > self.max_position_embeddings:
            raise ScratchBertError(
                f"max_seq_length={self.max_seq_length} is longer than max_position_embeddings="
                f"{self.max_position_embeddings}: the model has no position embedding beyond that. "
                "Lower --max-seq-length or raise --max-position-embeddings."
            )
        self._validate_long_phase()
        if self.time_budget is not None and (
            isinstance(self.time_budget, bool) or not isinstance(self.time_budget, (int, float)) or not 0 < self.time_budget < float("inf")
        ):
            raise ScratchBertError(f"time_budget={self.time_budget!r}: it must be a positive number of minutes (e.g. --time-budget 60).")
        for name, choices in (("packing", PACKINGS), ("mixed_precision", MIXED_PRECISION_CHOICES)):
            if getattr(self, name) not in choices:
                raise ScratchBertError(f"{name}={getattr(self, name)!r}: choose one of {', '.join(choices)}.")
        if self.nsp and self.packing == "full-sentences":
            raise ScratchBertError(
                "--nsp with --packing full-sentences makes no sense: packed examples are one stretch of text with no "
                "second segment whose order could be predicted. Use --packing sentence-pairs for NSP, or --no-nsp."
            )
        for name in ("mlm_probability", "eval_fraction"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ScratchBertError(f"{name}={getattr(self, name)!r}: it must be strictly between 0 and 1.")
        if not (0.0 <= self.mask_replace_prob and 0.0 <= self.random_replace_prob and self.mask_replace_prob + self.random_replace_prob <= 1.0):
            raise ScratchBertError(
                f"mask_replace_prob={self.mask_replace_prob!r} and random_replace_prob={self.random_replace_prob!r}: each "
                "must be 0 or more and together at most 1 (BERT: 0.8 and 0.1; the rest keep their token)."
            )
        for name in ("short_seq_prob", "warmup_ratio"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ScratchBertError(f"{name}={getattr(self, name)!r}: it must be in [0, 1).")
        if self.learning_rate <= 0:
            raise ScratchBertError(f"learning_rate={self.learning_rate!r}: it must be positive.")
        if self.max_grad_norm < 0 or self.weight_decay < 0:
            raise ScratchBertError("max_grad_norm and weight_decay must be 0 or more.")
        if self.train_files and self.dataset:
            raise ScratchBertError("give either --train-files or --dataset, not both.")
        if self.resume and self.overwrite:
            raise ScratchBertError("--resume and --overwrite contradict each other: pick one.")
        for kwargs in (self.model_kwargs(), self.saved_model_kwargs()):  # the model's geometry, as its config checks it
            ScratchBertConfig(**kwargs).validate_sizes()
        check_max_seq_length(self.max_seq_length)  # the examples' own bound (examples.py)

    def _validate_long_phase(self) -> None:
        if not 0.0 <= self.long_phase < 1.0:
            raise ScratchBertError(f"long_phase={self.long_phase!r}: it must be in [0, 1) (a fraction of the run; 0 turns it off).")
        if not self.long_phase:
            return
        long = self.long_seq_length or self.max_position_embeddings
        if not self.max_seq_length < long <= self.max_position_embeddings:
            raise ScratchBertError(
                f"long_seq_length={long}: it must be longer than max_seq_length={self.max_seq_length} and at most "
                f"max_position_embeddings={self.max_position_embeddings}. Set --long-seq-length in that range."
            )
        if self.streaming or self.prepared_data:
            raise ScratchBertError("--long-phase builds a second set of examples from the corpus: not with --streaming or --prepared-data.")

    # --- geometry shared with the model config ---
    def new_model(self, vocab_size: int, pad_token_id: int = 0, **model_options):
        """A freshly initialised model for this run, of `vocab_size` tokens: the MLM head alone, or with NSP (`nsp`).

        Its `ScratchBertConfig` is this run's geometry (`model_kwargs`) with `model_options` (the loop's
        `sparse_prediction=True`)."""
        model_config = ScratchBertConfig(vocab_size=vocab_size, pad_token_id=pad_token_id, **self.model_kwargs(), **model_options)
        return (ScratchBertForPreTraining if self.nsp else ScratchBertForMaskedLM)(model_config)

    def model_kwargs(self) -> dict:
        """The `ScratchBertConfig` fields this run decides (vocab_size comes from the tokenizer)."""
        return {
            "num_hidden_layers": self.num_hidden_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_dropout_prob": self.hidden_dropout_prob,
            "attention_probs_dropout_prob": self.attention_probs_dropout_prob,
        }

    def saved_model_kwargs(self) -> dict:
        """`model_kwargs` as the finished model is saved: with the fine-tuning dropout."""
        return {**self.model_kwargs(), "hidden_dropout_prob": self.finetune_dropout, "attention_probs_dropout_prob": self.finetune_dropout}

    @classmethod
    def upgrade(cls, values: dict) -> dict:
        return upgrade_saved_config(values)


# A save without `config_version` (version 1) held every option but these, and trained the
# paper's recipe (MLM + NSP on sentence pairs); the others it lacks read as their defaults.
_NOT_IN_VERSION_1 = frozenset({
    "recipe", "nsp", "packing", "time_budget", "finetune_dropout", "adam_beta1", "adam_beta2", "num_proc", "streaming",
    "prepared_data", "long_phase", "long_seq_length", "mask_replace_prob", "random_replace_prob", "ddp_timeout",
})  # fmt: skip

VERSION_1_RECIPE = "paper"

# Options measured not to help and removed (docs/experiments.md), with the value that meant "off"
# (ANY: every value trained the same model). A save that used one is refused; one that left it off loads.
ANY = object()

REMOVED_OPTIONS = {
    "objective": "mlm", "generator_layers": None, "discriminator_weight": ANY, "position_init": "normal",
    "mlm_probability_end": None, "long_batch_size": None, "long_learning_rate": None,
}  # fmt: skip

REMOVED_AT = "9a075dd"  # the last commit that has them


def resumable_options() -> frozenset[str]:
    """Options that may change when a run is resumed: they affect bookkeeping, not the sequence of weights.

    (The tokenizer of a resumed run is the one saved in output_dir, so its options no longer matter.)
    """
    return frozenset(f.name for f in dataclasses.fields(PretrainConfig) if f.metadata.get("resumable"))


def upgrade_saved_config(values: dict) -> dict:
    """A saved or hand-written configuration in today's terms (without its `config_version`).

    An option it lacks takes its default, as for any configuration. A complete save without a
    version (every option but `_NOT_IN_VERSION_1`: a run from before `config_version`) trained
    the paper's recipe and is read so; a partial mapping without one (flags, a hand-written
    file) is in today's terms already. Refused: a save newer than this package, and one that
    used a removed option (`REMOVED_OPTIONS`).
    """
    values = dict(values)
    version = values.pop("config_version", None)
    if version is not None and version > PretrainConfig.VERSION:
        raise ScratchBertError(
            f"this configuration was saved by a newer scratchbert (config_version {version}, this one reads up to "
            f"{PretrainConfig.VERSION}): upgrade scratchbert."
        )
    for name, off in REMOVED_OPTIONS.items():
        value = values.pop(name, off)
        if off is not ANY and value != off:
            raise ScratchBertError(
                f"{name}={value!r} was removed from scratchbert (measured not to help: docs/experiments.md); drop it to "
                f"train without it, or continue this run with the commit that has it (git checkout {REMOVED_AT})."
            )
    always_saved = {f.name for f in dataclasses.fields(PretrainConfig)} - _NOT_IN_VERSION_1
    if version is None and always_saved <= set(values):
        values.setdefault("recipe", VERSION_1_RECIPE)
    return values


def available_cores() -> int:
    """The CPU cores this process may run on: its affinity mask, which containers and `taskset` narrow."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity masks
        return os.cpu_count() or 1


def check_vocabulary(tokenizer, vocab_size: int) -> None:
    """The tokenizer's ids must index the model's embedding table one to one."""
    if len(tokenizer) != vocab_size:
        raise ScratchBertError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab_size}: "
            "ids would index the wrong (or no) embedding rows. Use the tokenizer the model was built for, or "
            "set --vocab-size to the tokenizer's size (or leave it out)."
        )
