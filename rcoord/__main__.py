"""``python -m rcoord``: the command line (see ``rcoord.cli``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
