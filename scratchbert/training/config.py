"""The one configuration object of a pretraining run.

`PretrainConfig` is a dataclass: every knob of `scratchbert pretrain` is a field with a
default and a one-line help text. A run is configured in three layers, each overriding
the one before:

    dataclass defaults  <  a YAML or JSON file (`--config run.yaml`)  <  command-line flags

and the model's geometry comes from a named preset unless a field sets it explicitly. The
training recipe (`RECIPES`: what the examples look like, the masking rate, dropout, the
learning rate) comes the same way from a named recipe: `packed` by default, `paper` for
the BERT paper's; any of its options given in the file or as a flag wins.
The presets are the sizes of the BERT miniatures Google released with the paper's
follow-up ("Well-Read Students Learn Better", Turc et al. 2019) plus BERT-base:

    preset   layers L  hidden H  heads H/64  intermediate 4H
    tiny          2       128        2            512
    mini          4       256        4           1024
    small         4       512        8           2048
    medium        8       512        8           2048
    base         12       768       12           3072

The defaults (tiny, the packed recipe, 4000 steps of 32 examples of 64 tokens) are the
no-argument demo: about 3 minutes on 2 CPU cores. `--time-budget MINUTES` trains for a length
of time instead of a number of steps, with the learning-rate schedule on elapsed time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from scratchbert.training.data import check_max_seq_length

# (num_hidden_layers, hidden_size); heads and feed-forward width follow BERT's ratios.
PRESETS: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
}
HEAD_DIM = 64  # every released BERT uses 64-dimensional attention heads
MIXED_PRECISION_CHOICES = ("no", "bf16", "fp16")
DEFAULT_VOCAB_SIZE = 4096  # plenty for the embedded corpus (~65k words); BERT's English vocabularies have ~30k
PACKINGS = ("full-sentences", "sentence-pairs")
POSITION_INITS = ("normal", "sinusoidal")

# The training recipes: every option a recipe decides, and its value. A field left at None
# takes the recipe's value; a value given in a file or a flag wins over the recipe.
# Why the default is "packed" and what was measured: docs/pretraining.md.
RECIPES: dict[str, dict] = {
    # What a small budget learns fastest from (RoBERTa's FULL-SENTENCES inputs without NSP,
    # Liu et al. 2019; a higher masking rate, Wettig et al. 2023; no dropout and a learning
    # rate decaying to zero, Geiping & Goldstein 2022 "Cramming" and Izsak et al. 2021 "How
    # to Train BERT with an Academic Budget"). The peak rate is the highest measured to leave
    # the unigram plateau at once on post-LN `mini`: 1e-3 and 2e-3 sat on it for minutes.
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
# Where a preset measured a better peak learning rate than its recipe's (docs/pretraining.md):
# `tiny` (L2/H128) on the embedded corpus, 2,000 steps: held-out MLM accuracy 0.297 at 2e-3
# against 0.182 at the recipe's 5e-4; `mini` sat on the unigram plateau at 1e-3 and 2e-3.
PRESET_LEARNING_RATES: dict[tuple[str, str], float] = {("packed", "tiny"): 2e-3}
# Without --time-budget. The demo's length: `tiny` on the embedded corpus reaches held-out MLM
# accuracy 0.40-0.41 in 4,000 steps (3 minutes on 2 cores) against 0.315 in 2,000 (docs/pretraining.md).
DEFAULT_MAX_STEPS = 4000


def preset_geometry(name: str) -> dict[str, int]:
    """The model sizes of a preset: `{"num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size"}`."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}.")
    layers, hidden = PRESETS[name]
    return {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": hidden // HEAD_DIM,
        "intermediate_size": 4 * hidden,
    }


