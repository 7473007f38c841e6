"""The command line.

    paiexp [OVERRIDES...]              compose conf/ with Hydra overrides and run the job
    paiexp -m KEY=a,b KEY=range(1,4)   run every combination as a grid sweep (Hydra's -m)
    paiexp +pipeline=NAME [--rerun STEP]   run pipelines/NAME.yaml's steps (resumable)
    paiexp --cfg job [-p PKG] [--resolve]   print the composed config, run nothing
    paiexp --info [searchpath|defaults|...] print the config search path, defaults list, config
    paiexp rerun RUN_ID [KEY=VALUE...] run a tracked job again (--resume: from its checkpoints)
    paiexp attach JOB_NAME             follow a job whose launcher died, and close its run
    paiexp init [DIR]                  write a starter project (conf/, sweeps/, examples/)
    paiexp download RUN_ID DEST        fetch a run's model (or --channel NAME) from OSS
    paiexp register RUN_ID NAME        a run's model as a version of NAME (alias best if better)
    paiexp images [--framework NAME]   list official PAI training images
    paiexp report [SWEEP | RUN_ID]     a sweep's top trials, and its plots as one HTML file
    paiexp tensorboard SWEEP|RUN_ID    TensorBoard over a run's event files, or a sweep's trials
    paiexp import pai JOB_ID... | --label K=V | --since DATE   PAI jobs made elsewhere as runs

Hydra's flags: --config-path/-cp names the primary config directory (default conf/),
--config-dir/-cd adds one to the search path, --config-name/-cn names the root config.
A user mistake is one line on stderr and exit code 2, before any job or run exists.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from paiexp.backends.base import BackendUnavailable, SubmissionFailed
from paiexp.errors import UserError, one_line
from paiexp.util.diskfull import DiskFull, disk_full, record_details
from paiexp.util.outage import OutageTooLong
from paiexp.util.quick_exit import exit_as_python
from paiexp.util.terminal import show_on_stderr

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from paiexp.api.jobs import Composed
    from paiexp.config.compose import Project
    from paiexp.runs import PreparedJob
    from paiexp.sweep.prepared import PreparedSweep
    from paiexp.tracking.mlflow_tracker import MlflowTracker, TrackedRun

EXIT_USER_ERROR = 2
EXIT_JOB_FAILED = 1
EXIT_INTERRUPTED = 130
# What --info prints (Hydra's choices but plugins: paiexp runs no Hydra plugins).
INFO_CHOICES = ("all", "config", "defaults", "defaults-tree", "searchpath")


def entry() -> NoReturn:
    """The ``paiexp`` command and ``python -m paiexp``: :func:`main`, then Python's exit
    without the teardown of every module it imported (:mod:`paiexp.util.quick_exit`).  A command
    line that runs a sweep starts its tracking process first, to load MLflow meanwhile."""
    if runs_a_sweep(sys.argv[1:]):
        from paiexp.sweep.tracking_process import start_ahead

        start_ahead()
    try:
        code: object = main()
    except SystemExit as exc:  # argparse's usage errors and --help
        code = exc.code
    exit_as_python(code)


def runs_a_sweep(argv: Sequence[str]) -> bool:
    """Whether a command line runs a sweep: the run command choosing a sweep config
    (``+sweep=NAME``) or a grid (``--multirun``), not printing something instead."""
    if not argv or argv[0] in COMMANDS:
        return False
    if any(arg.partition("=")[0] in PRINT_ONLY for arg in argv):
        return False
    return any(arg in ("-m", "--multirun") or arg.startswith(SWEEP_CHOICES) for arg in argv)


PRINT_ONLY = frozenset({"--cfg", "-c", "--info", "-i", "--help", "-h", "--dry-run"})
SWEEP_CHOICES = ("+sweep=", "++sweep=", "sweep=")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    show_on_stderr()
    try:
        if args and args[0] in COMMANDS:
            return COMMANDS[args[0]](args[1:])
        return run_command(args)
    except UserError as exc:
        print(f"paiexp: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BackendUnavailable as exc:  # the platform did not answer: no mistake of the user's
        print(
            f"paiexp: error: {one_line(str(exc))}; check the network and the backend's endpoint",
            file=sys.stderr,
        )
        return EXIT_JOB_FAILED
    except SubmissionFailed as exc:  # its run says so too
        print(f"paiexp: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_JOB_FAILED
    except OutageTooLong as exc:  # the study's storage stayed away: the jobs are not lost
        print(
            f"paiexp: error: {one_line(str(exc))}; the jobs in flight run on, and the same command "
            "run again follows them",
            file=sys.stderr,
        )
        return EXIT_JOB_FAILED
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        full = disk_full(exc)
        if full is None:
            raise
        return report_disk_full(full, exc)


def report_disk_full(full: DiskFull, exc: BaseException) -> int:
    """A full disk stopped the command: one line naming the file and the log of details;
    what was running is left as after a crash, for the same command to pick up."""
    details = record_details(full, exc)
    where = f" (details in {details})" if details else ""
    print(f"paiexp: error: {one_line(f'{full}{where}')}", file=sys.stderr)
    return EXIT_JOB_FAILED


class _Parser(argparse.ArgumentParser):
    """argparse whose mistakes are one-line user errors like every other, naming the
    arguments the command takes."""

    positionals = ""  # their usage, e.g. RUN_ID [KEY=VALUE ...]

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if kwargs.get("nargs") == "*":  # else argparse calls an empty list missing
            kwargs.setdefault("default", [])
        action = super().add_argument(*args, **kwargs)
        if not action.option_strings:  # kept now: intermixed parsing hides positionals
            formatter = self.formatter_class(prog="")
            formatter.add_usage(None, self._get_positional_actions(), [], prefix="")
            self.positionals = formatter.format_help().strip()
        return action

    def error(self, message: str) -> NoReturn:
        usage = f"{self.prog} [OPTIONS] {self.positionals}".strip()
        raise UserError(f"{self.prog}: {message} (usage: {usage}; see {self.prog} --help)")


def _parser(prog: str, description: str, epilog: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config-path", "-cp", metavar="DIR", help="the primary config directory (default: conf)"
    )
    parser.add_argument(
        "--config-dir",
        "-cd",
        action="append",
        default=[],
        metavar="DIR",
        help="add DIR to the config search path, after the primary directory",
    )
    parser.add_argument(
        "--config-name", "-cn", default="config", metavar="NAME", help="root config name"
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="do not echo the job's log")
    return parser


def _project(args: argparse.Namespace) -> Project:
    from paiexp.config.compose import locate_project

    return locate_project(args.config_path, args.config_name, args.config_dir)


def _commands_help() -> str:
    """The subcommands, from this module's docstring (each registered command listed)."""
    lines = [
        line.rstrip()
        for line in (__doc__ or "").splitlines()
        if re.match(r"^    paiexp (\S+)", line) and line.split()[1] in COMMANDS
    ]
    listed = {line.split()[1] for line in lines}
    lines += [f"    paiexp {name}" for name in COMMANDS if name not in listed]
    return "commands (paiexp COMMAND --help for each):\n" + "\n".join(lines)


