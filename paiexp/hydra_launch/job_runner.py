"""Runs one job of a Hydra multirun where a paiexp job runs, and writes what Hydra's launcher
contract needs back (the task's return value, or its exception) into the job's ``hydra``
output channel.

It needs Hydra, as the app does, and cloudpickle for a task function shipped by value; never
paiexp (PAI's images do not have it): it is copied into the job's ``hydra`` input channel and
run as ``python job_runner.py JOB.json``.  Two ways to run the job:

- ``app``: the app itself again (its script, its module, or its decorated function in an
  importable module), in Hydra's run mode with the job's overrides and output directory, as
  ``python my_app.py OVERRIDES`` would; any Python that runs the app runs it.
- ``function``: a task function that is not an app's entry point (a closure, a callable object),
  unpickled with the job's composed config and Hydra's state, and run by Hydra's ``run_job`` as
  its basic launcher runs it; the job's Python must be the launcher's version.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

RESULT_FILE = "result.pkl"
WORKDIR = "workdir"  # under the output channel: the job's output directory on a remote backend
OUTPUT_VARIABLE = "PAI_OUTPUT_HYDRA"
TRIAL_VARIABLE = "PAIEXP_TRIAL_NUMBER"  # set by paiexp's sweeps in each trial's job
REPORT_PREFIX = "paiexp-hydra: "  # a trial's objective values, as log lines


def main(argv: list[str]) -> int:
    job_file = Path(argv[1]).absolute()  # before the job changes its working directory
    job = json.loads(job_file.read_text(encoding="utf-8"))
    output = Path(os.environ[OUTPUT_VARIABLE])
    job["code_dir"] = os.getcwd()  # the job's code: where the backend starts its command
    if job["cwd"]:
        os.chdir(job["cwd"])
    if "objectives" in job:  # a trial of a sweep: its number and its point from paiexp
        _as_trial(job)
    run_dir = job["run_dir"] or str(output / WORKDIR)
    outcome: dict[str, Any] | None
    returned: list[Any] = []
    try:
        if job["mode"] == "function":
            outcome = _outcome(_run_function(job_file.parent / job["payload"], run_dir, job))
        else:
            outcome = _run_app(job, run_dir, returned)
    except (
        BaseException
    ) as exc:  # the app's own failure outside its task (its import, Hydra's checks)
        _write(output, _failure(exc, "the app failed before its task ran"))
        raise
    if outcome is None:
        _write(output, _failure(None, "the app ran no Hydra task (is it a @hydra.main app?)"))
        return 1
    if job.get("objectives") and outcome["status"] == "COMPLETED":
        refusal = _report(returned[-1], job["objectives"])
        if refusal is not None:
            print(f"paiexp: error: {refusal}", file=sys.stderr, flush=True)
            outcome = _failure(None, refusal)
    _write(output, outcome)
    return 0 if outcome["status"] == "COMPLETED" else 1


def _as_trial(job: dict[str, Any]) -> None:
    """A sweep's trial: Hydra's job number is the trial's, its directory the trial's under
    the sweep's (where it runs on this host), its point the app's overrides, as
    hydra-optuna-sweeper writes them (``name=value``)."""
    number = int(os.environ.get(TRIAL_VARIABLE, "0"))
    job["num"] = number
    job["id"] = str(number)
    if job["sweep_dir"]:
        job["run_dir"] = str(Path(job["sweep_dir"], str(number)))
    point = json.loads(os.environ.get("PAI_HPS", "{}"))
    searched = set(job["searched"])  # the rest were drawn by the app's custom search space:
    job["overrides"] = [  # set where its config has them, added where not
        *job["overrides"],
        *(f"{'' if name in searched else '++'}{name}={value}" for name, value in point.items()),
    ]


def _report(value: Any, names: list[str]) -> str | None:
    """The task's return value as the log lines paiexp reads each objective from (one per
    direction); why not, when it is no number or not one per direction."""
    try:
        values = [float(value)] if len(names) == 1 else [float(each) for each in value]
    except (TypeError, ValueError):
        wanted = "a number" if len(names) == 1 else f"a sequence of {len(names)} numbers"
        return f"the task returned {value!r}; the sweep needs {wanted} (one per direction)"
    if len(values) != len(names):
        return (
            f"the task returned {len(values)} values for {len(names)} directions "
            "(hydra.sweeper.direction)"
        )
    for name, number in zip(names, values, strict=True):
        print(f"{REPORT_PREFIX}{name}={number!r}", flush=True)
    return None


def _run_function(payload: Path, run_dir: str, job: dict[str, Any]) -> Any:
    """The pickled task function run by Hydra's ``run_job``, as Hydra's basic launcher runs it."""
    from hydra.core.singleton import Singleton
    from hydra.core.utils import run_job, setup_globals
    from omegaconf import open_dict, read_write

    sys.path.insert(0, job["code_dir"])
    with payload.open("rb") as stream:
        task_function, config, hydra_context, singleton_state = pickle.load(stream)
    setup_globals()
    version_base = singleton_state.pop("paiexp_version_base")
    Singleton.set_state(singleton_state)
    if version_base is not None:
        from hydra.version import Version, VersionBase

        VersionBase.instance().setbase(Version(version_base))
    if job["run_dir"] is None:  # on a remote backend: the output channel, its own cwd
        with read_write(config.hydra), open_dict(config.hydra):
            config.hydra.sweep.dir = run_dir
            config.hydra.sweep.subdir = "."
            config.hydra.runtime.cwd = os.getcwd()
    return run_job(
        hydra_context=hydra_context,
        task_function=task_function,
        config=config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


def _run_app(job: dict[str, Any], run_dir: str, returned: list[Any]) -> dict[str, Any] | None:
    """The app run again in Hydra's run mode; its job's outcome caught on its way out of
    Hydra's ``run_job`` (None: the app ran none), its return value added to ``returned``."""
    import hydra._internal.hydra as hydra_internals
    import hydra.core.utils as hydra_utils

    _register_stubs(job["stubs"])
    caught: list[Any] = []
    run_job = hydra_utils.run_job

    def catching(*args: Any, **kwargs: Any) -> Any:
        ret = run_job(*args, **kwargs)
        caught.append(_outcome(ret))  # now, while the app is __main__: its classes pickle
        returned.append(ret._return_value)
        return ret

    hydra_internals.run_job = hydra_utils.run_job = catching
    entry = job["entry"]
    arguments = [
        *job["overrides"],
        *job["hydra_overrides"],
        f"hydra.run.dir={_quoted(run_dir)}",
        f"hydra.job.num={job['num']}",
        f"hydra.job.id={job['id']}",
    ]
    script = Path(job["code_dir"], entry["script"]) if entry["script"] else None
    sys.argv = [str(script) if script else entry["module"], *arguments]
    sys.path.insert(0, str(script.parent) if script else job["code_dir"])
    try:
        if script is not None:
            runpy.run_path(str(script), run_name="__main__")
        elif entry["function"] is None:
            runpy.run_module(entry["module"], run_name="__main__", alter_sys=True)
        else:
            getattr(importlib.import_module(entry["module"]), entry["function"])()
    except SystemExit:
        if not caught:  # Hydra refused the job (a bad override): that is the job's outcome
            raise
    return caught[-1] if caught else None


