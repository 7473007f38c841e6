"""Property-based fuzzing (Hypothesis) of the command line and of ``paiexp.job(...)``.

Overrides and keyword values are drawn from the real keys (the schema's dataclasses, the
composed project config, its config groups, sweeps and pipelines) and from hostile values:
empty, null, huge, NaN, type-mismatched, unbalanced brackets, interpolations (broken ones
too), paths out of the project, non-ASCII and control characters, URIs of every scheme.

The contract: the command line exits 0, 1 or 2, never with a traceback, and a refusal (exit
2) is one ``paiexp: error:`` line that wrote nothing (one still running after PATIENCE
seconds, a long sweep it asked for, stops at a Ctrl-C: exit 130); ``paiexp.job(...)`` returns
a composed job or raises ``paiexp.ConfigError`` with a one-line message, having written
nothing.  Nothing drawn reaches the network, a Docker engine or PyPI (``HERMETIC``).

CI runs a fixed seed and a bounded number of examples. ``PAIEXP_FUZZ_EXAMPLES=N`` runs N
command lines and 10 N API calls instead (a longer run, with a fresh seed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import typing
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ERROR_PREFIX, REPO, assert_one_line_error, clean_env
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

import paiexp
from paiexp.config.schema import BACKENDS, Config, JobConfig, TrackerConfig

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

LONG_RUN = os.environ.get("PAIEXP_FUZZ_EXAMPLES")
CLI_EXAMPLES = int(LONG_RUN or 40)
API_EXAMPLES = 10 * int(LONG_RUN) if LONG_RUN else 300
# No deadline (a command line takes a second or more, a valid one runs a job); no example
# database: CI replays the same fixed-seed examples every time.
FUZZ = settings(deadline=None, derandomize=not LONG_RUN, database=None, print_blob=True)

HUGE = 30_000  # characters of a huge value: under the 128 KiB an argument may hold in UTF-8
# In a drawn value: the example's own directory (an absolute path that stays in the sandbox).
SANDBOX = "@SANDBOX@"
PATIENCE = 60.0  # seconds a command line runs before it gets a Ctrl-C
DEAD_PROXY = "http://127.0.0.1:9"
# Nothing drawn reaches the network, a Docker engine or PyPI: whatever a job or a check would
# fetch fails at once, as it would on a machine without them.
HERMETIC = {
    "DOCKER_HOST": "unix:///nonexistent/paiexp-fuzz-docker.sock",
    "HTTP_PROXY": DEAD_PROXY,
    "HTTPS_PROXY": DEAD_PROXY,
    "ALL_PROXY": DEAD_PROXY,
    "http_proxy": DEAD_PROXY,
    "https_proxy": DEAD_PROXY,
    "NO_PROXY": "",
    "no_proxy": "",
    "PIP_NO_INDEX": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "ALIBABA_CLOUD_ECS_METADATA_DISABLED": "true",
}

URI_SCHEMES = (
    "file://", "file:", "s3://", "oss://", "http://", "https://", "ftp://", "sqlite://",
    "sqlite:///", "sqlite:////", "postgresql://", "postgresql+psycopg://", "mysql://",
    "mssql://", "mlflow-artifacts:/", "models:/", "runs:/", "databricks://", "uc:",
    "pai://", "hdfs://", "gs://", "wasbs://", "data:", "javascript:", "docker://",
)  # fmt: skip

HOSTILE = (
    # empty, null, types
    "", " ", "''", '""', "null", "NULL", "~", "None", "true", "false", "0", "-1", "1.5",
    "[]", "{}", "[1,2]", "{a: 1}", "[null]", "{name: x, regex: 'x=(1)'}",
    # huge and not a number
    "9" * 400, "1e308", "-1e308", "1e999", str(2**63), str(-(2**63) - 1), "nan", "NaN",
    "inf", "-inf", "0x10", "1_000",
    # unbalanced and grammar
    "[", "]", "{", "}", "(", ")", "[1,2", "{a:", "'", '"', "'unterminated", "a,b",
    "interval(0,1)", "choice(a,b)", "range(1,3)", "range(1,", "glob(*)", "=", "==", "\\",
    "a b", "a=b", "#", "@", "%", "*", "&anchor", "!!python/object:os.system",
    # interpolations
    "${job.name}", "${job.nope}", "${oc.env:HOME}", "${oc.env:PAIEXP_FUZZ_UNSET}", "${",
    "${}", "${job.name", "${oc.decode:'[1'}", "${now:%Y}", "${hydra:runtime.cwd}",
    "${..name}", "${oc.select:job.name,x}", "\\${job.name}", "$PAI_USER_ARGS", "$(true)",
    # paths out of the project
    ".", "..", "../..", "../../outside", "a/../../..", "./", "~/x", "/", "/proc/paiexp-fuzz/x",
    "/proc/version", f"{SANDBOX}/missing", f"{SANDBOX}/a", "conf", "conf/config.yaml",
    # non-ASCII and control characters
    "é", "日本語", "😀", "\u202e", "\u200b", "a\u0301", "\t", "\n", "a\nb", "\r", "\x1b[31m",
    "\x7f", "\x01", "\udcff",
    # URIs
    "pai", "./pai", "pai://x", "file:///proc/paiexp-fuzz", f"file://{SANDBOX}/x", "file:x",
    "s3://bucket/key", "oss://bucket/key", "oss://B", "oss://", "oss://bucket/../x",
    "http://", "http://localhost:1", "https://[::1", "HTTP://LOCALHOST:1/x",
    "ftp://host/x", "sqlite://", "sqlite:///:memory:", "sqlite:///x.db",
    f"sqlite:///{SANDBOX}/nested/dir/x.db", "sqlite:////proc/paiexp-fuzz/x.db",
    "sqlite:///conf/config.yaml", "sqlite:///.", "sqlitex:///x.db", "sqlite+aiosqlite:///x.db",
    "postgresql://u:secret@localhost:1/db", "postgresql+nodriver://h/db", "postgresql://",
    "mysql://u@localhost:1/db", "mssql://u@localhost/db", "databricks", "databricks-uc", "uc",
    "mlflow-artifacts:/x", "models:/m/1", "runs:/abc/model", "gopher://x", "data:,x",
)  # fmt: skip


# -- the project every example runs in ------------------------------------------------------

FUZZ_JOB = {  # a job that takes no time whatever it is given
    "name": "fuzz",
    "command": "python job.py",
    "source_dir": "code",
    "hyperparameters": {"x": 0.5},
    "metric_definitions": [{"name": "score", "regex": r"score=([-+0-9.eE]+)"}],
    "max_run_time": 60,
}


def fuzz_project(root: Path) -> Path:
    """The repository's conf/, sweeps/ and pipelines/ (their real keys and options) whose
    default job is a trivial one, without examples/: a valid command line runs in seconds,
    and a drawn real job (job=xgb, +sweep=xgb, ...) lacks its data and is refused.  The
    project lies three directories down ``root``, so that ``../..`` stays in the sandbox."""
    project = root / "a" / "b" / "c" / "project"
    for name in ("conf", "sweeps", "pipelines"):
        shutil.copytree(REPO / name, project / name)
    (project / "conf" / "job" / "fuzz.yaml").write_text(yaml.safe_dump(FUZZ_JOB))
    config = yaml.safe_load((project / "conf" / "config.yaml").read_text())
    config["defaults"] = [{"job": "fuzz"} if d == {"job": "xgb"} else d for d in config["defaults"]]
    (project / "conf" / "config.yaml").write_text(yaml.safe_dump(config))
    sweep = {"objective": {"metric": "score", "direction": "minimize"}, "n_trials": 1}
    sweep["params"] = {"x": "interval(0, 1)"}
    (project / "sweeps" / "fuzz.yaml").write_text(yaml.safe_dump({"sweep": sweep}))
    (project / "code").mkdir()
    (project / "code" / "job.py").write_text("print('score=0.25')\n")
    return project


@contextmanager
def sandbox(base: Path) -> Iterator[Path]:
    """A fresh copy of the fuzz project's sandbox (``base``), removed afterwards."""
    root = Path(tempfile.mkdtemp(dir=base.parent))
    try:
        shutil.copytree(base, root, dirs_exist_ok=True)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def project_of(root: Path) -> Path:
    return root / "a" / "b" / "c" / "project"


