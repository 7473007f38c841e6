"""``python -m paiexp``: see :mod:`paiexp.cli`."""

from __future__ import annotations

import sys

from paiexp.cli import main

sys.exit(main())
