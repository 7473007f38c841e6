"""The emulator's object store: OSS buckets kept on disk, shared by the OSS and PAI servers.

Each object is a file under ``<root>/<bucket>/data/`` named by its percent-encoded key, with a
JSON sidecar under ``<root>/<bucket>/meta/`` (ETag, size, content type, last modified, user
metadata). Flat names keep ``a`` and ``a/b`` apart, as OSS does. Writes are atomic (temp file +
rename), so a reader never sees half an object.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str  # as OSS sends it: upper-case hex MD5 (multipart: "<md5 of md5s>-<parts>")
    last_modified: float
    content_type: str = "application/octet-stream"
    metadata: dict[str, str] = field(default_factory=dict)  # x-oss-meta-* without the prefix


class ObjectStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    # buckets -----------------------------------------------------------------------------
    def create_bucket(self, bucket: str) -> None:
        (self.root / bucket / "data").mkdir(parents=True, exist_ok=True)
        (self.root / bucket / "meta").mkdir(parents=True, exist_ok=True)

    def bucket_exists(self, bucket: str) -> bool:
        return (self.root / bucket / "data").is_dir()

    # objects -----------------------------------------------------------------------------
    def _paths(self, bucket: str, key: str) -> tuple[Path, Path]:
        name = quote(key, safe="")
        return self.root / bucket / "data" / name, self.root / bucket / "meta" / name

    def put(
        self,
        bucket: str,
        key: str,
        data: bytes,
        *,
        content_type: str = "application/octet-stream",
        metadata: dict[str, str] | None = None,
        etag: str | None = None,
    ) -> ObjectInfo:
        data_path, meta_path = self._paths(bucket, key)
        info = ObjectInfo(
            key=key,
            size=len(data),
            etag=etag or hashlib.md5(data).hexdigest().upper(),
            last_modified=time.time(),
            content_type=content_type,
            metadata=dict(metadata or {}),
        )
        _atomic_write(data_path, data)
        _atomic_write(meta_path, json.dumps(info.__dict__).encode())
        return info

    def head(self, bucket: str, key: str) -> ObjectInfo | None:
        _, meta_path = self._paths(bucket, key)
        try:
            return ObjectInfo(**json.loads(meta_path.read_bytes()))
        except FileNotFoundError:
            return None

    def get(self, bucket: str, key: str) -> bytes | None:
        data_path, _ = self._paths(bucket, key)
        try:
            return data_path.read_bytes()
        except FileNotFoundError:
            return None

    def delete(self, bucket: str, key: str) -> None:
        for path in self._paths(bucket, key):
            path.unlink(missing_ok=True)

    def keys(self, bucket: str, prefix: str = "") -> Iterator[str]:
        """Keys under ``prefix`` in lexicographic (OSS) order."""
        names = sorted(
            unquote(p.name)
            for p in (self.root / bucket / "meta").iterdir()
            if not p.name.startswith(".")
        )
        return (k for k in names if k.startswith(prefix))

    # oss:// helpers for the PAI emulator -------------------------------------------------
    def download_uri(self, uri: str, dest: Path) -> Path:
        """Copy ``oss://bucket/key`` (one object) or ``oss://bucket/prefix/`` (a tree) to
        ``dest`` (a directory); return the file written for a single object, else ``dest``."""
        bucket, key = split_uri(uri)
        dest.mkdir(parents=True, exist_ok=True)
        if key and not key.endswith("/") and self.head(bucket, key) is not None:
            target = dest / key.rsplit("/", 1)[-1]
            target.write_bytes(self.get(bucket, key) or b"")
            return target
        prefix = key if not key or key.endswith("/") else key + "/"
        for name in self.keys(bucket, prefix):
            relative = name[len(prefix) :]
            if not relative or relative.endswith("/"):
                continue
            target = dest / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.get(bucket, name) or b"")
        return dest

    def upload_tree(self, source: Path, uri: str) -> list[str]:
        """Put every file under ``source`` below ``oss://bucket/prefix/``; return the keys."""
        bucket, prefix = split_uri(uri)
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        written = []
        for path in sorted(p for p in Path(source).rglob("*") if p.is_file()):
            key = prefix + path.relative_to(source).as_posix()
            self.put(bucket, key, path.read_bytes())
            written.append(key)
        return written


def split_uri(uri: str) -> tuple[str, str]:
    """``oss://bucket/some/key`` -> ``("bucket", "some/key")``; an endpoint in the bucket part
    (``bucket.oss-cn-hangzhou.aliyuncs.com``) is dropped, as PAI accepts both forms."""
    if not uri.startswith("oss://"):
        raise ValueError(f"not an oss:// URI: {uri!r}")
    bucket, _, key = uri[len("oss://") :].partition("/")
    return bucket.split(".", 1)[0], key


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