def tree(root: Path) -> set[str]:
    """Every path under ``root``: what an example wrote is the difference."""
    return {str(path.relative_to(root)) for path in root.rglob("*")}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz") / "base"
    fuzz_project(root)
    return root


# -- the real keys ----------------------------------------------------------------------------


def schema_keys(schema: type, prefix: str) -> Iterator[tuple[str, Any]]:
    """Every key of a dataclass schema, the nested ones too, with its type."""
    hints = typing.get_type_hints(schema)
    for field in dataclasses.fields(schema):
        key = f"{prefix}{field.name}"
        yield key, hints[field.name]
        for kind in typing.get_args(hints[field.name]) or (hints[field.name],):
            if dataclasses.is_dataclass(kind):
                yield from schema_keys(kind, f"{key}.")


def config_keys(project: Path) -> dict[str, Any]:
    """The keys of the schema (each backend's) and of the project's composed config, each
    with its schema type (Any for a key only the config has, a hyperparameter say)."""
    from omegaconf import OmegaConf

    from paiexp.config.compose import compose, locate_project

    keys: dict[str, Any] = {}
    composed = OmegaConf.to_container(compose(locate_project(str(project / "conf")), []))

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, Mapping):
            for name, child in node.items():
                keys[f"{prefix}{name}"] = Any
                walk(child, f"{prefix}{name}.")

    walk(composed, "")
    schemas = [schema_keys(Config, "")]
    schemas += [schema_keys(kind.schema, "backend.") for kind in BACKENDS.values()]
    for key, hint in itertools.chain(*schemas):
        known = keys.get(key, Any)
        keys[key] = hint if known is Any else known | hint  # backends type a key alike or not
    return dict(sorted(keys.items()))


