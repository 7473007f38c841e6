"""mkdocs hooks: the command-line reference from paiexp's parsers, and the config keys from
its schema's dataclasses (their types, defaults and source comments)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import re
import typing
from typing import Any

from omegaconf import MISSING as MISSING_VALUE

from paiexp.cli import COMMANDS, main

MARK = "<!-- paiexp-cli-help -->"


def _help(*args: str) -> str:
    """What ``paiexp ARGS --help`` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([*args, "--help"])
    return out.getvalue()


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARK in markdown:
        sections = [f"## paiexp\n\n```text\n{_help()}```\n"]
        sections += [f"## paiexp {name}\n\n```text\n{_help(name)}```\n" for name in COMMANDS]
        markdown = markdown.replace(MARK, "\n".join(sections))
    if CONFIG_MARK in markdown:
        markdown = markdown.replace(CONFIG_MARK, config_keys())
    return markdown


CONFIG_MARK = "<!-- paiexp-config-keys -->"


def _comments(cls: type) -> dict[str, str]:
    """Each field of dataclass ``cls`` to the comment its source gives it: the comment lines
    right above it and the one at the end of its line."""
    lines, _ = inspect.getsourcelines(cls)
    said: dict[str, str] = {}
    above: list[str] = []
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        field = re.match(r"^\s+(\w+): ", line)
        if field:
            trailing = line.partition("  # ")[2].strip() if "  # " in line else ""
            said[field.group(1)] = " ".join([*above, trailing]).strip()
        above = []
    return said


def _default(field: dataclasses.Field[Any]) -> str:
    if field.default is MISSING_VALUE and field.default_factory is dataclasses.MISSING:
        return "required"
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
        return "" if dataclasses.is_dataclass(value) else f"`{value!r}`"
    value = field.default
    if field.default is dataclasses.MISSING:
        return "required"
    return f"`{getattr(value, 'value', value)!r}`"


def _type(hint: Any) -> str:
    text = getattr(hint, "__name__", None) if isinstance(hint, type) else None
    return (text or str(hint)).replace("typing.", "").replace("paiexp.config.schema.", "")


def _rows(prefix: str, cls: type) -> list[str]:
    """A table row per key of dataclass ``cls`` under ``prefix``, nested dataclasses inlined."""
    hints = typing.get_type_hints(cls)
    comments = _comments(cls)
    rows = []
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        key = f"{prefix}.{field.name}"
        if dataclasses.is_dataclass(hint):
            rows += _rows(key, hint)  # type: ignore[arg-type]
            continue
        said = comments.get(field.name, "").replace("|", "\\|")
        rows.append(f"| `{key}` | `{_type(hint)}` | {_default(field)} | {said} |")
    return rows


def config_keys() -> str:
    """Every key of the config schema (``paiexp.config.schema``), one table per section."""
    from paiexp.config.schema import BACKENDS, JobConfig, PipelineConfig, SweepConfig, TrackerConfig

    sections = [("job", JobConfig), ("tracker", TrackerConfig), ("sweep", SweepConfig)]
    sections += [(f"backend ({name})", kind.schema) for name, kind in BACKENDS.items()]
    sections += [("pipeline", PipelineConfig)]
    out = []
    for title, cls in sections:
        prefix = title.split(" ")[0]
        doc = inspect.getdoc(cls) or ""
        out.append(f"### `{title}`\n\n{doc}\n\n| key | type | default | |\n|---|---|---|---|")
        out.extend(_rows(prefix, cls))
        out.append("")
    return "\n".join(out)
