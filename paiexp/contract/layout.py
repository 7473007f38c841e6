"""The PAI training-job contract: the files and ``PAI_*`` variables a training script sees.

One place for every backend.  The tree is rooted at ``/ml`` on every backend: on PAI and in
a container for real, for a local process in a private mount namespace whose ``/ml`` is its
job directory (:mod:`paiexp.backends.mlroot`; where a machine allows none, the job directory
itself).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePath, PurePosixPath
from typing import Any

ML_ROOT = PurePosixPath("/ml")
OUTPUT_CHANNELS = ("model", "checkpoints", "tensorboard")
OUTPUT_PARAMETERS_CHANNEL = "output_parameters"
# the job's own MLflow store (see paiexp.contract.job_mlflow), an output paiexp reads back like the
# above
MLFLOW_STORE = "paiexp_mlflow"
RESERVED_OUTPUTS = (OUTPUT_PARAMETERS_CHANNEL, MLFLOW_STORE)
CODE_ALIAS = "code"
# paiexp's own addition, not PAI's: in each job of a sweep's trial, the trial's number
TRIAL_VARIABLE = "PAIEXP_TRIAL_NUMBER"
CHANNEL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
HYPERPARAMETER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")

Scalar = str | int | float | bool


def format_value(value: Scalar) -> str:
    """The string form of a hyperparameter value (PAI passes every value as a string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def flatten_hyperparameters(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings become dotted names: ``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_hyperparameters(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


def hyperparameter_env_name(name: str) -> str:
    """``train.learning_rate`` -> ``PAI_HPS_TRAIN_LEARNING_RATE``."""
    return "PAI_HPS_" + re.sub(r"[^A-Za-z0-9_]", "_", name).upper()


def channel_env_name(kind: str, channel: str) -> str:
    """``("INPUT", "train")`` -> ``PAI_INPUT_TRAIN``."""
    return f"PAI_{kind}_{channel.upper()}"


def user_args(hyperparameters: Mapping[str, str]) -> str:
    """``--name value`` per hyperparameter, in order, each value quoted once for the shell."""
    return " ".join(f"--{name} {shlex.quote(value)}" for name, value in hyperparameters.items())


@dataclass(frozen=True)
class JobLayout:
    """The ``/ml`` tree of one job, rooted at ``root`` (``/ml`` itself in a container)."""

    root: PurePath = ML_ROOT

    @property
    def working_dir(self) -> PurePath:
        return self.root / "usercode"

    @property
    def code_alias(self) -> PurePath:
        """``/ml/code``: the older name of the working directory (PAI's CustomJob example
        uses it), the same directory on every backend."""
        return self.root / CODE_ALIAS

    @property
    def config_dir(self) -> PurePath:
        return self.root / "input" / "config"

    @property
    def hyperparameters_file(self) -> PurePath:
        return self.config_dir / "hyperparameters.json"

    def input_dir(self, channel: str) -> PurePath:
        return self.root / "input" / "data" / channel

    def output_dir(self, channel: str) -> PurePath:
        return self.root / "output" / channel

    @property
    def output_parameters_dir(self) -> PurePath:
        return self.output_dir(OUTPUT_PARAMETERS_CHANNEL)

    @property
    def mlflow_store(self) -> PurePath:
        """The job's own MLflow file store: made by its MLflow (as a directory MLflow finds
        there, it would hold no default experiment), in a directory of paiexp's."""
        return self.output_dir(MLFLOW_STORE) / "mlruns"


def hyperparameters_json(hyperparameters: Mapping[str, str]) -> str:
    """The content of ``hyperparameters.json``: one object, every value a string."""
    return json.dumps(dict(hyperparameters), indent=2)


def environment(
    layout: JobLayout,
    hyperparameters: Mapping[str, str],
    inputs: Mapping[str, str | None],
    outputs: Iterable[str],
) -> dict[str, str]:
    """Every ``PAI_*`` variable of the contract.

    ``inputs`` maps a channel to the file name inside its directory when the channel names a
    single object (``PAI_INPUT_X`` then points at the file), or to ``None`` for a directory.
    """
    env = {
        "PAI_WORKING_DIR": str(layout.working_dir),
        "PAI_CONFIG_DIR": str(layout.config_dir),
        "PAI_HPS": json.dumps(dict(hyperparameters)),
        "PAI_USER_ARGS": user_args(hyperparameters),
    }
    for name, value in hyperparameters.items():
        env[hyperparameter_env_name(name)] = value
    for channel, file_name in inputs.items():
        directory = layout.input_dir(channel)
        env[channel_env_name("INPUT", channel)] = str(
            directory / file_name if file_name else directory
        )
    for channel in outputs:
        env[channel_env_name("OUTPUT", channel)] = str(layout.output_dir(channel))
    return env
