"""``python -m paiexp``: see :mod:`paiexp.cli`."""

from __future__ import annotations

import sys

from paiexp.cli import main

if __name__ == "__main__":  # not when multiprocessing's spawn imports this module
    sys.exit(main())
