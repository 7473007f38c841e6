"""A run's input channels as MLflow dataset inputs: name = channel, source = its URI, digest =
a content hash of a local file or directory (cached by the files' sizes and modification
times, so a sweep's trials sharing an input hash it once), or the content address of an OSS
input paiexp uploaded (``.../inputs/<digest>/...``)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from paiexp.source import iter_source_files, source_digest

DIGEST_CHARS = 16  # MLflow keeps at most 36 characters of a dataset's digest
UPLOADED = re.compile(r"/inputs/([0-9a-f]{8,})(/|$)")


def dataset_inputs(inputs: Mapping[str, str]) -> list[Any]:
    """MLflow ``DatasetInput``s of a job's input channels, in channel order."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    datasets = []
    for channel, uri in sorted(inputs.items()):
        if uri.startswith("oss://"):
            source_type, source, digest = "oss", uri, _oss_digest(uri)
        else:
            path = Path(uri)
            source_type, source, digest = "local", path.as_uri(), local_digest(path)
        dataset = Dataset(name=channel, digest=digest, source_type=source_type, source=source)
        datasets.append(DatasetInput(dataset, tags=[InputTag("mlflow.data.context", "training")]))
    return datasets


def local_digest(path: Path) -> str:
    """A content hash of a local file or directory; "missing" when it is gone."""
    try:
        if path.is_dir():
            files = tuple(_stamp(f) for f in iter_source_files(path))
            return _dir_digest(str(path), files)
        return _file_digest(str(path), _stamp(path))
    except OSError:
        return "missing"


def _oss_digest(uri: str) -> str:
    """The content address of an input paiexp uploaded; else "unknown" (no ETag is fetched)."""
    match = UPLOADED.search(uri)
    return match.group(1)[:DIGEST_CHARS] if match else "unknown"


def _stamp(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path), stat.st_size, stat.st_mtime_ns


@lru_cache(maxsize=256)
def _file_digest(path: str, _stamp: tuple[str, int, int]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:DIGEST_CHARS]


@lru_cache(maxsize=64)
def _dir_digest(path: str, _files: tuple[tuple[str, int, int], ...]) -> str:
    return source_digest(Path(path))[:DIGEST_CHARS]
