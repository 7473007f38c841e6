"""TensorBoard scalars as metrics: the event files a job writes to its ``tensorboard`` channel
(``$PAI_OUTPUT_TENSORBOARD``), read as they grow, each scalar a point of a metric series.

A scalar's *tag path* is its tag, preceded by the directory of its event file under the
channel when that is not the channel itself (Keras writes ``train/`` and ``validation/``, so
its validation loss is ``validation/epoch_loss``).  A job declares the scalars it is judged by
(``job.tensorboard.metrics``: a sweep's objective, its pruner and a pipeline's conditions may
name them); every other scalar is logged too, under its tag path, unless
``job.tensorboard.other_scalars`` is false.

Event files are read with TensorBoard's own loader, which keeps its place in a file and goes
on from there when the file has grown, and waits for a record a writer has not finished.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paiexp.errors import UserError
from paiexp.metrics.extraction import METRIC_NAME, MetricPoint

EVENT_FILE_MARKER = "tfevents"  # events.out.tfevents.<time>.<host>[.<suffix>]
RECORD_FRAMING = 16  # bytes around each record: its length (8) and two CRCs (4 + 4)
UNNAMEABLE = re.compile(r"[^A-Za-z0-9_\-./ ]")


@dataclass(frozen=True)
class TensorBoardMetric:
    """A scalar the job declares: the one at ``tag`` (its tag path), as metric ``name``."""

    name: str
    tag: str


@dataclass(frozen=True)
class TensorBoardScalars:
    """Which scalars of the job's event files become metrics, and under which names."""

    metrics: tuple[TensorBoardMetric, ...] = ()
    other_scalars: bool = True

    def name_of(self, tag_path: str, taken: Collection[str] = ()) -> str | None:
        """The metric a scalar feeds: its declared name, else (other scalars on) its tag path
        made a metric name, unless a declared metric or a log metric (``taken``) has that name;
        None when it is not read."""
        for metric in self.metrics:
            if metric.tag == tag_path:
                return metric.name
        if not self.other_scalars:
            return None
        name = UNNAMEABLE.sub("_", tag_path)
        if name in taken or any(metric.name == name for metric in self.metrics):
            return None
        return name

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorBoardScalars:
        return cls(
            metrics=tuple(TensorBoardMetric(**item) for item in data.get("metrics", ())),
            other_scalars=bool(data.get("other_scalars", True)),
        )


def parse_tensorboard(
    declared: Iterable[Any], other_scalars: bool, log_metrics: Collection[str]
) -> TensorBoardScalars:
    """``job.tensorboard`` checked: each of its ``metrics`` a tag path (its metric named
    alike) or ``{name, tag}``; names and tags unique, no name a ``metric_definitions`` name
    (``log_metrics``)."""
    metrics: list[TensorBoardMetric] = []
    for index, item in enumerate(declared):
        metric = _declared(f"job.tensorboard.metrics[{index}]", item)
        if metric.name in log_metrics:
            raise UserError(
                f"job.tensorboard.metrics[{index}]: metric name {metric.name!r} is a "
                "job.metric_definitions name too; give the TensorBoard one another name"
            )
        for earlier in metrics:
            if metric.name == earlier.name or metric.tag == earlier.tag:
                same = "name" if metric.name == earlier.name else "tag"
                raise UserError(
                    f"job.tensorboard.metrics[{index}]: {same} "
                    f"{getattr(metric, same)!r} is declared twice"
                )
        metrics.append(metric)
    return TensorBoardScalars(tuple(metrics), bool(other_scalars))


def _declared(key: str, item: Any) -> TensorBoardMetric:
    if isinstance(item, str):
        name, tag = item, item
    elif isinstance(item, Mapping) and set(item) <= {"name", "tag"} and "name" in item:
        name, tag = item["name"], item.get("tag") or item["name"]
    else:
        raise UserError(
            f"{key}: invalid value {item!r}; expected a tag (e.g. loss) or "
            "{name: NAME, tag: TAG} (e.g. {name: val_loss, tag: validation/epoch_loss})"
        )
    if not isinstance(name, str) or not METRIC_NAME.match(name):
        raise UserError(
            f"{key}: metric name {name!r} may hold only letters, digits, "
            "'_', '-', '.', '/' and spaces"
        )
    if not isinstance(tag, str) or not tag.strip("/") or tag != tag.strip():
        raise UserError(f"{key}: invalid tag {tag!r}; expected a scalar's tag, e.g. loss/train")
    return TensorBoardMetric(name, tag)


