"""A pretraining run's inputs: corpus -> held-out split -> tokenizer -> examples (masking.py makes the batches).

Everything here only reads: the corpus (`--train-files`, `--dataset`, or the embedded
default), the tokenizer (the run's own copy when resuming, `--tokenizer`, or one trained on
the training split) and the example datasets are built and checked before the run's output
folder is touched, so a bad input never damages a finished run.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Sequence
from pathlib import Path

import datasets
import torch
from accelerate import Accelerator
from datasets.arrow_dataset import Column

from scratchbert import ingestion
from scratchbert.errors import ScratchBertError
from scratchbert.tokenization import load_tokenizer, train_tokenizer
from scratchbert.training.pretraining import streaming
from scratchbert.training.pretraining.config import DEFAULT_VOCAB_SIZE, PretrainConfig
from scratchbert.training.pretraining.examples import build_examples, tokenize_documents

TOKENIZER_DIR = "tokenizer"  # the run's own tokenizer, in its output folder


def load_corpus(config: PretrainConfig) -> Sequence[str] | datasets.IterableDataset:
    """The run's documents: --train-files, --dataset, or the embedded default corpus.

    Files and datasets stay where `ingestion.load_documents` puts them, in datasets' Arrow
    cache (memory-mapped, keyed by the files' paths, sizes and modification times): the
    documents are its "text" column, read lazily, never a list in memory. The examples built
    from them are cached beside it (`build_datasets`), so a second run on the same corpus
    reuses them. The embedded corpus is a list of strings. With --streaming: an `IterableDataset`
    that reads the documents as training goes (`streaming.py`), blank ones left out.
    """
    if config.streaming:
        source = config.train_files or config.dataset or datasets.Dataset.from_dict({"text": ingestion.default_corpus_documents()})
        documents = ingestion.load_documents(source, text_column=config.text_column, streaming=True)
        return documents.filter(lambda example: bool(example["text"] and example["text"].strip()))
    if config.train_files or config.dataset:
        dataset = ingestion.load_documents(config.train_files or config.dataset, text_column=config.text_column)
        plain_text = config.train_files and {ingestion.format_of(f) for f in ingestion.expand_files(config.train_files)} == {"text"}
        documents = (dataset if plain_text else _with_text(dataset))["text"]  # text files' documents are never blank
    else:
        documents = list(filter(str.strip, ingestion.default_corpus_documents()))
    if not len(documents):
        raise ScratchBertError("the training corpus holds no text: check --train-files / --dataset.")
    return documents


def _with_text(dataset: datasets.Dataset) -> datasets.Dataset:
    """The rows whose text is more than whitespace (a table may hold blank ones), found by Arrow compute."""
    import pyarrow.compute as pc

    keep, offset = [], 0
    for batch in dataset.with_format("arrow").iter(batch_size=100_000):
        has_text = pc.fill_null(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(batch["text"])), 0), False)
        keep.extend((pc.indices_nonzero(has_text).to_numpy() + offset).tolist())
        offset += len(batch)
    return dataset if len(keep) == len(dataset) else dataset.select(keep)


def split_documents(documents: Sequence[str], eval_fraction: float, seed: int) -> tuple[Sequence[str], Sequence[str]]:
    """Hold out whole documents (never halves of one) for evaluation, chosen by a seeded shuffle.

    The documents of an Arrow-backed corpus (`load_corpus`) stay in the Arrow cache: each
    split is an index over it, so its examples are cached and reused like the corpus.
    """
    if len(documents) < 4:
        raise ScratchBertError(
            f"the corpus has {len(documents)} document(s) and pretraining needs at least 4: 2 held out to "
            "evaluate on, the rest to train on (and with NSP to draw 'NotNext' partners from). Add text or split "
            "it into documents (blank lines separate documents in text files; each row of a table is one)."
        )
    order = torch.randperm(len(documents), generator=torch.Generator().manual_seed(seed)).tolist()
    n_eval = max(2, round(eval_fraction * len(documents)))
    held_out = sorted(order[:n_eval])
    kept = sorted(order[n_eval:])
    if isinstance(documents, Column) and isinstance(documents.source, datasets.Dataset):
        source, column = documents.source, documents.column_name
        return source.select(kept)[column], source.select(held_out)[column]
    return [documents[i] for i in kept], [documents[i] for i in held_out]


def load_or_train_tokenizer(config: PretrainConfig, accelerator: Accelerator, resuming: bool, texts):
    """The run's tokenizer: the run's own copy when resuming; `--tokenizer`; or one trained on `texts()`.

    Nothing is written here. With several processes the main process trains it and hands
    it to the others through a temporary folder beside the run's (removed right after).
    """
    own_copy = Path(config.output_dir) / TOKENIZER_DIR
    if resuming and own_copy.is_dir():
        return load_tokenizer(own_copy)
    if config.tokenizer:
        return load_tokenizer(config.tokenizer, max_length=config.max_position_embeddings)
    handover = Path(config.output_dir).parent / f".tmp-tokenizer-{Path(config.output_dir).name}"
    if accelerator.is_main_process:
        tokenizer = train_tokenizer(
            texts(),
            vocab_size=config.vocab_size or DEFAULT_VOCAB_SIZE,
            lowercase=config.lowercase,
            model_max_length=config.max_position_embeddings,
            show_progress=False,
        )
        if accelerator.num_processes > 1:
            tokenizer.save_pretrained(handover)
    accelerator.wait_for_everyone()
    if not accelerator.is_main_process:
        tokenizer = load_tokenizer(handover)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process and handover.exists():
        shutil.rmtree(handover)
    return tokenizer


def build_data(config: PretrainConfig, accelerator: Accelerator, resuming: bool = False):
    """(tokenizer, training examples, held-out examples, --long-phase examples or None) from the corpus.

    Files and datasets: examples in datasets' cache (`build_datasets`; the main process builds,
    the others then read its cache). --streaming: a stream of training examples and a small
    held-out set (`streaming.py`).
    """
    if config.streaming:
        train_docs, eval_docs = streaming.split_stream(load_corpus(config), config.eval_fraction)
        tokenizer = load_or_train_tokenizer(config, accelerator, resuming, lambda: streaming.first_texts(train_docs))
        return tokenizer, *build_stream_datasets(config, tokenizer, train_docs, eval_docs), None
    train_docs, eval_docs = split_documents(load_corpus(config), config.eval_fraction, config.seed)
    tokenizer = load_or_train_tokenizer(config, accelerator, resuming, lambda: train_docs)
    with accelerator.main_process_first():
        train_dataset, eval_dataset = build_datasets(config, tokenizer, train_docs, eval_docs)
    long_dataset = build_long_dataset(config, tokenizer, train_docs, accelerator) if config.long_phase else None
    return tokenizer, train_dataset, eval_dataset, long_dataset


def build_long_dataset(config: PretrainConfig, tokenizer, train_docs, accelerator: Accelerator):
    """--long-phase: the training documents' examples at --long-seq-length (the tokens come from the cache)."""
    long_length = config.long_seq_length or config.max_position_embeddings
    with accelerator.main_process_first():
        tokenized = tokenize_documents(train_docs, tokenizer, num_proc=config.num_proc, sentences=config.packing != "full-sentences")
        dataset = build_examples(tokenized, tokenizer, seed=config.seed + 20_000, **_recipe(config, long_length))
    if len(dataset) == 0:
        raise ScratchBertError(f"--long-phase: the training text gives no example of {long_length} tokens. Lower --long-seq-length or add text.")
    return dataset


