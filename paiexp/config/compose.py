"""Config composition with Hydra, and Hydra's and OmegaConf's errors turned into one line.

The project is the directory holding its primary config directory, ``conf/`` (the current
directory's unless ``--config-path`` names another); relative paths in its configs are taken
from there.  As in Hydra, ``--config-dir`` adds a directory to the config search path, after
the primary one: it may add configs (``job=other``), not replace the project's.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from paiexp.config.files import PIPELINES, SWEEPS
from paiexp.config.schema import BACKENDS, Config, register_configs
from paiexp.errors import UserError

CONFIG_NAME = "config"
# The sweep ``-m`` runs when no +sweep=NAME is given: a grid over the command line's values.
GRID_SWEEP = "paiexp_multirun"


@dataclass(frozen=True)
class Project:
    config_dir: Path  # the primary config directory
    config_name: str = CONFIG_NAME
    search_dirs: tuple[Path, ...] = ()  # --config-dir: searched after the primary one

    @property
    def base_dir(self) -> Path:
        return self.config_dir.parent

    @property
    def config_dirs(self) -> tuple[Path, ...]:
        """The search path's directories, in order: the primary one, then each added one."""
        return (self.config_dir, *self.search_dirs)

    @property
    def sweeps_dir(self) -> Path:
        return self.base_dir / "sweeps"

    @property
    def pipelines_dir(self) -> Path:
        return self.base_dir / "pipelines"


def locate_project(
    config_path: str | None = None,
    config_name: str = CONFIG_NAME,
    search_dirs: Sequence[str] = (),
) -> Project:
    """The project of primary config directory ``config_path`` (default ``conf``), with
    ``search_dirs`` added to its search path; relative paths are the working directory's."""
    # absolute but not resolved: a symlinked conf/ keeps the project where it is linked
    path = Path(os.path.abspath(config_path or "conf"))
    extra = tuple(Path(os.path.abspath(d)) for d in search_dirs)
    for directory in extra:
        if not directory.is_dir():
            raise UserError(f"--config-dir: additional config directory {directory} not found")
    if not any((d / f"{config_name}.yaml").is_file() for d in (path, *extra)) or not path.is_dir():
        searched = "".join(f" nor {d}" for d in extra)
        raise UserError(
            f"no {config_name}.yaml in {path}{searched}: run paiexp from a project directory "
            "holding conf/, pass --config-path DIR, or create a starter project with `paiexp init`"
        )
    return Project(config_dir=path, config_name=config_name, search_dirs=extra)


def compose(project: Project, overrides: Sequence[str], *, multirun: bool = False) -> DictConfig:
    """Compose the project's config with command-line overrides (Hydra's grammar).

    ``multirun``: the overrides are ``-m``'s, its sweep values taken out: without a
    ``+sweep=NAME`` the config gets an empty sweep (``GRID_SWEEP``) for the grid to fill.
    """
    from hydra import compose as hydra_compose

    hydra_overrides = _registered(project, overrides, multirun)
    try:
        with _hydra(project):
            cfg = hydra_compose(project.config_name, overrides=hydra_overrides)
    except Exception as exc:  # Hydra raises many types; each becomes one line
        raise UserError(describe_error(exc)) from None
    _refuse_unknown_keys(cfg, "")
    return cfg


def _refuse_unknown_keys(node: Any, path: str) -> None:
    """A key no schema has, which Hydra's ``+key=value`` adds to a structured config as
    readily as to a plain one (and which nothing would read), is a UserError naming it."""
    if isinstance(node, DictConfig):
        schema = OmegaConf.get_type(node)
        if schema is not None and dataclasses.is_dataclass(schema):
            fields = [field.name for field in dataclasses.fields(schema)]
            for key in map(str, node):
                if key not in fields:
                    raise UserError(
                        f"{path}{key}: unknown key; valid keys here: {', '.join(fields)}"
                    )
        for key in map(str, node):  # nodes, not values: no interpolation is resolved here
            _refuse_unknown_keys(node._get_node(key), f"{path}{key}.")
    elif OmegaConf.is_list(node):
        for index in range(len(node)):
            _refuse_unknown_keys(node._get_node(index), f"{path.rstrip('.')}[{index}].")


