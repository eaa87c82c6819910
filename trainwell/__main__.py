"""``python -m trainwell``: the same as the ``trainwell`` command."""

import sys

from trainwell.cli import main

if __name__ == "__main__":
    sys.exit(main())