def _register_stubs(stubs: dict[str, dict[str, Any]]) -> None:
    """Config nodes for ``hydra/launcher=paiexp``, ``hydra/sweeper=paiexp`` and its samplers:
    an app whose defaults select them composes where paiexp is not installed (run mode uses
    none of them)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for group, nodes in stubs.items():
        for name, node in nodes.items():
            store.store(group=group, name=name, node=node, provider="paiexp")


def _quoted(value: str) -> str:
    """``value`` as a quoted string of Hydra's override grammar."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _outcome(ret: Any) -> dict[str, Any]:
    """What the launcher needs of a :class:`JobReturn`: its status, its return value or
    exception (pickled as such where that works, else described), and its task's name."""
    from hydra.core.utils import JobRuntime

    completed = ret.status.name == "COMPLETED"
    value = ret._return_value
    outcome: dict[str, Any] = {
        "status": ret.status.name,
        "task_name": ret.task_name or JobRuntime.instance().get("name"),
    }
    if completed:
        outcome.update(_pickled("value", value))
    else:
        outcome.update(_described(value))
        outcome.update(_pickled("exception", value))
    return outcome


def _failure(exc: BaseException | None, what: str) -> dict[str, Any]:
    outcome: dict[str, Any] = {"status": "FAILED", "task_name": None, "what": what}
    if exc is not None:
        outcome.update(_described(exc))
    return outcome


def _described(exc: BaseException) -> dict[str, Any]:
    return {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }


def _pickled(key: str, value: Any) -> dict[str, Any]:
    """``{key: pickle}``, or ``{key + "_repr": repr}`` when ``value`` does not pickle."""
    try:
        return {key: pickle.dumps(value)}
    except Exception:  # an object of the job's world only: its repr is what there is
        return {f"{key}_repr": repr(value)}


def _write(output: Path, outcome: dict[str, Any]) -> None:
    output.mkdir(parents=True, exist_ok=True)
    partial = output / f".{RESULT_FILE}.partial"
    partial.write_bytes(pickle.dumps(outcome))
    os.replace(partial, output / RESULT_FILE)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