def run_command(argv: Sequence[str]) -> int:
    parser = _parser(
        "paiexp", "Compose a training job from conf/ and run it.", epilog=_commands_help()
    )
    parser.add_argument(
        "--cfg", "-c", choices=["job", "all"], help="print the composed config and exit"
    )
    parser.add_argument(
        "--multirun",
        "-m",
        action="store_true",
        help="run every combination of the sweep overrides (KEY=a,b,c, KEY=range(1,4)) "
        "as a grid sweep",
    )
    parser.add_argument(
        "--info",
        "-i",
        nargs="?",
        const="all",
        choices=INFO_CHOICES,
        help="print the config search path, the defaults list and the config, and exit",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the most the job or sweep can cost (backend.prices) and exit",
    )
    parser.add_argument(
        "--config-file",
        metavar="FILE",
        help="run a whole config written to FILE (as --cfg all prints it, as "
        "paiexp.start_sweep saves a sweep defined in Python), KEY=VALUE edits applied; its "
        "relative paths are the working directory's",
    )
    parser.add_argument("--package", "-p", help="with --cfg: print only this config node")
    parser.add_argument("--resolve", action="store_true", help="with --cfg: resolve ${...}")
    parser.add_argument(
        "--rerun",
        action="append",
        default=[],
        metavar="STEP",
        help="with +pipeline=NAME: run STEP (and the steps after it) again",
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides, e.g. job.name=x"
    )
    args = parser.parse_intermixed_args(argv)
    if sum((bool(args.cfg), args.multirun, args.info is not None)) > 1:
        raise UserError("only one of --multirun, --cfg and --info can be given")

    from paiexp.api.jobs import composed_from
    from paiexp.config.compose import compose, show_info

    if args.config_file:
        composed = _from_config_file(args)
        if args.cfg:
            return print_config(composed.cfg, args.package, args.resolve)
    else:
        project = _project(args)
        if args.info:
            show_info(project, args.overrides, args.info)
            return 0
        if args.multirun:
            composed = _grid(project, args.overrides)
        else:
            cfg = compose(project, args.overrides)
            if args.cfg:
                return print_config(cfg, args.package, args.resolve)
            composed = composed_from(project, cfg, args.overrides)
    if composed.kind == "pipeline":
        if args.dry_run:  # never a run instead
            raise UserError(
                "--dry-run: a pipeline's cost is not projected; dry-run its steps' job or "
                "sweep (without +pipeline) one at a time"
            )
        return _pipeline(composed, args.rerun, quiet=args.quiet)
    if args.rerun:
        raise UserError("--rerun: only a pipeline's steps run again; add +pipeline=NAME")
    if args.dry_run:
        print(composed.projection().line())
        return 0
    if composed.kind == "sweep":
        return _sweep(composed.prepared_sweep())
    return _run(composed.prepared(), quiet=args.quiet)


