"""The `scratchbert` console script: the command line lives in `scratchbert/commands/`."""

from __future__ import annotations

import sys

from scratchbert.commands import main
from scratchbert.errors import ScratchBertError

CommandError = ScratchBertError  # the name earlier versions raised; kept for code that catches it

if __name__ == "__main__":
    sys.exit(main())
