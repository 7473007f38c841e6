"""Unit tests of paiexp.contract.layout: the PAI_* variables and the /ml tree a training script
sees."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from paiexp.contract import layout as contract
from paiexp.contract.layout import (
    OUTPUT_CHANNELS,
    JobLayout,
    environment,
    flatten_hyperparameters,
    format_value,
    hyperparameters_json,
    user_args,
)

DOC_HPS = {"epochs": "10", "batch-size": "32", "train.learning_rate": "0.001"}
AWKWARD_VALUES = ["a b", "it's", 'say "hi"', "$HOME", "", "back\\slash", "semi;colon", "*"]


def awkward_hps() -> dict[str, str]:
    return {f"k{i}": value for i, value in enumerate(AWKWARD_VALUES, start=1)}


def expected_argv(hps: dict[str, str]) -> list[str]:
    argv: list[str] = []
    for name, value in hps.items():
        argv += [f"--{name}", value]
    return argv


def sh_argv(args: str) -> list[str]:
    """The argv sh builds from ``args`` when it evaluates them as shell words."""
    script = 'eval "set -- $PAI_USER_ARGS"; for a; do printf "%s\\n" "$a"; done'
    done = subprocess.run(
        ["sh", "-c", script],
        env={"PAI_USER_ARGS": args, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return done.stdout.split("\n")[:-1]


# -- hyperparameter environment names -------------------------------------------------------


def test_environment_hyperparameter_variables_documented_example() -> None:
    env = environment(JobLayout(), DOC_HPS, {}, [])
    assert env["PAI_HPS_EPOCHS"] == "10"
    assert env["PAI_HPS_BATCH_SIZE"] == "32"
    assert env["PAI_HPS_TRAIN_LEARNING_RATE"] == "0.001"
    assert json.loads(env["PAI_HPS"]) == DOC_HPS
    assert env["PAI_USER_ARGS"] == user_args(DOC_HPS)


@pytest.mark.parametrize(
    ("name", "env_name"),
    [
        ("epochs", "PAI_HPS_EPOCHS"),
        ("batch-size", "PAI_HPS_BATCH_SIZE"),
        ("train.learning_rate", "PAI_HPS_TRAIN_LEARNING_RATE"),
        ("Mixed.Case-name_1", "PAI_HPS_MIXED_CASE_NAME_1"),
    ],
)
def test_hyperparameter_env_name(name: str, env_name: str) -> None:
    assert contract.hyperparameter_env_name(name) == env_name


def test_environment_has_only_contract_variables() -> None:
    env = environment(JobLayout(), DOC_HPS, {"train": "train.csv"}, OUTPUT_CHANNELS)
    assert all(name.startswith("PAI_") for name in env)
    assert all(isinstance(value, str) for value in env.values())


# -- PAI_USER_ARGS ---------------------------------------------------------------------------


def test_user_args_documented_example_keeps_order() -> None:
    hps = {"epochs": "10", "batch-size": "32", "learning-rate": "0.001"}
    assert user_args(hps) == "--epochs 10 --batch-size 32 --learning-rate 0.001"


def test_user_args_keeps_dotted_name() -> None:
    assert user_args({"train.learning_rate": "0.001"}) == "--train.learning_rate 0.001"


def test_user_args_order_is_insertion_order() -> None:
    hps = {"z": "1", "a": "2", "m": "3"}
    assert user_args(hps) == "--z 1 --a 2 --m 3"


def test_user_args_empty() -> None:
    assert user_args({}) == ""


def test_user_args_awkward_values_round_trip_through_shlex() -> None:
    hps = awkward_hps()
    assert shlex.split(user_args(hps)) == expected_argv(hps)


@pytest.mark.parametrize("value", AWKWARD_VALUES)
def test_user_args_quotes_each_value_exactly_once(value: str) -> None:
    # Quoted once: one shell parse yields the raw value, not a still-quoted string.
    assert shlex.split(user_args({"k": value})) == ["--k", value]


def test_user_args_awkward_values_round_trip_through_real_sh() -> None:
    hps = awkward_hps()
    assert sh_argv(user_args(hps)) == expected_argv(hps)


def test_environment_user_args_round_trip_through_real_sh() -> None:
    hps = {**DOC_HPS, **awkward_hps()}
    env = environment(JobLayout(), hps, {}, [])
    assert sh_argv(env["PAI_USER_ARGS"]) == expected_argv(hps)


# -- values and nesting ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [(True, "true"), (False, "false"), (3, "3"), (0.001, "0.001"), ("x", "x")],
    ids=["true", "false", "int", "float", "str"],
)
def test_format_value(value: contract.Scalar, text: str) -> None:
    assert format_value(value) == text


def test_flatten_hyperparameters_nested() -> None:
    tree = {"a": 1, "train": {"lr": 0.1, "opt": {"beta": 0.9}}}
    assert flatten_hyperparameters(tree) == {"a": 1, "train.lr": 0.1, "train.opt.beta": 0.9}


def test_flatten_hyperparameters_flat_is_unchanged() -> None:
    tree = {"a": 1, "b": "x", "c": True}
    assert flatten_hyperparameters(tree) == tree


# -- the /ml tree --------------------------------------------------------------------------


def test_environment_paths_rooted_at_ml() -> None:
    env = environment(JobLayout(), {}, {"train": "train.csv", "data": None}, OUTPUT_CHANNELS)
    assert env["PAI_INPUT_TRAIN"] == "/ml/input/data/train/train.csv"
    assert env["PAI_INPUT_DATA"] == "/ml/input/data/data"
    assert env["PAI_OUTPUT_MODEL"] == "/ml/output/model"
    assert env["PAI_OUTPUT_CHECKPOINTS"] == "/ml/output/checkpoints"
    assert env["PAI_OUTPUT_TENSORBOARD"] == "/ml/output/tensorboard"
    assert env["PAI_WORKING_DIR"] == "/ml/usercode"
    assert env["PAI_CONFIG_DIR"] == "/ml/input/config"


def test_environment_paths_rooted_at_job_directory(tmp_path: Path) -> None:
    env = environment(
        JobLayout(tmp_path), {}, {"train": "train.csv", "data": None}, OUTPUT_CHANNELS
    )
    assert env["PAI_INPUT_TRAIN"] == str(tmp_path / "input" / "data" / "train" / "train.csv")
    assert env["PAI_INPUT_DATA"] == str(tmp_path / "input" / "data" / "data")
    for channel in OUTPUT_CHANNELS:
        assert env[f"PAI_OUTPUT_{channel.upper()}"] == str(tmp_path / "output" / channel)
    assert env["PAI_WORKING_DIR"] == str(tmp_path / "usercode")
    assert env["PAI_CONFIG_DIR"] == str(tmp_path / "input" / "config")


def test_environment_extra_output_channel() -> None:
    env = environment(JobLayout(), {}, {}, [*OUTPUT_CHANNELS, "extra"])
    assert env["PAI_OUTPUT_EXTRA"] == "/ml/output/extra"


def test_layout_files_rooted_at_ml() -> None:
    layout = JobLayout()
    assert str(layout.hyperparameters_file) == "/ml/input/config/hyperparameters.json"
    assert str(layout.output_parameters_dir) == "/ml/output/output_parameters"
    assert str(layout.input_dir("test")) == "/ml/input/data/test"


# -- hyperparameters.json ------------------------------------------------------------------


def test_hyperparameters_json_is_object_of_strings() -> None:
    data = json.loads(hyperparameters_json(DOC_HPS))
    assert data == DOC_HPS
    assert isinstance(data, dict)
    assert all(isinstance(value, str) for value in data.values())


def test_hyperparameters_json_keeps_order_and_awkward_values() -> None:
    hps = awkward_hps()
    data = json.loads(hyperparameters_json(hps))
    assert list(data.items()) == list(hps.items())
