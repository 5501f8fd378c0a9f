"""Pretrain BERT from scratch: `python scripts/pretrain.py ...` or `accelerate launch scripts/pretrain.py ...`.

A thin wrapper over `scratchbert pretrain` (scratchbert/commands/pretrain.py); the loop lives in
scratchbert/training/pretraining/loop.py. `--help` lists the options.
"""

import sys

from scratchbert.commands.pretrain import main

if __name__ == "__main__":
    sys.exit(main())
