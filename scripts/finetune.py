"""Fine-tune a BERT checkpoint as a text classifier: the same as `scratchbert finetune`.

    python scripts/finetune.py CHECKPOINT --train-files train.csv --output-dir out
"""

import sys

from scratchbert.commands import main

if __name__ == "__main__":
    sys.exit(main(["finetune", *sys.argv[1:]]))