def show_info(project: Project, overrides: Sequence[str], what: str) -> None:
    """Hydra's ``--info``: the config search path, the defaults list (and tree), the config."""
    from hydra import compose as hydra_compose

    hydra_overrides = _registered(project, overrides, multirun=False)
    shown = "config" if what == "all" else what
    try:
        with _hydra(project) as hydra:
            hydra_compose(project.config_name, overrides=hydra_overrides)  # a mistake: one line
            hydra.show_info(shown, config_name=project.config_name, overrides=hydra_overrides)
    except Exception as exc:
        raise UserError(describe_error(exc)) from None


def _not_an_override(before: str, word: str) -> str:
    """Why ``word`` (no '=') is no override: most often the rest of the value before it,
    split off by the shell at a space."""
    if "=" in before:
        return (
            f"{word!r} is not KEY=VALUE: a value with spaces must be one shell word, "
            f"quoted: '{before} {word} ...'"
        )
    return f"{word!r} is not an override: write KEY=VALUE (+KEY=VALUE to add a key, ~KEY to delete)"


def _registered(project: Project, overrides: Sequence[str], multirun: bool) -> list[str]:
    """Register the schema and the selected sweep and pipeline; the overrides for Hydra."""
    from hydra.core.config_store import ConfigStore

    for before, override in zip(("", *overrides), overrides, strict=False):
        if "=" not in override and not override.startswith("~"):
            raise UserError(_not_an_override(before, override))
        if not override.lstrip("+~").partition("=")[0].strip():  # Hydra: a bare assert
            raise UserError(
                f"{override!r} names no key: write KEY=VALUE (+KEY=VALUE to add a key, "
                "~KEY to delete)"
            )
        if override.lstrip("+~").startswith(("hydra.", "hydra/", "hydra=")):
            raise UserError(
                f"{override}: paiexp composes configs with Hydra but does not use Hydra's own "
                "settings (run dirs, logging, launchers); set job, backend, tracker or sweep keys"
            )
    register_configs()
    if multirun and not any(map(SWEEPS.selection.match, overrides)):
        node = {"sweep": {"name": "multirun"}}
        ConfigStore.instance().store(group="sweep", name=GRID_SWEEP, node=node, package="_global_")
        plain = [o for o in overrides if not o.lstrip("+~").startswith("sweep.")]
        SWEEPS.register(plain, project.sweeps_dir)
        overrides = [f"+sweep={GRID_SWEEP}", *overrides]
    else:
        SWEEPS.register(overrides, project.sweeps_dir)
    PIPELINES.register(overrides, project.pipelines_dir)
    return list(overrides)


@contextmanager
def _hydra(project: Project) -> Iterator[Any]:
    """Hydra initialized as its command line does: the primary config directory, then each
    ``--config-dir`` (provider ``command-line``), then the structured configs (``schema``)."""
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    backup = get_gh_backup()
    version.setbase("1.3")
    search_path = create_config_search_path(str(project.config_dir))
    for directory in project.search_dirs:
        search_path.prepend(
            provider="command-line",
            path=f"file://{directory}",
            anchor=SearchPathQuery(provider="schema"),
        )
    try:
        yield Hydra.create_main_hydra2(task_name="paiexp", config_search_path=search_path)
    finally:
        restore_gh_from_backup(backup)


def to_object(cfg: DictConfig) -> Config:
    """The typed config; fails on missing mandatory values and unresolvable interpolations."""
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        raise UserError(describe_error(exc)) from None
    assert isinstance(obj, Config)
    return obj


