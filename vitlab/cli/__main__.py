"""``python -m vitlab.cli ...``: the ``vitlab`` command (as ``python -m vitlab``)."""

import sys

from vitlab.cli import main

if __name__ == "__main__":
    sys.exit(main())
