"""The training code directory: which files it holds, its content digest, its git revision."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Never part of a job's code: VCS metadata, caches, local virtual environments.
IGNORED_NAMES = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        ".venv",
        "venv",
        ".ipynb_checkpoints",
        ".DS_Store",
    }
)
IGNORED_SUFFIXES = (".pyc", ".pyo")


def iter_source_files(root: Path) -> Iterator[Path]:
    """Files under ``root`` that belong to the job's code, in a stable (sorted) order."""
    for path in sorted(root.iterdir()):
        if path.name in IGNORED_NAMES or path.name.endswith(IGNORED_SUFFIXES):
            continue
        if path.is_dir():
            yield from iter_source_files(path)
        elif path.is_file():
            yield path


def source_digest(root: Path) -> str:
    """sha256 over relative paths, executable bits and contents: equal trees, equal digests."""
    digest = hashlib.sha256()
    for path in iter_source_files(root):
        relative = path.relative_to(root).as_posix()
        executable = "x" if path.stat().st_mode & 0o111 else "-"
        digest.update(f"{relative}\0{executable}\0{path.stat().st_size}\0".encode())
        with path.open("rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def copy_source(root: Path, destination: Path) -> None:
    """Copy the job's code files (as :func:`iter_source_files` lists them) to ``destination``."""
    destination.mkdir(parents=True, exist_ok=True)
    for path in iter_source_files(root):
        target = destination / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


@dataclass(frozen=True)
class GitRevision:
    commit: str
    dirty: bool


def git_revision(directory: Path) -> GitRevision | None:
    """The commit checked out where ``directory`` lives, and whether that directory has changes."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(directory), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(directory), "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return GitRevision(commit=commit, dirty=bool(status.strip()))