def to_container(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain data (what is stored with a run): Enums as their strings."""
    try:
        data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True, enum_to_str=True)
    except OmegaConfBaseException as exc:
        raise UserError(describe_error(exc)) from None
    assert isinstance(data, dict)
    return {str(key): value for key, value in data.items()}


def from_yaml(text: str, overrides: Sequence[str] = ()) -> DictConfig:
    """A stored resolved config, validated against the schema again, with ``key=value`` edits."""
    try:
        loaded = OmegaConf.create(text)
        backend_name = OmegaConf.select(loaded, "backend.name")
        if backend_name not in BACKENDS:
            raise UserError(
                f"backend.name: unknown backend {backend_name!r} in stored config; "
                f"available: {', '.join(BACKENDS)}"
            )
        schema = OmegaConf.structured(Config)
        schema.backend = OmegaConf.structured(BACKENDS[backend_name].schema)
        cfg = OmegaConf.merge(schema, loaded, OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as exc:
        raise UserError(describe_error(exc)) from None
    assert isinstance(cfg, DictConfig)
    return cfg


def describe_error(exc: BaseException) -> str:
    """One line that names the offending key or value and what would be valid."""
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(exc, MissingConfigException):
        missing = exc.missing_cfg_file or ""
        group, _, name = missing.rpartition("/")
        options = ", ".join(exc.options or []) or "none"
        if group:
            return f"{group}={name}: no such config in group '{group}'; available: {options}"
        return f"config '{missing}' not found"
    sweep_override = re.match(r"Sweep parameters '([^=']+)=([^']*)' requires --multirun", str(exc))
    if sweep_override:
        key, value = sweep_override.groups()
        grid = (
            ""
            if key.lstrip("+~").startswith("sweep.")
            else "add -m to run one trial per value, or "
        )
        return (
            f"{key}: {value} is a sweep expression; {grid}quote it so it stays a string: "
            f"'{key}=\"{value}\"' (or write it in sweeps/NAME.yaml)"
        )
    ambiguous = re.match(r"Ambiguous value for argument '([^=']+)=([^']*)'", str(exc))
    if ambiguous:
        key, value = ambiguous.groups()
        if key.lstrip("+~").startswith("sweep.params."):
            search = f"'{key}=\"choice({value})\"'"
            return f"{key}: {value} is ambiguous; to search these values write {search}"
        grid = "" if key.lstrip("+~").startswith("sweep.") else "add -m to run one trial each, "
        return (
            f"{key}: {value} is a comma-separated sweep; {grid}write [{value}] for a list, "
            f"or quote it for a string: '{key}=\"{value}\"'"
        )
    append = re.search(r"To append to your default list use \+(\S+)=(\S+)", str(exc))
    if append:  # e.g. sweep=xgb: a sweep is added to the defaults list, not overridden
        group, name = append.groups()
        return f"{group}={name}: no {group} in the defaults list to override; write +{group}={name}"
    if isinstance(exc, OverrideParseException):
        return f"cannot parse override: {_first_line(str(exc)).split(': ', 1)[-1]}"
    cause = _omegaconf_cause(exc)
    if cause is None:  # a bare assert of Hydra's says nothing: its type, then
        return _first_line(str(exc)) or f"cannot compose the config ({type(exc).__name__})"
    described = _describe_omegaconf(cause)
    overridden = re.search(r"override '([^']+)'", str(exc))
    if overridden and not str(cause.full_key).startswith(overridden.group(1)):
        return f"{overridden.group(1)}: {described}"  # a key inside a list item, say
    return described


def _omegaconf_cause(exc: BaseException) -> OmegaConfBaseException | None:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OmegaConfBaseException) and getattr(seen, "full_key", None):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _describe_omegaconf(exc: OmegaConfBaseException) -> str:
    from omegaconf.errors import (
        ConfigAttributeError,
        ConfigKeyError,
        InterpolationResolutionError,
        MissingMandatoryValue,
        ValidationError,
    )

    key = exc.full_key
    message = _first_line(str(exc))
    if isinstance(exc, MissingMandatoryValue):
        return f"{key}: missing required value (set it in the config or as {key}=...)"
    if isinstance(exc, ConfigAttributeError | ConfigKeyError):
        schema = getattr(exc, "object_type", None)
        if schema is not None and dataclasses.is_dataclass(schema):
            valid = ", ".join(field.name for field in dataclasses.fields(schema))
            return f"{key}: unknown key; valid keys here: {valid}"
        if "not in struct" in message:  # a mapping of the user's names (inputs, ...)
            return f"{key}: no such key yet; a leading + adds one: +{key}=VALUE"
        return f"{key}: {message}"
    if isinstance(exc, ValidationError):
        return _describe_choice(exc) or f"{key}: {message}"
    if isinstance(exc, InterpolationResolutionError):
        return f"{key}: cannot resolve interpolation: {message}"
    return f"{key}: {message}"


def _describe_choice(exc: OmegaConfBaseException) -> str | None:
    """For a key whose schema type is an Enum: the value given and the valid ones."""
    schema = getattr(exc, "object_type", None)
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        return None
    hint = typing.get_type_hints(schema).get(str(getattr(exc, "key", "")))
    kinds = typing.get_args(hint) or (hint,)
    choices = next((t for t in kinds if isinstance(t, type) and issubclass(t, Enum)), None)
    if choices is None:
        return None
    valid = ", ".join(member.name for member in choices)  # OmegaConf matches names
    optional = " or null" if type(None) in kinds else ""
    value = getattr(exc, "value", None)
    return f"{exc.full_key}: invalid value {value!r}; expected one of {valid}{optional}"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
