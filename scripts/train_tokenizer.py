"""Train a BERT WordPiece tokenizer: the same as `scratchbert train-tokenizer`.

    python scripts/train_tokenizer.py --train-files ../shared/data/corpus/*.txt --vocab-size 30522 --output-dir runs/tokenizer
    python scripts/train_tokenizer.py --dataset ../shared/data/imdb/train.jsonl.gz --vocab-size 8192 --no-lowercase --output-dir runs/imdb-tok

The result loads with `AutoTokenizer.from_pretrained(OUT)` once `scratchbert` is imported.
The command is scratchbert/commands/train_tokenizer.py over `scratchbert.tokenization`; see `--help` for the options.
"""

import sys

from scratchbert.commands import main

if __name__ == "__main__":
    sys.exit(main(["train-tokenizer", *sys.argv[1:]]))