def _from_config_file(args: argparse.Namespace) -> Composed:
    """``--config-file FILE``: its config validated against the schema, ``KEY=VALUE`` edits
    applied, its project the working directory."""
    import yaml

    from paiexp.api.jobs import Composed
    from paiexp.config.compose import from_yaml

    for flag, given in (
        ("--multirun", args.multirun),
        ("--info", args.info),
        ("--rerun", args.rerun),
    ):
        if given:
            raise UserError(f"--config-file: {flag} composes from conf/; drop one of them")
    path = Path(args.config_file)
    try:
        text = path.read_text(encoding="utf-8")
        loaded = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--config-file: cannot read {path}: {exc}") from None
    except yaml.YAMLError as exc:
        problem = " ".join(str(exc).split())
        raise UserError(f"--config-file: {path} is not valid YAML: {problem}") from None
    backend = loaded.get("backend") if isinstance(loaded, dict) else None
    if not isinstance(backend, dict) or not backend.get("name"):
        raise UserError(
            f"--config-file: {path} holds no whole config: expected job:, backend: (with its "
            "name) and tracker:, as `python -m paiexp --cfg all` prints them"
        )
    composed = Composed(from_yaml(text, args.overrides), Path.cwd(), tuple(args.overrides))
    if composed.kind == "pipeline":
        raise UserError("--config-file: a pipeline runs from its project: +pipeline=NAME")
    return composed


