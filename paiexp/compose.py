"""Config composition with Hydra, and Hydra's and OmegaConf's errors turned into one line.

The project is the directory holding ``conf/`` (the current directory unless ``--config-dir``
says otherwise); relative paths in its configs are taken from there.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from paiexp.config import BACKENDS, Config, register_configs
from paiexp.errors import UserError
from paiexp.pipeline.registry import register_selected_pipeline
from paiexp.sweep.registry import register_selected_sweep

CONFIG_NAME = "config"


@dataclass(frozen=True)
class Project:
    config_dir: Path
    config_name: str = CONFIG_NAME

    @property
    def base_dir(self) -> Path:
        return self.config_dir.parent

    @property
    def sweeps_dir(self) -> Path:
        return self.base_dir / "sweeps"

    @property
    def pipelines_dir(self) -> Path:
        return self.base_dir / "pipelines"


def locate_project(config_dir: str | None = None, config_name: str = CONFIG_NAME) -> Project:
    # absolute but not resolved: a symlinked conf/ keeps the project where it is linked
    path = Path(os.path.abspath(config_dir or "conf"))
    if not (path / f"{config_name}.yaml").is_file():
        raise UserError(
            f"no {config_name}.yaml in {path}: run paiexp from a project directory holding "
            "conf/, pass --config-dir DIR, or create a starter project with `paiexp init`"
        )
    return Project(config_dir=path, config_name=config_name)


def compose(project: Project, overrides: Sequence[str]) -> DictConfig:
    """Compose the project's config with command-line overrides (Hydra's grammar)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    for override in overrides:
        if override.lstrip("+~").startswith(("hydra.", "hydra/", "hydra=")):
            raise UserError(
                f"{override}: paiexp composes configs with Hydra but does not use Hydra's own "
                "settings (run dirs, logging, launchers); set job, backend, tracker or sweep keys"
            )
    register_configs()
    register_selected_sweep(overrides, project.sweeps_dir)
    register_selected_pipeline(overrides, project.pipelines_dir)
    try:
        with initialize_config_dir(str(project.config_dir), version_base="1.3"):
            cfg = hydra_compose(project.config_name, overrides=list(overrides))
    except Exception as exc:  # Hydra raises many types; each becomes one line
        raise UserError(describe_error(exc)) from None
    return cfg


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
        return (
            f"{key}: {value} is a sweep expression; quote it so it stays a string: "
            f"'{key}=\"{value}\"' (or write it in sweeps/NAME.yaml)"
        )
    if isinstance(exc, OverrideParseException):
        return f"cannot parse override: {_first_line(str(exc)).split(': ', 1)[-1]}"
    cause = _omegaconf_cause(exc)
    if cause is None:
        return _first_line(str(exc))
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
