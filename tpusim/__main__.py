"""``python -m tpusim``: the ``tpusim`` command line."""

import sys

from tpusim.cli import main

if __name__ == "__main__":
    sys.exit(main())