def rerun_command(argv: Sequence[str]) -> int:
    parser = _parser("paiexp rerun", "Run a tracked run's job again from its stored config.")
    parser.add_argument(
        "run_id", metavar="RUN_ID", help="a run id (a sweep's: its best trial), or a sweep's name"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="start from the checkpoints the run left (its checkpoints channel), e.g. after "
        "its instances were reclaimed",
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="edits of the stored config"
    )
    args = parser.parse_intermixed_args(argv)

    from pathlib import Path

    from paiexp.config.compose import compose, to_object
    from paiexp.runs import open_tracker, prepare_from_record
    from paiexp.tracking.mlflow_tracker import CONFIG_ARTIFACT

    project = _project(args)
    tracker = open_tracker(to_object(compose(project, [])))
    tracked = _get_run(tracker, args.run_id)
    edits = list(args.overrides)
    if args.resume:
        edits.append(f"job.checkpoints={_quoted(_checkpoints_of(tracked))}")
    job = prepare_from_record(
        tracker.load_text(tracked.run_id, CONFIG_ARTIFACT),
        Path(tracked.tags["paiexp.project_dir"]),
        edits,
    )
    return _run(job, quiet=args.quiet, extra_tags={"paiexp.rerun_of": tracked.run_id})


def _checkpoints_of(tracked: TrackedRun) -> str:
    """Where a run's job left its checkpoints (its checkpoints channel's URI)."""
    uri = tracked.tags.get("paiexp.output.checkpoints")
    if not uri:
        raise UserError(
            f"--resume: run {tracked.run_id} recorded no checkpoints channel "
            "(its job has not ended, or wrote none); rerun it without --resume"
        )
    return uri


def _quoted(value: str) -> str:
    """A Hydra override's value, quoted (a URI's characters are the grammar's too)."""
    return "'" + value.replace("'", "\\'") + "'"


def register_command(argv: Sequence[str]) -> int:
    parser = _parser("paiexp register", "Make a run's model a version of a registered model.")
    parser.add_argument(
        "run_id", metavar="RUN_ID", help="a run id (a sweep's: its best trial), or a sweep's name"
    )
    parser.add_argument("name", metavar="NAME", help="the registered model")
    args = parser.parse_intermixed_args(argv)

    from paiexp.config.compose import compose, to_object
    from paiexp.runs import open_tracker

    tracker = open_tracker(to_object(compose(_project(args), [])))
    registered = tracker.register_run(_get_run(tracker, args.run_id).run_id, args.name)
    best = "" if registered.best else f"; best stays version {registered.best_version}"
    print(f"{args.name} version {registered.version}{' (best)' if registered.best else best}")
    return 0


def attach_command(argv: Sequence[str]) -> int:
    parser = _parser("paiexp attach", "Follow a job whose launcher died, and close its run.")
    parser.add_argument("job_name", metavar="JOB_NAME")
    args = parser.parse_intermixed_args(argv)

    from paiexp.config.compose import compose, to_object
    from paiexp.runs import attach, open_tracker, summarize

    project = _project(args)
    tracker = open_tracker(to_object(compose(project, [])))
    run_id, result = attach(tracker, args.job_name, echo=None if args.quiet else print)
    if result is None:
        return 0
    summarize(run_id, result, tracker.uri, tracker.experiment_id, log_shown=not args.quiet)
    return 0 if result.status.state.value == "SUCCEEDED" else EXIT_JOB_FAILED


def init_command(argv: Sequence[str]) -> int:
    parser = _Parser(prog="paiexp init", description="Write a starter project into DIR.")
    parser.add_argument("directory", nargs="?", default=".", metavar="DIR")
    args = parser.parse_intermixed_args(argv)

    import os
    from pathlib import Path

    from paiexp.commands.init import write_starter
    from paiexp.tracking.browse import console_command

    target = Path(args.directory)
    for path in write_starter(target):
        print(f"wrote {path}")

    def command(name: str) -> str:  # this environment's, absolute when not the one on PATH
        found = console_command(name)
        return os.path.abspath(found) if os.sep in found else found

    print(f"next: cd {target} && {command('paiexp')} +sweep=xgb")
    print(f"then: {command('mlflow')} ui --backend-store-uri sqlite:///mlflow.db")
    return 0