def group_choices(project: Path) -> list[str]:
    """Every config group's options, and the project's sweeps and pipelines."""
    conf = project / "conf"
    choices = [
        f"{group.name}={option.stem}"
        for group in sorted(conf.iterdir())
        if group.is_dir()
        for option in sorted(group.glob("*.yaml"))
    ]
    for group in ("sweep", "pipeline"):
        choices += [f"+{group}={p.stem}" for p in sorted((project / f"{group}s").glob("*.yaml"))]
    return choices


PROJECT_TEMPLATE = fuzz_project(Path(tempfile.mkdtemp(prefix="paiexp-fuzz-keys-")))
KEYS = config_keys(PROJECT_TEMPLATE)
CHOICES = group_choices(PROJECT_TEMPLATE)
shutil.rmtree(PROJECT_TEMPLATE.parents[3])


# -- strategies ---------------------------------------------------------------------------------


def texts(*, nul: bool) -> st.SearchStrategy[str]:
    """Short text of any characters (NUL only where it can be passed: not in argv)."""
    excluded = "" if nul else "\x00"
    return st.text(st.characters(exclude_characters=excluded), max_size=24)


def hostile_strings(*, nul: bool) -> st.SearchStrategy[str]:
    text = texts(nul=nul)
    return st.one_of(
        st.sampled_from(HOSTILE),
        text,
        st.integers().map(str),
        st.floats().map(repr),
        st.tuples(st.sampled_from(URI_SCHEMES), text).map("".join),
        st.tuples(st.sampled_from(HOSTILE), text).map("".join),
        st.sampled_from(("a", "é", "/", "[", "$", "9")).map(lambda c: c * HUGE),
        *([st.just("\x00"), st.just("a\x00b")] if nul else []),
    )


def typed(hint: Any) -> st.SearchStrategy[str]:
    """Values of a key's own type at their edges (they pass composition and reach the checks
    behind it), or any hostile value."""
    kinds = [kind for kind in typing.get_args(hint) or (hint,) if kind is not type(None)]
    edges: list[st.SearchStrategy[str]] = [CLI_VALUES]
    if float in kinds:
        edges.append(st.sampled_from(FLOAT_EDGES) | st.floats().map(repr))
    if int in kinds:
        edges.append(st.sampled_from(INT_EDGES) | st.integers().map(str))
    if bool in kinds:
        edges.append(st.sampled_from(("true", "false", "True", "yes", "1", "maybe")))
    for kind in kinds:
        if isinstance(kind, type) and issubclass(kind, Enum):
            names = [member.name for member in kind]
            edges.append(st.sampled_from([*names, *(name.upper() for name in names), "nope"]))
    return st.one_of(*edges)


FLOAT_EDGES = ("nan", "inf", "-inf", "1e308", "-0.0", "0", "5e-324", "0.001", "9223372037")
INT_EDGES = ("0", "-1", "1", "2", str(2**31), str(2**63), "99999999999999999999")
CLI_VALUES = hostile_strings(nul=False)
CLI_KEYS = st.one_of(
    st.sampled_from(list(KEYS)),
    st.tuples(st.sampled_from(list(KEYS)), texts(nul=False)).map(".".join),  # a real key's child
    texts(nul=False),
)


