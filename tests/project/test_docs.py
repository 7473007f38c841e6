"""The documentation site builds (``mkdocs build --strict``) with its generated references, and
what the docs and the README show still works: every Python block compiles, every
``python -m paiexp`` line that composes a config composes (``--cfg job``; a grid,
``--dry-run``), and every subcommand they name exists."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, assert_nothing_started, run_paiexp

from paiexp.cli import COMMANDS
from paiexp.config.schema import JobConfig, PaiBackendConfig, SweepConfig

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
PAIEXP = re.compile(r"^(?:\.venv/bin/)?(?:python -m paiexp|paiexp)(?:\s|$)")
# A word that stands for a value the reader supplies (RUN_ID, IMAGE, $IMAGE, ..., [KEY=VALUE]).
PLACEHOLDER = re.compile(r"^\$|\.\.\.|^\[|(^|=)[A-Z][A-Z0-9_]*$")
PROJECT_DIRS = ("conf", "sweeps", "pipelines", "examples")


def blocks(page: Path) -> list[tuple[str, int, str]]:
    """Each fenced block of ``page``: (its language, its first line's number, its text)."""
    found: list[tuple[str, int, str]] = []
    language: str | None = None
    start, body = 0, []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            if language is None:
                language, start, body = line[3:].strip(), number + 1, []
            else:
                found.append((language, start, "\n".join(body)))  # type: ignore[arg-type]
                language = None
        elif language is not None:
            body.append(line)
    return found


def command_lines() -> list[tuple[str, list[str]]]:
    """Each paiexp command line of a shell block (continued lines joined, comments dropped),
    by where it is: ``page:line``."""
    lines = []
    for page in PAGES:
        for language, start, text in blocks(page):
            if language not in ("bash", "sh", "console"):
                continue
            pending: list[str] = []
            for offset, line in enumerate(text.splitlines()):
                pending.append(line.removesuffix("\\"))
                if line.endswith("\\"):
                    continue
                command, pending = " ".join(pending).strip(), []
                if PAIEXP.match(command):
                    words = shlex.split(command, comments=True)
                    where = f"{page.relative_to(REPO)}:{start + offset}"
                    lines.append((where, words[3:] if words[0].endswith("python") else words[1:]))
    return lines


def python_blocks() -> list[tuple[str, str]]:
    return [
        (f"{page.relative_to(REPO)}:{start}", text)
        for page in PAGES
        for language, start, text in blocks(page)
        if language == "python"
    ]


COMMAND_LINES = command_lines()
COMPOSED = [
    (where, words)
    for where, words in COMMAND_LINES
    if not (words and words[0] in COMMANDS)
    and not any(PLACEHOLDER.search(w) for w in words)
    and not {"--info", "-i", "--cfg", "-q"} & set(words)
]


def test_the_site_builds_with_no_warning(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a broken link, a missing page or a docstring mkdocstrings
    cannot render fails the build (and the command-line reference runs every parser)."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr
    site = tmp_path / "site"
    cli = (site / "reference" / "cli.html").read_text()
    assert all(f"paiexp {name}" in cli for name in COMMANDS)
    assert 'id="paiexp.start_sweep"' in (site / "reference" / "api.html").read_text()
    keys = (site / "reference" / "config.html").read_text()  # generated from the schema
    for schema, prefix in [
        (JobConfig, "job"),
        (SweepConfig, "sweep"),
        (PaiBackendConfig, "backend"),
    ]:
        assert all(f"{prefix}.{f.name}" in keys for f in dataclasses.fields(schema)), schema
    errors = (site / "reference" / "errors.html").read_text()  # generated from the source
    assert "no such key yet; a leading + adds one" in errors and "paiexp.config.compose" in errors


PYTHON_BLOCKS = python_blocks()


@pytest.mark.parametrize(("where", "source"), PYTHON_BLOCKS, ids=[w for w, _ in PYTHON_BLOCKS])
def test_every_python_block_compiles(where: str, source: str) -> None:
    compile(source, where, "exec")


def test_the_docs_name_only_subcommands_that_exist() -> None:
    named = {words[0] for _, words in COMMAND_LINES if words and not words[0].startswith("-")}
    subcommands = {w for w in named if "=" not in w}
    assert subcommands and subcommands <= set(COMMANDS), subcommands - set(COMMANDS)


@pytest.fixture(scope="module")
def shipped_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's project (its conf/, sweeps/, pipelines/, examples/), as a copy."""
    root = tmp_path_factory.mktemp("docs-project")
    for name in PROJECT_DIRS:
        shutil.copytree(REPO / name, root / name)
    return root


@pytest.mark.parametrize(("where", "words"), COMPOSED, ids=[w for w, _ in COMPOSED])
def test_every_documented_command_line_composes(
    where: str, words: list[str], shipped_project: Path
) -> None:
    """As written, with ``--cfg job`` (a grid: ``--dry-run``, which prints what it can cost):
    composed and checked, nothing run."""
    check = ["--dry-run"] if {"-m", "--multirun"} & set(words) else ["--cfg", "job"]
    done = run_paiexp(shipped_project, *words, *check, timeout=120)
    assert done.returncode == 0, f"{where}: paiexp {shlex.join(words)}: {done.stderr}"
    assert_nothing_started(shipped_project)


def test_the_checks_see_the_docs_commands() -> None:
    """The commands above are found: a change to how the docs spell them cannot silently make
    these tests check nothing."""
    assert len(COMMAND_LINES) >= 40 and len(COMPOSED) >= 12, COMPOSED
    assert len(PYTHON_BLOCKS) >= 4


def _hooks() -> Any:
    """docs/hooks.py, the site's generators, as a module."""
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PLACEHOLDER_IN_TEMPLATE = re.compile(r"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}")


def _glob(text: str, wildcard: re.Pattern[str]) -> list[str]:
    """``text`` as literal characters, each part ``wildcard`` finds as one ``*`` (any text)."""
    out: list[str] = []
    for index, literal in enumerate(wildcard.split(text)):
        out += [*(["*"] if index else []), *literal]
    return out


def _can_say_the_same(one: list[str], other: list[str]) -> bool:
    """Whether some line fits both patterns (characters and ``*``, any text; but a value
    filled in never holds a key's ``: ``, so each ``*`` of ``other`` stops at one)."""
    seen: dict[tuple[int, int], bool] = {}
    stack = [(0, 0)]
    while stack:
        i, j = stack.pop()
        if (i, j) in seen:
            continue
        seen[i, j] = True
        if i == len(one) and j == len(other):
            return True
        a = one[i] if i < len(one) else None
        b = other[j] if j < len(other) else None
        if a == "*":
            stack += [(i + 1, j)] + ([(i, j + 1)] if b is not None else [])
        if b == "*":
            takes = a is not None and one[i : i + 2] != [":", " "]
            stack += [(i, j + 1)] + ([(i + 1, j)] if takes else [])
        if a is not None and a == b and a != "*":
            stack.append((i + 1, j + 1))
    return False


def _shares_words(line: str, template: list[str]) -> bool:
    """Whether ``line`` and the message's own words (not its values) have 12 characters in a
    row in common: a message that is mostly values (``{key}: {value}``) fits any line."""
    words = "".join(template).split("*")
    return any(
        difflib.SequenceMatcher(None, line, part).find_longest_match().size >= 12 for part in words
    )


def test_every_error_the_troubleshooting_page_quotes_is_one_the_code_words() -> None:
    """Each line the troubleshooting table quotes is the start of a message the code raises
    (whole, or cut off with a final ``...``; the code's ``{...}`` any values filled in): a
    reworded error cannot leave the page behind.  The generated reference lists them all."""
    hooks = _hooks()
    templates = [
        _glob(message, PLACEHOLDER_IN_TEMPLATE)
        for *_, message in hooks.error_messages()
        if len(PLACEHOLDER_IN_TEMPLATE.sub("", message)) >= 12  # not only '{str(exc)}'
    ]
    assert len(templates) > 200
    page = (REPO / "docs" / "troubleshooting.md").read_text()
    quoted = re.findall(r"^\| `(.+?)` \|", page, re.MULTILINE)
    assert len(quoted) >= 12
    for line in quoted:
        said = [*line.removesuffix("..."), *(["*"] if line.endswith("...") else [])]
        assert any(
            _shares_words(line, template) and _can_say_the_same(said, template)
            for template in templates
        ), line


# The tour's commands that need nothing but this machine and what the tour ran before them;
# the rest need a run's id, PAI or a browser, or serve until stopped (composed above).
NOT_RUN_IN_THE_TOUR = {"images", "import", "tensorboard", "rerun", "attach", "register"}


def tour() -> list[tuple[str, list[str]]]:
    """The getting-started tour's command lines that run here, in order."""
    return [
        (where, words)
        for where, words in COMMAND_LINES
        if where.startswith("docs/getting-started.md")
        and not any(PLACEHOLDER.search(w) for w in words)
        and not (words and words[0] in NOT_RUN_IN_THE_TOUR)
    ]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_tour_runs_as_written(tmp_path: Path) -> None:
    """The tour's commands, each as written and in order, in a copy of the project: each
    exits 0 (the sweep, its continuation, the pipeline, single runs, a grid, the report, the
    best model's download, ``paiexp init``)."""
    for name in PROJECT_DIRS:
        shutil.copytree(REPO / name, tmp_path / name)
    ran = tour()
    assert {"+sweep=xgb", "+pipeline=xgb", "-m", "report", "download", "init"} <= {
        word for _, words in ran for word in words
    }, ran
    for where, words in ran:
        done = run_paiexp(tmp_path, *words, timeout=600)
        assert done.returncode == 0, f"{where}: paiexp {shlex.join(words)}:\n{done.stderr[-3000:]}"
    assert (tmp_path / "model").is_dir() and (tmp_path / "my-project" / "conf").is_dir()
