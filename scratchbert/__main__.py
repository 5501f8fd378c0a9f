import sys

from scratchbert.commands import main

sys.exit(main())
