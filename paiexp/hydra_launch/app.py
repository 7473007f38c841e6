"""A Hydra app as a job's code: how a job runs it again, and the snapshot of its code."""

from __future__ import annotations

import inspect
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from paiexp.contract.source import IGNORED_NAMES, IGNORED_SUFFIXES
from paiexp.errors import UserError

# Never part of an app's code: paiexp's and MLflow's local state, Hydra's output trees
# (a directory holding a .hydra/ or a multirun.yaml: see _is_output_tree).
STATE_NAMES = frozenset({".paiexp", "mlruns", "mlartifacts", "mlflow.db"})


@dataclass(frozen=True)
class AppEntry:
    """How a job runs the app again: its script (relative to the code directory), its module
    (as ``python -m`` ran it), or its decorated ``function`` in an importable module."""

    script: str | None = None
    module: str | None = None
    function: str | None = None

    def as_json(self) -> dict[str, str | None]:
        return asdict(self)

    def describe(self) -> str:
        if self.script:
            return self.script
        return f"{self.module}:{self.function}" if self.function else f"-m {self.module}"


def app_entry(task_function: Callable[..., Any], code_dir: Path) -> AppEntry | None:
    """How the app that ``task_function`` is the task of runs again in a job whose code is
    ``code_dir``; None when it is no app's entry point (a closure, a callable object: it is
    shipped by value instead)."""
    if not inspect.isfunction(task_function) or "." in task_function.__qualname__:
        return None
    module = task_function.__module__
    if module != "__main__":
        decorated = getattr(sys.modules.get(module), task_function.__name__, None)
        if getattr(decorated, "__wrapped__", None) is not task_function:
            return None
        return AppEntry(module=module, function=task_function.__name__)
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:  # python -m MODULE
        return AppEntry(module=spec.name.removesuffix(".__main__"))
    script = Path(task_function.__code__.co_filename).resolve()
    main_file = getattr(main, "__file__", None)
    if main_file is None or Path(main_file).resolve() != script:
        return None
    try:
        return AppEntry(script=script.relative_to(code_dir.resolve()).as_posix())
    except ValueError:
        raise UserError(
            f"job.source_dir: the app {script} is not under {code_dir}; "
            "set it to a directory that holds the app and the code it imports"
        ) from None


def source_dir(cwd: Path, configured: str | None) -> Path:
    """The app's code: ``job.source_dir`` (relative to ``cwd``), or ``cwd``, the directory the
    app started in."""
    path = (cwd / configured) if configured else cwd
    if not path.is_dir():
        raise UserError(f"job.source_dir: {str(path)!r} is not a directory")
    return path.resolve()


def snapshot_code(source_dir: Path, dest: Path) -> Path:
    """A copy of the app's code in ``dest`` (once per multirun: its jobs run the same code,
    whatever is edited meanwhile), without VCS data, caches, local state or Hydra outputs."""
    if dest.exists():
        return dest

    def ignored(directory: str, names: list[str]) -> set[str]:
        return {
            name
            for name in names
            if name in IGNORED_NAMES
            or name in STATE_NAMES
            or name.endswith(IGNORED_SUFFIXES)
            or _is_output_tree(Path(directory, name))
        }

    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source_dir, partial, ignore=ignored, symlinks=True)
    partial.rename(dest)
    return dest


def _is_output_tree(path: Path) -> bool:
    """A directory Hydra wrote a run or a multirun into."""
    return path.is_dir() and ((path / ".hydra").is_dir() or (path / "multirun.yaml").is_file())