def typed_overrides(keys: list[str]) -> st.SearchStrategy[str]:
    """``KEY=VALUE`` with a value of the key's own type at its edges."""
    return st.sampled_from(keys).flatmap(
        lambda key: typed(KEYS[key]).map(lambda value: f"{key}={value}")
    )


TYPED = typed_overrides(list(KEYS))
OVERRIDES = st.one_of(
    st.sampled_from(CHOICES),
    TYPED,
    st.tuples(st.sampled_from(("", "+", "++")), CLI_KEYS, CLI_VALUES).map(
        lambda drawn: f"{drawn[0]}{drawn[1]}={drawn[2]}"
    ),
    CLI_KEYS.map(lambda key: f"~{key}"),
    st.tuples(st.sampled_from(CHOICES), CLI_VALUES).map(
        lambda drawn: f"{drawn[0].partition('=')[0]}={drawn[1]}"  # a group, a hostile option
    ),
)
COMMAND_LINES = st.one_of(
    st.lists(OVERRIDES, min_size=1, max_size=3),
    st.lists(TYPED, min_size=1, max_size=2),  # more of these compose, reach the checks, run
    st.lists(  # the project's sweep and its keys: the sweep's own checks, and a run of it
        typed_overrides([key for key in KEYS if key.startswith("sweep.")]), max_size=2
    ).map(lambda overrides: ["+sweep=fuzz", *overrides]),
)


# -- the command line -----------------------------------------------------------------------


def in_sandbox(argv: list[str], root: Path) -> list[str]:
    return [arg.replace(SANDBOX, str(root)) for arg in argv]


def run_stopped(cwd: Path, argv: list[str]) -> tuple[subprocess.CompletedProcess[str], bool]:
    """``python -m paiexp -q ARGV``, and whether it had to be stopped: a command line that
    still runs after PATIENCE seconds (a valid one may ask for a long sweep) gets a Ctrl-C,
    as a person at a terminal stops it (SIGINT to its process group)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "paiexp", "-q", *argv],
        cwd=cwd,
        env=clean_env(**HERMETIC),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    stopped = False
    try:
        try:
            stdout, stderr = process.communicate(timeout=PATIENCE)
        except subprocess.TimeoutExpired:
            stopped = True
            os.killpg(process.pid, signal.SIGINT)
            stdout, stderr = process.communicate(timeout=PATIENCE)
    finally:
        if process.poll() is None:  # it did not stop: the test fails, and it ends here
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), stopped


def check_command_line(done: subprocess.CompletedProcess[str], written: set[str]) -> None:
    """Exit 0, 1 or 2, never a traceback; a refusal is one error line and wrote nothing."""
    lines = (done.stdout + done.stderr).splitlines()
    assert not [line for line in lines if line.startswith("Traceback")], done.stderr
    assert done.returncode in (0, 1, 2), done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith(ERROR_PREFIX)]
    if done.returncode == 2:
        assert_one_line_error(done)
        assert not written, f"a refused command wrote {sorted(written)}"
    elif errors:  # exit 1 saying why: one line, the last
        assert len(errors) == 1 and done.stderr.splitlines()[-1] == errors[0], done.stderr


def check_stopped(done: subprocess.CompletedProcess[str]) -> None:
    """A command line stopped by Ctrl-C was running what it was asked to, and stopped as
    Ctrl-C stops it: exit code 130, no traceback."""
    assert not [line for line in done.stderr.splitlines() if line.startswith("Traceback")]
    assert done.returncode == 130, done.stderr
    assert "[paiexp]" in done.stderr, f"it ran {PATIENCE} s before starting anything"


@pytest.mark.timeout(3600 if LONG_RUN else 900)
@settings(FUZZ, max_examples=CLI_EXAMPLES)
@given(argv=COMMAND_LINES)
def test_command_line(base: Path, argv: list[str]) -> None:
    with sandbox(base) as root:
        before = tree(root)
        done, stopped = run_stopped(project_of(root), in_sandbox(argv, root))
        event("stopped by Ctrl-C" if stopped else f"exit {done.returncode}")
        if stopped:
            check_stopped(done)
        else:
            check_command_line(done, tree(root) - before)


# -- paiexp.job(...) --------------------------------------------------------------------------


def scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        hostile_strings(nul=True),
        st.binary(max_size=8),
        texts(nul=True).map(Path),
        st.just(object()),
    )


ANY_VALUE = st.recursive(
    scalars(),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.dictionaries(hostile_strings(nul=True), children, max_size=3),
        st.frozensets(st.one_of(st.none(), st.integers(), texts(nul=True)), max_size=3),
    ),
    max_leaves=8,
)


def shaped(hint: Any) -> st.SearchStrategy[Any]:
    """Values of a schema type's shape (a dataclass as a dict of its fields, a dict, a list),
    holding hostile values: they pass the first checks and reach the deeper ones."""
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        fields = {
            f.name: st.one_of(shaped(hints[f.name]), ANY_VALUE) for f in dataclasses.fields(hint)
        }
        return st.fixed_dictionaries({}, optional=fields)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is dict:
        return st.dictionaries(hostile_strings(nul=True), shaped(args[1]), max_size=3)
    if origin is list:
        return st.lists(shaped(args[0]), max_size=3)
    if args:  # a union
        return st.one_of(*(shaped(arg) for arg in args))
    return ANY_VALUE


def backends() -> st.SearchStrategy[Any]:
    """``backend=``: a name, or settings of a backend's schema with its name."""
    names = st.one_of(st.sampled_from(list(BACKENDS)), hostile_strings(nul=True))
    settings_of = st.one_of(
        *(
            st.tuples(shaped(kind.schema), st.just(name)).map(lambda d: {**d[0], "name": d[1]})
            for name, kind in BACKENDS.items()
        )
    )
    return st.one_of(names, settings_of)


