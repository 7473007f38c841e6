"""``sweeps/NAME.yaml`` files, selectable as ``+sweep=NAME`` (see :mod:`paiexp.config_files`)."""

from __future__ import annotations

from paiexp.config_files import ConfigFiles

SWEEPS = ConfigFiles("sweep")
SWEEP_SELECTION = SWEEPS.selection
available_sweeps = SWEEPS.available
register_selected_sweep = SWEEPS.register
