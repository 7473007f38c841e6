"""A run's input channels as MLflow dataset inputs: name = channel, source = its URI, digest =
a content hash of a local file or directory (cached by the files' sizes and modification
times, so a sweep's trials sharing an input hash it once), or an OSS input's ETag (a prefix:
a hash of its objects' names and ETags), read in one listing with the run's backend's OSS
endpoint and the environment's credentials; "unknown" when it cannot be read."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from paiexp.contract.source import iter_source_files, source_digest

DIGEST_CHARS = 16
MAX_DIGEST_CHARS = 36  # what MLflow keeps of a dataset's digest
UNKNOWN = "unknown"

log = logging.getLogger(__name__)


def dataset_inputs(inputs: Mapping[str, str], backend: Mapping[str, Any]) -> list[Any]:
    """MLflow ``DatasetInput``s of a job's input channels, in channel order; ``backend``: the
    run's backend config (where its OSS is)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    remote = [uri for uri in inputs.values() if uri.startswith("oss://")]
    etags = oss_digests(backend, remote) if remote else {}
    datasets = []
    for channel, uri in sorted(inputs.items()):
        if uri.startswith("oss://"):
            source_type, source, digest = "oss", uri, etags.get(uri, UNKNOWN)
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


def oss_digests(backend: Mapping[str, Any], uris: list[str]) -> dict[str, str]:
    """Each OSS input's ETag (a prefix: a hash of its objects' relative names and ETags), by
    URI; those that cannot be read are left out (tracking goes on: the job read them)."""
    from paiexp.cloud.credentials import credential_client
    from paiexp.cloud.oss import OssTransfer, OssUri, endpoint_url
    from paiexp.util.cache import cache_root
    from paiexp.util.retry import RetryPolicy

    oss = backend.get("oss") or {}
    region = str(oss.get("region") or backend.get("region") or "cn-hangzhou")
    digests = {}
    try:
        transfer = OssTransfer(
            endpoint_url(oss.get("endpoint"), region),
            region,
            credential_client(),
            cache_root() / "oss",
            RetryPolicy(attempts=2, base_delay=0.2, max_delay=1.0),
            timeout=10.0,
        )
        for uri in uris:
            parsed = OssUri.parse(uri)
            digest = _etag_digest(parsed.key, transfer.etags(parsed))
            if digest is not None:
                digests[uri] = digest
    except Exception as exc:  # no credentials, no endpoint, no bucket: no digest, no failure
        log.warning("no OSS digest of the run's inputs: %s", exc)
    return digests


def _etag_digest(key: str, etags: Mapping[str, str]) -> str | None:
    """The object's ETag, else a hash of the objects under ``key/``; None when there are none."""
    if key in etags:
        etag = etags[key].strip('"')
        return etag if len(etag) <= MAX_DIGEST_CHARS else _short(etag)
    prefix = key.rstrip("/") + "/" if key else ""
    under = sorted(
        (k[len(prefix) :], v.strip('"')) for k, v in etags.items() if k.startswith(prefix)
    )
    return _short("\n".join(f"{k}\0{v}" for k, v in under)) if under else None


def _short(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


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
