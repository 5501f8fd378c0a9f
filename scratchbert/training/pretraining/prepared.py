"""Prepared data: a run's examples built ahead, in a folder of their own, read by `pretrain --prepared-data`.

`scratchbert pretrain` already caches its examples beside the corpus in datasets' cache, so a
second run on the same machine does not tokenize again. `scratchbert prepare-data` does the
same work on purpose and writes it where you say: build the examples once (on a machine with
many cores, say), copy the folder, and start any number of runs from it.

    prepared/
      prepared.json    the options that shaped the examples, the corpus they came from, the counts
      tokenizer/       the tokenizer they were made with (the runs use it)
      train/           the training examples      (datasets.Dataset.save_to_disk: Arrow, memory-mapped
      held-out/        the held-out examples        when read back, so a run's memory does not grow with them)

The folder is written under a temporary name and renamed when complete. A run reads the
options from `prepared.json` (the command line applies them as a layer under `--config` and
the flags); a run whose data options differ from them is refused with the differences named.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets

from scratchbert.errors import ScratchBertError
from scratchbert.tokenization import load_tokenizer
from scratchbert.training.pretraining.config import PretrainConfig

PREPARED_FILE = "prepared.json"

SPLITS = {"train": "train", "held-out": "held-out"}

# What the examples are, which a run on them must agree with: the model's heads and inputs depend on it.
DATA_OPTIONS = ("packing", "nsp", "max_seq_length")

# How they were made (recorded; a run on them may use another seed for its weights, order and masks).
MADE_WITH = ("recipe", "short_seq_prob", "dupe_factor", "eval_fraction", "max_eval_examples", "seed", "lowercase", "vocab_size", "tokenizer")

# The options of `scratchbert prepare-data`: what shapes the examples, where they come from and go (not the model's).
PREPARE_OPTIONS = frozenset(
    DATA_OPTIONS + MADE_WITH + ("train_files", "dataset", "text_column", "num_proc", "output_dir", "overwrite", "progress_bar")
)


def prepared_options(config: PretrainConfig) -> dict:
    return {name: getattr(config, name) for name in DATA_OPTIONS}


def save_prepared(folder: str | Path, config: PretrainConfig, tokenizer, train_dataset: datasets.Dataset, eval_dataset: datasets.Dataset) -> Path:
    """Write the examples, the tokenizer and `prepared.json` to `folder`, atomically (a temporary folder renamed)."""
    folder = Path(folder)
    tmp = folder.with_name(f".tmp-{folder.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    train_dataset.save_to_disk(str(tmp / SPLITS["train"]))
    eval_dataset.save_to_disk(str(tmp / SPLITS["held-out"]))
    tokenizer.save_pretrained(tmp / "tokenizer")
    manifest = {
        "options": {"recipe": config.recipe, **prepared_options(config)},  # `pretrain --prepared-data` takes these as defaults
        "made_with": {name: getattr(config, name) for name in MADE_WITH},
        "corpus": {"train_files": config.train_files, "dataset": config.dataset, "text_column": config.text_column},
        "train_examples": len(train_dataset),
        "held_out_examples": len(eval_dataset),
        "vocab_size": len(tokenizer),
    }
    (tmp / PREPARED_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder


def read_manifest(folder: str | Path) -> dict:
    """`prepared.json` of a prepared-data folder, with clear errors for a missing or damaged one."""
    folder = Path(folder)
    path = folder / PREPARED_FILE
    if not folder.is_dir():
        raise ScratchBertError(f"--prepared-data {folder} does not exist: build it with `scratchbert prepare-data --output-dir {folder} ...`.")
    if not path.is_file():
        raise ScratchBertError(f"{folder} is not a prepared-data folder (no {PREPARED_FILE}); build one with `scratchbert prepare-data`.")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ScratchBertError(f"{path} is damaged ({err}); build the folder again with `scratchbert prepare-data`.") from None
    return manifest


def check_options(folder: str | Path, config: PretrainConfig) -> dict:
    """The folder's manifest, if this run's data options are the ones its examples were made with."""
    manifest = read_manifest(folder)
    ours = prepared_options(config)
    prepared = {name: manifest["options"].get(name) for name in DATA_OPTIONS}
    differences = [f"{name}: prepared {value!r}, this run {ours[name]!r}" for name, value in prepared.items() if ours[name] != value]
    if differences:
        raise ScratchBertError(
            f"the examples in {folder} were prepared with other options:\n  " + "\n  ".join(differences)
            + f"\nLeave these options out (the command line takes them from {Path(folder) / PREPARED_FILE}) or prepare the data again."
        )
    if config.tokenizer or config.train_files or config.dataset:
        raise ScratchBertError(
            "--prepared-data brings its own corpus and tokenizer: leave out --train-files, --dataset and --tokenizer."
        )
    return manifest


def load_prepared(folder: str | Path, config: PretrainConfig):
    """(tokenizer, training examples, held-out examples) of a prepared folder, the examples memory-mapped."""
    folder = Path(folder)
    check_options(folder, config)
    try:
        splits = [datasets.load_from_disk(str(folder / name)) for name in SPLITS.values()]
    except (FileNotFoundError, ValueError) as err:
        raise ScratchBertError(f"{folder} is incomplete or damaged ({err}); build it again with `scratchbert prepare-data`.") from None
    return load_tokenizer(folder / "tokenizer", max_length=config.max_position_embeddings), *splits


def prepare_data(config: PretrainConfig) -> Path:
    """`scratchbert prepare-data`: the run's tokenizer and examples, built as `pretrain` would and saved to `config.output_dir`."""
    from accelerate import Accelerator

    from scratchbert.training.pretraining.corpus import build_data
    from scratchbert.training.run_setup import check_output_folder, progress_bars

    if config.streaming:
        raise ScratchBertError("prepare-data keeps the examples it builds; --streaming keeps none. Leave out one of them.")
    if config.long_phase:
        raise ScratchBertError("prepare-data does not keep --long-phase examples (a run on prepared data has no long phase): leave it out.")
    folder = check_output_folder(config.output_dir, config.overwrite)
    accelerator = Accelerator(cpu=True)
    with progress_bars(config.progress_bar and accelerator.is_local_main_process):  # one bar per machine
        tokenizer, train_dataset, eval_dataset, _ = build_data(config, accelerator)
        if accelerator.is_main_process:
            save_prepared(folder, config, tokenizer, train_dataset, eval_dataset)
    accelerator.wait_for_everyone()
    return folder


__all__ = ["DATA_OPTIONS", "PREPARED_FILE", "PREPARE_OPTIONS", "check_options", "load_prepared", "prepare_data", "prepared_options", "read_manifest", "save_prepared"]