def build_datasets(config: PretrainConfig, tokenizer, train_docs: Sequence[str], eval_docs: Sequence[str]):
    """Example datasets for training and evaluation (`datasets.Dataset`s), as `config.packing` says.

    Prepared once: for documents in the Arrow cache (`load_corpus`), every step is cached
    beside them under a key made of the documents (the corpus files' paths, sizes and
    modification times, and the split), the tokenizer's content, the options and examples.py's
    code, so a second run, a resume or another model with the same corpus, tokenizer and
    options reads the examples instead of tokenizing again, and an edited corpus or another
    tokenizer builds new ones.

    full-sentences: the documents' text packed into examples of exactly max_seq_length
    tokens (`build_packed_dataset`); dynamic masking makes each epoch new.
    sentence-pairs: the documents are tokenized once and paired `dupe_factor` times with
    different seeds (as BERT's create_pretraining_data.py does): each copy cuts the
    documents into other A/B segments and draws other NotNext partners, so a small corpus
    offers more distinct sentence pairs than one pass over it would. Without NSP every B
    is the text that follows A.
    """
    examples = functools.partial(build_examples, tokenizer=tokenizer, **_recipe(config))
    splits = []
    for name, docs, copies, seed in (
        ("training", train_docs, config.dupe_factor if config.packing == "sentence-pairs" else 1, config.seed),
        ("held-out", eval_docs, 1, config.seed + 10_000),  # a seed no training copy uses
    ):
        # Packing runs a document's sentences together: it needs no sentence splitter.
        tokenized = tokenize_documents(docs, tokenizer, num_proc=config.num_proc, sentences=config.packing != "full-sentences")
        try:
            dataset = examples(tokenized, seed=seed)
            if copies > 1:  # --dupe-factor: more pairings of the same documents, each of its own seed
                dataset = datasets.concatenate_datasets([dataset, *(examples(tokenized, seed=seed + copy) for copy in range(1, copies))])
        except ValueError as err:
            raise ScratchBertError(f"the {name} split ({len(docs)} documents): {err}") from None
        if len(dataset) == 0:
            raise ScratchBertError(
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


def _recipe(config: PretrainConfig, max_seq_length: int | None = None) -> dict:
    """What `examples.build_examples` needs to know of the run: the recipe's packing, length and pairing."""
    return {"packing": config.packing, "max_seq_length": max_seq_length or config.max_seq_length, "short_seq_prob": config.short_seq_prob,
            "nsp_probability": 0.5 if config.nsp else 0.0, "num_proc": config.num_proc}  # fmt: skip


def build_stream_datasets(config: PretrainConfig, tokenizer, train_docs: datasets.IterableDataset, eval_docs: datasets.IterableDataset):
    """--streaming: the training examples as a stream, and a fixed held-out set read from the start of its stream.

    The training stream is one pass over the documents with the recipe's examples (sentence
    pairs are paired once: `--dupe-factor` does not apply); each epoch reads it again.
    """
    eval_dataset = build_examples(eval_docs, tokenizer, seed=config.seed + 10_000, **_recipe(config))
    eval_dataset = streaming.materialize(eval_dataset, config.max_eval_examples or None, "held-out")
    return build_examples(train_docs, tokenizer, seed=config.seed, **_recipe(config)), eval_dataset
