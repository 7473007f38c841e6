"""mkdocs hooks: the command-line reference, from paiexp's parsers themselves."""

from __future__ import annotations

import contextlib
import io
from typing import Any

from paiexp.cli import COMMANDS, main

MARK = "<!-- paiexp-cli-help -->"


def _help(*args: str) -> str:
    """What ``paiexp ARGS --help`` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([*args, "--help"])
    return out.getvalue()


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARK not in markdown:
        return markdown
    sections = [f"## paiexp\n\n```text\n{_help()}```\n"]
    sections += [f"## paiexp {name}\n\n```text\n{_help(name)}```\n" for name in COMMANDS]
    return markdown.replace(MARK, "\n".join(sections))