def download_command(argv: Sequence[str]) -> int:
    parser = _parser("paiexp download", "Fetch a tracked run's model (or other output).")
    parser.add_argument(
        "run_id", metavar="RUN_ID", help="a run id (a sweep's: its best trial), or a sweep's name"
    )
    parser.add_argument("dest", metavar="DEST", help="local directory to download into")
    parser.add_argument("--channel", default="model", help="output channel (default: model)")
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="edits of the run's stored config"
    )
    args = parser.parse_intermixed_args(argv)

    from pathlib import Path

    from paiexp.commands.download import fetch_output
    from paiexp.config.compose import compose, to_object

    config = to_object(compose(_project(args), []))
    dest = Path(args.dest)
    uri, files = fetch_output(config, args.run_id, args.channel, dest, args.overrides)
    print(f"downloaded {len(files)} file(s) from {uri} to {args.dest}")
    return 0


def images_command(argv: Sequence[str]) -> int:
    parser = _parser("paiexp images", "List official PAI training images (for job.image).")
    parser.add_argument("--framework", help="e.g. XGBoost, PyTorch, TensorFlow")
    parser.add_argument("--chip", choices=["CPU", "GPU"], help="only CPU or GPU images")
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides, e.g. backend.region=..."
    )
    args = parser.parse_intermixed_args(argv)

    from paiexp.commands.images import require_sdk

    require_sdk()
    from paiexp.backends.pai import make_api
    from paiexp.commands.images import official_images
    from paiexp.config.compose import compose, to_object

    project = _project(args)
    config = to_object(compose(project, args.overrides))
    if config.backend.name != "pai":
        config = to_object(compose(project, ["backend=pai", *args.overrides]))
    images = official_images(make_api(config.backend), args.framework, args.chip)
    if not images:
        print("no matching official images", file=sys.stderr)
        return 1
    for image in images:
        details = ", ".join(x for x in (image.framework, image.chip, image.python) if x)
        print(f"{image.uri}  ({details})" if details else image.uri)
    return 0


def report_command(argv: Sequence[str]) -> int:
    parser = _parser("paiexp report", "A sweep's top trials, and its plots as one HTML file.")
    parser.add_argument("target", metavar="SWEEP|RUN_ID", help="a sweep's name or an MLflow run")
    parser.add_argument("--output", "-o", help="the HTML file (default: reports/STUDY.html)")
    parser.add_argument("--top", type=int, default=10, help="trials in the table (default: 10)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. sweep.storage=...")
    args = parser.parse_intermixed_args(argv)

    from paiexp.commands.report import report

    project = _project(args)
    return report(project, args.target, args.overrides, args.output, args.top)


def tensorboard_command(argv: Sequence[str]) -> int:
    parser = _parser(
        "paiexp tensorboard",
        "TensorBoard over a run's event files, or over each trial of a sweep (or step of a "
        "pipeline) as a named run.",
    )
    parser.add_argument(
        "target", metavar="SWEEP|RUN_ID", help="a sweep's name, or a run (a sweep's: its trials)"
    )
    parser.add_argument("--port", type=int, default=6006, help="TensorBoard's port (6006)")
    parser.add_argument(
        "--print", action="store_true", help="print TensorBoard's command line, do not start it"
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="edits of the runs' stored configs"
    )
    args = parser.parse_intermixed_args(argv)
    if not 0 < args.port < 65536:
        raise UserError(f"--port: invalid value {args.port}; expected a port, 1-65535")

    import shlex

    from paiexp.commands.tensorboard import command, logdirs, serve
    from paiexp.config.compose import compose, to_object

    project = _project(args)
    config = to_object(compose(project, []))
    directories = logdirs(config, args.target, project.base_dir, args.overrides)
    tensorboard = command(directories, args.port)
    if args.print:
        print(shlex.join(tensorboard))
        return 0
    serve(tensorboard)
    return 0


