"""``python -m vitlab ...``: the ``vitlab`` command (``vitlab.cli.main``), for an environment whose scripts folder is
not on PATH."""

import sys

from vitlab.cli import main

if __name__ == "__main__":
    sys.exit(main())