def keyword_values() -> dict[str, st.SearchStrategy[Any]]:
    """Each keyword ``paiexp.job`` takes, and each key of the job schema, to a value of its
    shape or any value at all."""
    hints = typing.get_type_hints(JobConfig)
    drawn: dict[str, st.SearchStrategy[Any]] = {
        name: st.one_of(shaped(hints[name]), ANY_VALUE) for name in hints
    }
    for name in inspect.signature(paiexp.job).parameters:
        drawn.setdefault(name, ANY_VALUE)
    drawn.pop("unknown", None)
    drawn["backend"] = st.one_of(backends(), ANY_VALUE)
    drawn["tracker"] = st.one_of(shaped(TrackerConfig), ANY_VALUE)
    return drawn


KEYWORDS = keyword_values()
NAMES = sorted(name for name in KEYWORDS if name != "command")
API_CALLS = st.tuples(
    st.lists(st.sampled_from(NAMES), max_size=3, unique=True).flatmap(
        lambda names: st.fixed_dictionaries({name: KEYWORDS[name] for name in names})
    ),
    st.dictionaries(  # keywords that do not exist
        texts(nul=True).filter(lambda name: name not in KEYWORDS), ANY_VALUE, max_size=1
    ),
    st.one_of(st.just("python job.py"), KEYWORDS["command"]),
)


@contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in this process's environment meanwhile."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.mark.timeout(3600 if LONG_RUN else 600)
@settings(FUZZ, max_examples=API_EXAMPLES)
@given(call=API_CALLS)
@example(call=({"outputs": {"null": []}}, {}, "python job.py"))  # found by this test
@example(call=({"inputs": {"data": 1}}, {}, "python job.py"))
@example(call=({"checkpoints": ["ckpt"]}, {}, "python job.py"))
def test_job_keywords(base: Path, call: tuple[dict[str, Any], dict[str, Any], Any]) -> None:
    known, unknown, command = call
    with sandbox(base) as root, environment(HERMETIC), contextlib.chdir(root):
        kwargs = {"project": project_of(root), **unknown, **known}
        kwargs = {
            k: v.replace(SANDBOX, str(root)) if isinstance(v, str) else v for k, v in kwargs.items()
        }
        before = tree(root)
        try:
            composed = paiexp.job(command=command, **kwargs)
        except paiexp.ConfigError as exc:
            event("ConfigError")
            message = str(exc)
            assert message.strip() and len(message.splitlines()) == 1, repr(message)
        else:
            event("composed")
            assert isinstance(composed, paiexp.Composed)
        assert tree(root) == before, f"paiexp.job wrote {sorted(tree(root) - before)}"