def import_command(argv: Sequence[str]) -> int:
    parser = _parser("paiexp import", "Track training jobs started elsewhere as MLflow runs.")
    parser.add_argument("platform", choices=["pai"], help="where the jobs ran")
    parser.add_argument(
        "items",
        nargs="*",
        metavar="JOB_ID|KEY=VALUE",
        help="PAI training job ids, and Hydra overrides (backend.workspace_id=...)",
    )
    parser.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="jobs with this label"
    )
    parser.add_argument("--since", metavar="DATE", help="jobs created at or after DATE (UTC)")
    args = parser.parse_intermixed_args(argv)

    from paiexp.commands.import_pai import JobSelection, import_pai

    job_ids = [item for item in args.items if "=" not in item]
    selection = JobSelection.parse(job_ids, args.label, args.since)
    project = _project(args)
    return import_pai(project, selection, [item for item in args.items if "=" in item])


def print_config(cfg: DictConfig, package: str | None, resolve: bool) -> int:
    from omegaconf import OmegaConf

    node = OmegaConf.select(cfg, package) if package else cfg
    if node is None:
        raise UserError(f"--package: no config node {package!r}")
    if not OmegaConf.is_config(node):  # a single value, e.g. -p job.name
        print(node)
        return 0
    print(OmegaConf.to_yaml(node, resolve=resolve), end="")
    return 0


def _run(job: PreparedJob, *, quiet: bool, extra_tags: dict[str, str] | None = None) -> int:
    from paiexp.api.jobs import run_prepared
    from paiexp.runs import summarize

    ran = run_prepared(job, echo=not quiet, extra_tags=extra_tags)
    assert ran.result is not None
    tracker = ran.tracker
    summarize(ran.run_id, ran.result, tracker.uri, tracker.experiment_id, log_shown=not quiet)
    return 0 if ran.result.status.state.value == "SUCCEEDED" else EXIT_JOB_FAILED


def _grid(project: Project, overrides: Sequence[str]) -> Composed:
    """``-m``: the sweep overrides' combinations as a grid sweep (see paiexp.sweep.multirun)."""
    from paiexp.api.jobs import composed_from
    from paiexp.config.compose import compose
    from paiexp.sweep.multirun import apply_grid, split_multirun

    plain, grid = split_multirun(overrides)
    cfg = compose(project, plain, multirun=True)
    if cfg.pipeline is not None:
        raise UserError("-m: a pipeline's steps cannot be run as a grid; drop -m or +pipeline")
    apply_grid(cfg, grid)
    return composed_from(project, cfg, overrides)


def _sweep(prepared: PreparedSweep) -> int:
    from paiexp.api.sweeps import run_shown_sweep

    outcome = run_shown_sweep(prepared)
    if outcome.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_JOB_FAILED if outcome.failed or not outcome.completed else 0


def _pipeline(composed: Composed, rerun: Sequence[str], *, quiet: bool) -> int:
    from paiexp.api.pipelines import run_prepared_pipeline
    from paiexp.pipeline.summary import summarize

    prepared = composed.prepared_pipeline()  # every check; nothing created yet
    outcome, uri = run_prepared_pipeline(prepared, rerun, echo=None if quiet else print)
    summarize(prepared, outcome, prepared.state.run_id, uri)
    if outcome.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_JOB_FAILED if outcome.failed else 0


def _get_run(tracker: MlflowTracker, run_id: str) -> TrackedRun:
    tracked = tracker.get_run(run_id)
    if tracked is None:
        raise UserError(f"run_id: no MLflow run {run_id!r} in {tracker.uri}")
    return tracked


COMMANDS = {
    "rerun": rerun_command,
    "attach": attach_command,
    "init": init_command,
    "download": download_command,
    "register": register_command,
    "images": images_command,
    "report": report_command,
    "tensorboard": tensorboard_command,
    "import": import_command,
}
