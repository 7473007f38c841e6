"""mkdocs hooks: the command-line reference from paiexp's parsers, the config keys from its
schema's dataclasses (their types, defaults and source comments), and every one-line error
from the source that raises it."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import io
import re
import typing
from pathlib import Path
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
    if ERRORS_MARK in markdown:
        markdown = markdown.replace(ERRORS_MARK, errors_page())
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


ERRORS_MARK = "<!-- paiexp-errors -->"
# the exceptions paiexp prints as one line: UserError and its kinds
ONE_LINE_ERRORS = {
    "UserError",
    "ConfigError",
    "JobRejected",
    "PaiRejected",
    "OpenPaiRejected",
    "Escape",
    "LauncherConfigError",
    "ConditionError",
}
PACKAGE = Path(__file__).resolve().parents[1] / "paiexp"


def _template(node: ast.expr) -> str:
    """A message as its source words it: an f-string's values as ``{...}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            part.value if isinstance(part, ast.Constant) else "{" + ast.unparse(part.value) + "}"
            for part in node.values
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _template(node.left) + _template(node.right)
    return "{" + ast.unparse(node) + "}"


# functions that word an error another raises (Hydra's and OmegaConf's errors described, a
# metric definition checked): what they return is a message too
MESSAGE_MAKERS = re.compile(r"describe|error|_not_an?_")


def _constant(node: ast.expr) -> object:
    return "" if isinstance(node, ast.JoinedStr) else getattr(node, "value", None)


def error_messages() -> list[tuple[str, int, str, str]]:
    """Every one-line error paiexp raises: (module, line, function, message template)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
                continue
            name = getattr(function, "name", "")
            for node in ast.walk(function):
                call = node.exc if isinstance(node, ast.Raise) else None
                if not (isinstance(call, ast.Call) and call.args):
                    continue
                kind = call.func.attr if isinstance(call.func, ast.Attribute) else None
                kind = call.func.id if isinstance(call.func, ast.Name) else kind
                if kind in ONE_LINE_ERRORS:
                    found.append((module, node.lineno, name, _template(call.args[0])))
            if MESSAGE_MAKERS.search(name):  # returns the words of an error raised elsewhere
                found += [
                    (module, node.lineno, name, _template(node.value))
                    for node in ast.walk(function)
                    if isinstance(node, ast.Return)
                    and isinstance(node.value, ast.JoinedStr | ast.Constant)
                    and isinstance(_constant(node.value), str)
                ]
    # a raise inside a nested function is seen from each function around it: keep the nearest
    nearest: dict[tuple[str, int], tuple[str, int, str, str]] = {}
    for entry in found:
        nearest[entry[:2]] = entry if entry[:2] not in nearest or entry[2] else nearest[entry[:2]]
    return sorted(nearest.values())


def errors_page() -> str:
    """The errors, one table per module: where each is raised, and its words."""
    sections: dict[str, list[str]] = {}
    for module, line, function, message in error_messages():
        shown = message.replace("|", "\\|").replace("\n", " ")
        sections.setdefault(module, []).append(
            f"| `{shown}` | `{function or '(module)'}`, line {line} |"
        )
    out = [f"{sum(len(rows) for rows in sections.values())} messages in {len(sections)} modules.\n"]
    for module, rows in sections.items():
        out += [f"### `{module}`\n", "| the line says | raised in |", "|---|---|", *rows, ""]
    return "\n".join(out)
