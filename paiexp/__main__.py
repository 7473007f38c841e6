"""``python -m paiexp``: see :mod:`paiexp.cli`."""

from __future__ import annotations

from paiexp.cli import entry

if __name__ == "__main__":  # not when multiprocessing's spawn imports this module
    entry()