class ConfigFile:
    """What every run configuration (a dataclass) can do with files: save, load, layer.

    Subclasses are dataclasses whose fields carry `metadata={"help": ...}` (and optionally
    "choices", "flag", "positional"); `add_config_arguments` turns those into flags.
    `JOB` names the job in messages ("pretraining", "fine-tuning").
    """

    JOB = "run"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        """Write the resolved configuration as JSON (it reloads with `from_file`)."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def upgrade(cls, values: dict) -> dict:
        """Saved values in today's terms (a hook for renamed or added options)."""
        return values

    @classmethod
    def from_dict(cls, values: dict):
        values = cls.upgrade(values)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown {cls.JOB} option(s): {', '.join(unknown)}. Known options: {', '.join(sorted(known))}.")
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | Path, **overrides):
        """Load a YAML (.yaml/.yml) or JSON (.json) file; `overrides` win over its values."""
        return cls.from_dict({**read_config_file(path), **overrides})


@dataclass
class PretrainConfig(ConfigFile):
    """Everything a pretraining run needs; see the module docstring for how it is layered."""

    JOB = "pretraining"

    # --- model geometry (None: taken from the preset) ---
    preset: str = field(default="tiny", metadata={"help": f"model size: {', '.join(PRESETS)}", "choices": PRESETS})
    num_hidden_layers: int | None = field(default=None, metadata={"help": "encoder layers L (default: from the preset)"})
    hidden_size: int | None = field(default=None, metadata={"help": "hidden width H (default: from the preset)"})
    num_attention_heads: int | None = field(default=None, metadata={"help": "attention heads (default: H/64)"})
    intermediate_size: int | None = field(default=None, metadata={"help": "feed-forward width (default: 4H)"})
    max_position_embeddings: int = field(default=512, metadata={"help": "rows of the position table"})
    hidden_dropout_prob: float | None = field(default=None, metadata={"help": "dropout on hidden states (default: from the recipe)"})
    attention_probs_dropout_prob: float | None = field(
        default=None, metadata={"help": "dropout on attention weights (default: from the recipe)"}
    )
    # Measured on `mini` (docs/pretraining.md): sinusoids leave the bag-of-words plateau of
    # masked-LM accuracy ~1,800 steps sooner, yet the 15-minute model fine-tuned 4-5 points worse.
    position_init: str = field(
        default="normal",
        metadata={
            "choices": POSITION_INITS,
            "help": "starting values of the learned position table: normal (BERT's N(0, initializer_range)) or sinusoidal "
            "(Vaswani et al.'s sines and cosines at the same scale, still learned: faster masked-LM accuracy, but a "
            "classifier fine-tuned after 15 minutes measured worse; see docs/pretraining.md)",
        },
    )
    finetune_dropout: float = field(
        default=0.1,
        metadata={
            "help": "both dropouts written into the saved model's config.json, i.e. what fine-tuning it uses (BERT's 0.1; "
            "the packed recipe pretrains without dropout, and a classifier fine-tuned without it measured 2-3 points worse)"
        },
    )

    # --- recipe ---
    recipe: str = field(
        default=DEFAULT_RECIPE,
        metadata={
            "choices": RECIPES,
            "help": "packed (default, the best measured on a small budget: MLM only on contiguous text packed to "
            "full length, 30%% masking, no dropout, peak learning rate 5e-4) or paper (BERT's: MLM + NSP on "
            "sentence pairs, 15%% masking, dropout 0.1, learning rate 1e-4); see docs/pretraining.md"
        },
    )
    nsp: bool | None = field(default=None, metadata={"help": "train next-sentence prediction (needs --packing sentence-pairs; default: from the recipe)"})
    packing: str | None = field(
        default=None,
        metadata={"choices": PACKINGS, "help": "full-sentences (contiguous text, one segment, no padding) or sentence-pairs ([CLS] A [SEP] B [SEP]); default: from the recipe"},
    )

    # --- tokenizer ---
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "a saved tokenizer directory or a vocab.txt; default: train one on the training text"},
    )
    vocab_size: int | None = field(
        default=None,
        metadata={"help": f"vocabulary size: of the tokenizer trained for this run (default {DEFAULT_VOCAB_SIZE}); with --tokenizer it must match"},
    )
    lowercase: bool = field(default=True, metadata={"help": "lowercase text (for a tokenizer trained for this run)"})

    # --- data ---
    train_files: list[str] = field(
        default_factory=list,
        metadata={"help": "text files or globs (documents separated by blank lines); default: the embedded corpus"},
    )
    dataset: str | None = field(default=None, metadata={"help": "a `datasets` dataset (local directory or hub name)"})
    text_column: str = field(default="text", metadata={"help": "text column of --dataset"})
    max_seq_length: int = field(default=64, metadata={"help": "tokens per example, special tokens included"})
    short_seq_prob: float = field(default=0.1, metadata={"help": "sentence-pairs: probability of a shorter random target length"})
    dupe_factor: int = field(default=5, metadata={"help": "sentence-pairs: pairings of the training text, each with another seed (BERT used 10)"})
    mlm_probability: float | None = field(default=None, metadata={"help": "fraction of tokens chosen for masking (default: from the recipe)"})
    whole_word_mask: bool = field(default=False, metadata={"help": "mask all ## pieces of a word together"})
    eval_fraction: float = field(default=0.1, metadata={"help": "fraction of documents held out for evaluation"})
    max_eval_examples: int = field(default=1000, metadata={"help": "cap on held-out sentence pairs scored per evaluation (0: all)"})
    num_workers: int = field(default=0, metadata={"help": "DataLoader worker processes"})

    # --- optimisation ---
    max_steps: int | None = field(
        default=None, metadata={"help": f"optimizer steps to train for (default: {DEFAULT_MAX_STEPS}; with --time-budget: no limit)"}
    )
    time_budget: float | None = field(
        default=None,
        metadata={"help": "minutes of training: the learning-rate schedule runs on elapsed training time and the run stops (and saves) at the budget"},
    )
    batch_size: int = field(default=32, metadata={"help": "examples per device per forward pass"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "forward passes per optimizer step"})
    learning_rate: float | None = field(default=None, metadata={"help": "peak learning rate of AdamW (default: from the recipe, or PRESET_LEARNING_RATES: packed + tiny 2e-3)"})
    warmup_ratio: float | None = field(
        default=None, metadata={"help": "fraction of the steps (or of the time budget) spent warming up linearly (default: from the recipe)"}
    )
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay (never on biases or LayerNorm)"})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1"})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2"})
    adam_epsilon: float = field(default=1e-6, metadata={"help": "AdamW epsilon"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm (0 disables)"})
    mixed_precision: str = field(
        default="no", metadata={"help": "no, bf16 (CPU or GPU) or fp16 (GPU only)", "choices": MIXED_PRECISION_CHOICES}
    )
    seed: int = field(default=42, metadata={"help": "seed of weights, data order, masks and dropout"})

    # --- bookkeeping ---
    output_dir: str | None = field(default=None, metadata={"help": "where everything is written (default: runs/<preset>)"})
    eval_every: int = field(default=100, metadata={"help": "evaluate every N optimizer steps (0: only at the end)"})
    save_every: int = field(default=200, metadata={"help": "checkpoint every N optimizer steps (0: never)"})
    keep_last: int = field(default=2, metadata={"help": "checkpoints to keep"})
    log_every: int = field(default=10, metadata={"help": "log training metrics every N optimizer steps"})
    resume: bool = field(default=False, metadata={"help": "continue from the latest checkpoint in output_dir"})
    overwrite: bool = field(default=False, metadata={"help": "start over even if output_dir holds checkpoints"})
    report_to: str = field(default="auto", metadata={"help": "trackers: auto (TensorBoard when installed), none, or names"})
    progress_bar: bool = field(default=True, metadata={"help": "show a tqdm bar on the main process"})

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe={self.recipe!r}: choose one of {', '.join(RECIPES)}.")
        if self.learning_rate is None:
            self.learning_rate = PRESET_LEARNING_RATES.get((self.recipe, self.preset))
        for name, value in RECIPES[self.recipe].items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if self.max_steps is None and self.time_budget is None:
            self.max_steps = DEFAULT_MAX_STEPS
        geometry = preset_geometry(self.preset)
        hidden = self.hidden_size or geometry["hidden_size"]
        defaults = {
            "num_hidden_layers": geometry["num_hidden_layers"],
            "hidden_size": hidden,
            "num_attention_heads": max(1, hidden // HEAD_DIM),
            "intermediate_size": 4 * hidden,
        }
        for name, value in defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if self.output_dir is None:
            self.output_dir = str(Path("runs") / self.preset)
        if isinstance(self.train_files, str):
            self.train_files = [self.train_files]
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError naming the bad value and the fix."""
        positive = (
            "num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "max_position_embeddings",
            "max_seq_length", "dupe_factor", "batch_size", "gradient_accumulation_steps", "keep_last", "log_every",
        ) + (("max_steps",) if self.max_steps is not None else ())  # fmt: skip
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}={value!r}: it must be a positive integer.")
        if self.vocab_size is not None and (not isinstance(self.vocab_size, int) or self.vocab_size <= 5):
            raise ValueError(f"vocab_size={self.vocab_size!r}: it must be an integer above 5 (the special tokens).")
        for name in ("eval_every", "save_every", "num_workers", "max_eval_examples"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: it must be 0 or more.")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}; "
                "pick a head count that divides the hidden size."
            )
        if self.max_seq_length > self.max_position_embeddings:
            raise ValueError(
                f"max_seq_length={self.max_seq_length} is longer than max_position_embeddings="
                f"{self.max_position_embeddings}: the model has no position embedding beyond that. "
                "Lower --max-seq-length or raise --max-position-embeddings."
            )
        check_max_seq_length(self.max_seq_length)
        if self.time_budget is not None and (
            isinstance(self.time_budget, bool) or not isinstance(self.time_budget, (int, float)) or not 0 < self.time_budget < float("inf")
        ):
            raise ValueError(f"time_budget={self.time_budget!r}: it must be a positive number of minutes (e.g. --time-budget 60).")
        if self.position_init not in POSITION_INITS:
            raise ValueError(f"position_init={self.position_init!r}: choose one of {', '.join(POSITION_INITS)}.")
        if self.packing not in PACKINGS:
            raise ValueError(f"packing={self.packing!r}: choose one of {', '.join(PACKINGS)}.")
        if self.nsp and self.packing == "full-sentences":
            raise ValueError(
                "--nsp with --packing full-sentences makes no sense: packed examples are one stretch of text with no "
                "second segment whose order could be predicted. Use --packing sentence-pairs for NSP, or --no-nsp."
            )
        for name in ("mlm_probability", "eval_fraction"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"{name}={getattr(self, name)!r}: it must be strictly between 0 and 1.")
        for name in ("short_seq_prob", "warmup_ratio", "hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name}={getattr(self, name)!r}: it must be in [0, 1).")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate={self.learning_rate!r}: it must be positive.")
        if self.max_grad_norm < 0 or self.weight_decay < 0:
            raise ValueError("max_grad_norm and weight_decay must be 0 or more.")
        if self.mixed_precision not in MIXED_PRECISION_CHOICES:
            raise ValueError(f"mixed_precision={self.mixed_precision!r}: choose one of {', '.join(MIXED_PRECISION_CHOICES)}.")
        if self.train_files and self.dataset:
            raise ValueError("give either --train-files or --dataset, not both.")
        if self.resume and self.overwrite:
            raise ValueError("--resume and --overwrite contradict each other: pick one.")

    # --- geometry shared with the model config ---
    def saved_model_kwargs(self) -> dict:
        """`model_kwargs` as the finished model is saved: with the fine-tuning dropout."""
        return {**self.model_kwargs(), "hidden_dropout_prob": self.finetune_dropout, "attention_probs_dropout_prob": self.finetune_dropout}

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

    @classmethod
    def upgrade(cls, values: dict) -> dict:
        return upgrade_saved_config(values)


# A resolved configuration saved before recipes existed described MLM + NSP on sentence
# pairs, with neither a time budget nor a choice. A resolved save holds every option; these
# are the ones added since, so a mapping that lacks only (some of) them is such a save. A
# partial mapping (flags, a hand-written file) is in today's terms: `--mlm-probability 0.4`
# alone keeps the default recipe. Runs saved before `position_init` existed started from
# BERT's normal position table.
_BEFORE_RECIPES = {"recipe": "paper", "nsp": True, "packing": "sentence-pairs", "time_budget": None}
_ADDED_SINCE_RECIPES = {"recipe", "nsp", "packing", "time_budget", "finetune_dropout", "adam_beta1", "adam_beta2", "position_init"}


def upgrade_saved_config(values: dict) -> dict:
    """A saved configuration in today's terms: one written before recipes gets the paper recipe's
    structure, one written before `position_init` the normal table (what each trained), so their
    runs load, compare and resume as they were."""
    every_option = {f.name for f in dataclasses.fields(PretrainConfig)}
    if not every_option - _ADDED_SINCE_RECIPES <= set(values):
        return values  # a partial mapping (flags, a hand-written file): today's terms already
    if "recipe" not in values:
        values = {**_BEFORE_RECIPES, **values}
    return {"position_init": "normal", **values}


def read_config_file(path: str | Path) -> dict:
    """The mapping stored in a YAML or JSON configuration file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"configuration file {path} does not exist.")
    text = path.read_text(encoding="utf-8")
    try:
        values = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"could not parse {path}: {err}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a mapping of option names to values, not a {type(values).__name__}.")
    return {key.replace("-", "_"): value for key, value in values.items()}


# --- command line -------------------------------------------------------------------


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_config_arguments(parser: argparse.ArgumentParser, config_class: type = None) -> None:
    """One flag per field of `config_class` (`PretrainConfig` by default), plus `--config FILE`.

    A field's metadata gives its help text, and optionally "choices", "flag" (its flag name
    when it is not the field's) and "positional". Flags default to `argparse.SUPPRESS`, so
    the parsed namespace holds only what the user typed; `config_from_args` layers those
    over the file and the dataclass defaults.
    """
    config_class = config_class or PretrainConfig
    parser.add_argument("--config", metavar="FILE", help="YAML or JSON file of options (flags override it)")
    hints = typing.get_type_hints(config_class)
    for f in dataclasses.fields(config_class):
        kind, meta = hints[f.name], f.metadata
        help_text = meta.get("help", "")
        if f.default not in (dataclasses.MISSING, None) and "default" not in help_text:
            help_text += f" (default: {f.default})"
        names = [f.name] if meta.get("positional") else [meta.get("flag", _flag(f.name))]
        options: dict = {"default": argparse.SUPPRESS, "help": help_text, "dest": f.name}
        if meta.get("positional"):
            options.pop("dest")
            options["nargs"] = "?"
        args = typing.get_args(kind)
        if kind is bool or (typing.get_origin(kind) is not list and set(args) == {bool, type(None)}):
            parser.add_argument(*names, action=argparse.BooleanOptionalAction, **options)
        elif typing.get_origin(kind) is list or list in {typing.get_origin(a) for a in args}:
            parser.add_argument(*names, nargs="+", metavar=meta.get("metavar", "PATH"), **options)
        else:
            base = next((a for a in args if a is not type(None)), kind) if args else kind
            if "choices" in meta:
                options["choices"] = list(meta["choices"])
            elif not meta.get("positional"):
                options["metavar"] = meta.get("metavar", {int: "N", float: "X"}.get(base, "VALUE"))
            parser.add_argument(*names, type=base, **options)


def config_from_args(args: argparse.Namespace, config_class: type = None):
    """Build the configuration: dataclass defaults < `--config` file < flags typed by the user."""
    config_class = config_class or PretrainConfig
    names = {f.name for f in dataclasses.fields(config_class)}
    typed = {name: value for name, value in vars(args).items() if name in names}
    values = read_config_file(args.config) if getattr(args, "config", None) else {}
    return config_class.from_dict({**values, **typed})
