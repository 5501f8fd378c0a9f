import sys

from scratchbert.cli import main

sys.exit(main())
