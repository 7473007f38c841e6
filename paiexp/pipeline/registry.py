"""``pipelines/NAME.yaml`` files, selectable as ``+pipeline=NAME`` (see
:mod:`paiexp.config_files`): a ``pipeline:`` node holds the steps, and any other key the file
sets applies to every step."""

from __future__ import annotations

from collections.abc import Sequence

from paiexp.config_files import ConfigFiles

PIPELINES = ConfigFiles("pipeline")
register_selected_pipeline = PIPELINES.register


def selected_pipeline(overrides: Sequence[str]) -> str | None:
    """The pipeline the overrides select (the last, as Hydra's last override wins)."""
    names = PIPELINES.selected(overrides)
    return names[-1] if names else None
