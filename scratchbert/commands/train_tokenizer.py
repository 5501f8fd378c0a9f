"""`scratchbert train-tokenizer`: a WordPiece vocabulary from text files or a dataset."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator
from pathlib import Path

from scratchbert import ingestion
from scratchbert.errors import ScratchBertError
from scratchbert.tokenization import train_tokenizer


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "train-tokenizer",
        help="train a BERT WordPiece tokenizer on text files or a dataset",
        description="Train a BERT WordPiece tokenizer and save it (vocab.txt, tokenizer.json, "
        "tokenizer_config.json) so that AutoTokenizer.from_pretrained(OUT) loads it.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--train-files", dest="files", nargs="+", metavar="PATH", help="text files or globs (quoted), .gz/.bz2/.xz read too; one or more texts per line")
    source.add_argument("--dataset", metavar="NAME", help="a datasets name or folder, a save_to_disk folder, or .jsonl/.csv/.parquet files")
    parser.add_argument("--text-column", default="text", help="column of --dataset holding the text (default: text)")
    parser.add_argument("--split", default="train", help="split of --dataset to read (default: train)")
    parser.add_argument("--vocab-size", type=int, default=30522, help="tokens in the vocabulary (default: 30522, BERT's)")
    parser.add_argument("--min-frequency", type=int, default=2, help="merge only pairs seen this often (default: 2)")
    parser.add_argument("--no-lowercase", dest="cased", action="store_true", help="keep case and accents (default: lowercase and strip accents)")
    parser.add_argument("--model-max-length", type=int, default=512, help="longest input of the model (default: 512)")
    parser.add_argument("--output-dir", dest="out", required=True, metavar="DIR", help="directory to save the tokenizer in")
    parser.add_argument("--overwrite", action="store_true", help="replace a tokenizer already saved in --output-dir")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ScratchBertError(f"--output-dir {out} is a file; give a directory.")
    if (out / "tokenizer.json").exists() and not args.overwrite:
        raise ScratchBertError(f"{out} already holds a tokenizer; choose another --output-dir or pass --overwrite.")
    if args.files:
        files = ingestion.expand_files(args.files)  # globs expanded, every file checked before training
        texts, source = files, ", ".join(args.files)
    else:
        corpus = ingestion.load_documents(args.dataset, text_column=args.text_column, split=args.split, streaming=True)
        texts, source = (batch["text"] for batch in corpus.iter(batch_size=ingestion.BATCH_SIZE)), args.dataset
    tokenizer = train_tokenizer(
        _with_progress(ingestion.text_batches(texts), f"reading {source}"[:70]),
        vocab_size=args.vocab_size,
        min_frequency=args.min_frequency,
        lowercase=not args.cased,
        model_max_length=args.model_max_length,
        show_progress=True,
    )
    tokenizer.save_pretrained(out)
    print(f"saved {'a cased' if args.cased else 'an uncased'} WordPiece tokenizer of {len(tokenizer)} tokens to {out}")
    return 0


def _with_progress(batches: Iterable[list[str]], description: str) -> Iterator[list[str]]:
    """Count the texts going to the trainer (tqdm on stderr)."""
    from tqdm.auto import tqdm

    with tqdm(desc=description, unit=" texts") as bar:
        for batch in batches:
            bar.update(len(batch))
            yield batch