@dataclass
class _EventFile:
    loader: Any  # tensorboard's RawEventFileLoader
    prefix: str  # the tag paths' directory part ('' or 'validation/')
    read: int = 0  # bytes of whole records read
    points: int = 0
    scalar_tags: set[str] = field(default_factory=set)  # TF2 tensors seen as scalars


class ScalarReader:
    """Reads the scalars of the event files under one directory, each call what is new."""

    def __init__(self, scalars: TensorBoardScalars, taken: Collection[str] = ()) -> None:
        """``taken``: the names of the job's log metrics (a scalar is never logged as one)."""
        self.scalars = scalars
        self.taken = frozenset(taken)
        self.series: dict[str, list[MetricPoint]] = {m.name: [] for m in scalars.metrics}
        self.tags: set[str] = set()  # every scalar's tag path seen, read or not
        self._files: dict[Path, _EventFile] = {}

    def read(self, directory: Path | None) -> list[MetricPoint]:
        """The new points in ``directory``'s event files (new files included), in file order."""
        if directory is None or not directory.is_dir():
            return []
        added: list[MetricPoint] = []
        for path in _event_files(directory):
            state = self._files.get(path) or self._open(directory, path)
            if state is not None:
                added.extend(self._read_file(state))
        return added

    def _open(self, directory: Path, path: Path) -> _EventFile | None:
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

        parent = path.parent.relative_to(directory).as_posix()
        try:
            loader = RawEventFileLoader(str(path))
        except OSError:
            return None  # gone, or not readable yet: looked at again next time
        state = _EventFile(loader, "" if parent == "." else f"{parent}/")
        self._files[path] = state
        return state

    def _read_file(self, state: _EventFile) -> list[MetricPoint]:
        from tensorboard.compat.proto.event_pb2 import Event

        added = []
        for record in state.loader.Load():
            state.read += len(record) + RECORD_FRAMING
            event = Event.FromString(record)
            for tag, value in _scalars(event, state.scalar_tags):
                path = state.prefix + tag
                self.tags.add(path)
                name = self.scalars.name_of(path, self.taken)
                if name is None:
                    continue
                series = self.series.setdefault(name, [])
                point = MetricPoint(name, value, int(event.step), float(event.wall_time))
                series.append(point)
                added.append(point)
                state.points += 1
        return added

    def final(self) -> dict[str, float]:
        """Each metric's last value (the latest written, by wall time)."""
        return {
            name: max(points, key=lambda p: p.timestamp).value
            for name, points in self.series.items()
            if points
        }

    def unreadable(self) -> list[str]:
        """One line per event file whose end could not be read (truncated or corrupt): what
        was read of it is kept.  Call once the job has ended."""
        lines = []
        for path, state in self._files.items():
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if state.read < size:
                lines.append(
                    f"TensorBoard event file {state.prefix}{path.name} is truncated or corrupt "
                    f"from byte {state.read} of {size}; the {state.points} points before it "
                    "are kept"
                )
        return lines

    def missing(self) -> dict[str, str]:
        """Why each declared scalar the event files never held is missing (naming the tags
        they did hold), by metric name."""
        wrote = ", ".join(sorted(self.tags)) if self.tags else None
        return {
            m.name: f"no scalar with tag {m.tag!r} was written to the tensorboard channel; "
            + (f"the job wrote tags: {wrote}" if wrote else "it holds no scalar")
            for m in self.scalars.metrics
            if not self.series.get(m.name)
        }


def _event_files(directory: Path) -> list[Path]:
    """The event files under ``directory`` (any depth), in name order: by writer start time
    within a directory (the name begins with it)."""
    found: list[Path] = []
    for folder, _, names in os.walk(directory):
        found.extend(Path(folder) / name for name in names if EVENT_FILE_MARKER in name)
    return sorted(found)


def _scalars(event: Any, scalar_tags: set[str]) -> Iterable[tuple[str, float]]:
    """An event's scalars: ``simple_value`` (PyTorch's SummaryWriter, tensorboardX, TF1) or a
    one-number tensor of the ``scalars`` plugin (TF2's ``tf.summary``, which names the plugin in
    a tag's first value only)."""
    if not event.HasField("summary"):
        return
    for value in event.summary.value:
        kind = value.WhichOneof("value")
        if kind == "simple_value":
            yield value.tag, float(value.simple_value)
        elif kind == "tensor":
            if value.metadata.plugin_data.plugin_name == "scalars":
                scalar_tags.add(value.tag)
            if value.tag in scalar_tags:
                number = _tensor_number(value.tensor)
                if number is not None:
                    yield value.tag, number


def _tensor_number(tensor: Any) -> float | None:
    from tensorboard.util import tensor_util

    array = tensor_util.make_ndarray(tensor)
    return float(array.item()) if array.size == 1 else None
