"""OSS transfer with oss2: content-addressed uploads of code and data, downloads of outputs.

Code goes up as the official PAI Python SDK (0.4.13) sends it: the files of the source dir,
uncompressed, under a prefix that is the job's ``CodeDir`` (its key ends in ``/``). The prefix
is named by the tree's content digest, so a sweep uploads its code once, however many trials
it runs, and a later sweep with unchanged code uploads nothing. Big files go up with oss2's
resumable (multipart) upload, whose checkpoints live in the local cache.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paiexp.contract.source import iter_source_files, source_digest
from paiexp.errors import UserError
from paiexp.util.confine import inside
from paiexp.util.retry import RetryPolicy, call_with_retries

MULTIPART_THRESHOLD = 16 * 1024 * 1024
PART_SIZE_MIN = 100 * 1024  # OSS's smallest part but the last
DIGEST_LENGTH = 20
COMPLETE_MARKER = ".paiexp-complete"


@dataclass(frozen=True)
class OssUri:
    bucket: str
    key: str

    @classmethod
    def parse(cls, uri: str) -> OssUri:
        """``oss://bucket[.endpoint]/key``; the endpoint part, as PAI accepts it, is dropped."""
        if not uri.startswith("oss://"):
            raise UserError(f"not an OSS URI: {uri!r}; expected oss://BUCKET/KEY")
        bucket, _, key = uri[len("oss://") :].partition("/")
        return cls(bucket.split(".", 1)[0], key)

    def join(self, *parts: str) -> OssUri:
        key = "/".join(p.strip("/") for p in (self.key, *parts) if p.strip("/"))
        return OssUri(self.bucket, key)

    def as_dir(self) -> OssUri:
        if not self.key or self.key.endswith("/"):
            return self
        return OssUri(self.bucket, self.key + "/")

    def __str__(self) -> str:
        return f"oss://{self.bucket}/{self.key}"


def endpoint_url(endpoint: str | None, region: str) -> str:
    """oss2's endpoint: the region's public one by default; ``https://`` when no scheme given."""
    if not endpoint:
        return f"https://oss-{region}.aliyuncs.com"
    return endpoint if "://" in endpoint else f"https://{endpoint}"


class OssTransfer:
    """Uploads and downloads through oss2, retried on throttling, 5xx and lost connections."""

    def __init__(
        self,
        endpoint: str,
        region: str,
        credentials: Any,
        cache_dir: Path,
        policy: RetryPolicy,
        timeout: float = 30.0,
        multipart_threshold: int = MULTIPART_THRESHOLD,
    ) -> None:
        import oss2

        self._oss2 = oss2
        self.endpoint = endpoint
        self.region = region
        self.auth = oss2.ProviderAuth(_CredentialsBridge(credentials))
        self.cache_dir = cache_dir
        self.policy = policy
        self.timeout = timeout
        self.multipart_threshold = multipart_threshold
        self._buckets: dict[str, Any] = {}

    def bucket(self, name: str) -> Any:
        if name not in self._buckets:
            self._buckets[name] = self._oss2.Bucket(
                self.auth, self.endpoint, name, connect_timeout=self.timeout, region=self.region
            )
        return self._buckets[name]

    def _retry(self, what: str, call: Any) -> Any:
        return call_with_retries(call, policy=self.policy, transient=self.transient, what=what)

    def transient(self, exc: BaseException) -> bool:
        errors = self._oss2.exceptions
        if isinstance(exc, errors.RequestError):
            return True  # connection refused, reset or timed out
        if isinstance(exc, errors.ServerError):
            return exc.status >= 500 or exc.status == 429 or exc.code in ("ServerBusy", "SlowDown")
        return False

    # -- uploads ---------------------------------------------------------------------------

    def exists(self, uri: OssUri) -> bool:
        bucket = self.bucket(uri.bucket)
        return bool(self._retry(f"head {uri}", lambda: bucket.object_exists(uri.key)))

    def exists_any(self, uri: OssUri) -> bool:
        """Whether ``uri`` names an object, or a prefix with objects under it."""
        if uri.key and not uri.key.endswith("/") and self.exists(uri):
            return True
        prefix = uri.as_dir()
        bucket = self.bucket(prefix.bucket)
        listing = self._retry(
            f"list {prefix}", lambda: bucket.list_objects_v2(prefix=prefix.key, max_keys=1)
        )
        return bool(listing.object_list)

    def put_bytes(self, uri: OssUri, data: bytes) -> None:
        self._retry(f"upload {uri}", lambda: self.bucket(uri.bucket).put_object(uri.key, data))

    def put_file(self, uri: OssUri, path: Path) -> None:
        if path.stat().st_size < self.multipart_threshold:
            self.put_bytes(uri, path.read_bytes())
            return
        store = self._oss2.ResumableStore(root=str(self.cache_dir), dir="oss-checkpoints")

        def upload() -> None:
            self._oss2.resumable_upload(
                self.bucket(uri.bucket),
                uri.key,
                str(path),
                store=store,
                multipart_threshold=self.multipart_threshold,
                part_size=max(PART_SIZE_MIN, self.multipart_threshold // 2),
                num_threads=2,
            )

        self._retry(f"upload {uri}", upload)  # a retry uploads only the missing parts

    def upload_code(self, source_dir: Path, base: OssUri) -> OssUri:
        """The files of ``source_dir`` under ``base/training_src/<digest>/``: that prefix.

        A prefix is complete once its marker object exists, ``<digest>.paiexp-complete`` beside
        it (inside, the job would find it in ``/ml/usercode``), put after every file; an upload
        cut short is finished by the next call, files already there skipped.
        """
        folder = base.join("training_src", source_digest(source_dir)[:DIGEST_LENGTH])
        uri = folder.as_dir()
        marker = OssUri(folder.bucket, folder.key + COMPLETE_MARKER)
        if not self.exists(marker):
            present = self.sizes(uri)
            for file in iter_source_files(source_dir):
                target = uri.join(file.relative_to(source_dir).as_posix())
                if present.get(target.key) != file.stat().st_size:
                    self.put_file(target, file)
            self.put_bytes(marker, b"")
        return uri

    def upload_input(self, path: Path, base: OssUri) -> OssUri:
        """A local file or directory under ``base/inputs/<digest>/``, uploaded only if absent.

        A file's URI names the object itself (PAI then points ``PAI_INPUT_X`` at the file); a
        directory's ends in ``/``. A directory is complete once its marker object exists.
        """
        if path.is_file():
            uri = base.join("inputs", _file_digest(path)[:DIGEST_LENGTH], path.name)
            if not self.exists(uri):
                self.put_file(uri, path)
            return uri
        folder = base.join("inputs", source_digest(path)[:DIGEST_LENGTH])
        uri = folder.join(path.name).as_dir()
        marker = folder.join(COMPLETE_MARKER)
        if not self.exists(marker):
            for file in iter_source_files(path):
                self.put_file(uri.join(file.relative_to(path).as_posix()), file)
            self.put_bytes(marker, b"")
        return uri

    # -- downloads -------------------------------------------------------------------------

    def list_keys(self, prefix: OssUri) -> list[str]:
        return [o.key for o in self._listing(prefix)]

    def sync_down(self, uri: OssUri, cache: Path) -> Path:
        """A local copy of an object or a prefix, at ``cache/<bucket>/<key>``.

        Only objects whose ETag changed since they were last fetched are downloaded again;
        the ETags are kept beside the copies (never inside a copied directory).
        """
        if uri.key and not uri.key.endswith("/") and self.exists(uri):
            bucket = self.bucket(uri.bucket)
            head = self._retry(f"head {uri}", lambda: bucket.head_object(uri.key))
            objects = {uri.key: str(head.etag)}
            local = inside(cache / uri.bucket, uri.key, name=str(uri))
        else:
            objects = self.etags(uri.as_dir())
            if not objects:
                raise UserError(f"no object or prefix {uri} on OSS")
            prefix = uri.as_dir().key.rstrip("/")
            local = (
                inside(cache / uri.bucket, prefix, name=str(uri)) if prefix else cache / uri.bucket
            )
        root = cache / uri.bucket
        targets = {key: inside(root, key, name=f"oss://{uri.bucket}/{key}") for key in objects}
        for key, etag in objects.items():
            target = targets[key]
            seen = cache / ".etags" / uri.bucket / hashlib.sha256(key.encode()).hexdigest()
            if not target.exists() or not seen.exists() or seen.read_text() != etag:
                self.download(OssUri(uri.bucket, key), target.parent)
                seen.parent.mkdir(parents=True, exist_ok=True)
                seen.write_text(etag)
        return local

    def mirror_growing(
        self, prefix: OssUri, dest: Path, wanted: Callable[[str], bool] | None = None
    ) -> None:
        """Bring ``dest`` up to the objects under ``prefix`` (``wanted``: those whose path
        under it this says yes to), for files that only grow (event files a job appends to):
        only the bytes past a local copy's end are fetched; a copy longer than its object (the
        object was replaced) is fetched whole again."""
        bucket = self.bucket(prefix.bucket)
        base = prefix.as_dir().key
        for key, size in self.sizes(prefix.as_dir()).items():
            if key.endswith("/") or (wanted is not None and not wanted(key[len(base) :])):
                continue
            target = inside(dest, key[len(base) :], name=f"oss://{prefix.bucket}/{key}")
            have = target.stat().st_size if target.is_file() else 0
            if have == size:
                continue
            start = have if have < size else 0
            data = self._retry(
                f"download oss://{prefix.bucket}/{key}",
                lambda key=key, start=start: bucket.get_object(
                    key, byte_range=(start, None)
                ).read(),
            )
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("ab" if start else "wb") as stream:
                stream.write(data)

    def sizes(self, prefix: OssUri) -> dict[str, int]:
        """Object key -> size under a prefix."""
        return {o.key: int(o.size) for o in self._listing(prefix)}

    def etags(self, prefix: OssUri) -> dict[str, str]:
        """Object key -> ETag under a prefix (directory markers left out)."""
        return {o.key: str(o.etag) for o in self._listing(prefix) if not o.key.endswith("/")}

    def _listing(self, prefix: OssUri) -> list[Any]:
        bucket = self.bucket(prefix.bucket)
        return self._retry(
            f"list {prefix}",
            lambda: list(self._oss2.ObjectIteratorV2(bucket, prefix=prefix.key)),
        )

    def get_bytes(self, uri: OssUri) -> bytes:
        return self._retry(
            f"download {uri}", lambda: self.bucket(uri.bucket).get_object(uri.key).read()
        )

    def download(self, uri: OssUri, dest: Path) -> list[Path]:
        """An object to ``dest/<name>``, or every object under a prefix to ``dest/<relative>``.

        A key whose name under the prefix would land outside ``dest`` (``..``, ``//``, an
        absolute part: all legal in OSS) is refused (:class:`~paiexp.util.confine.Escape`) before
        any object is fetched."""
        if uri.key and not uri.key.endswith("/") and self.exists(uri):
            keys, prefix = [uri.key], uri.key[: uri.key.rfind("/") + 1]
        else:
            prefix = uri.as_dir().key
            keys = [k for k in self.list_keys(OssUri(uri.bucket, prefix)) if not k.endswith("/")]
        targets = {
            key: inside(dest, key[len(prefix) :], name=f"oss://{uri.bucket}/{key}") for key in keys
        }
        bucket = self.bucket(uri.bucket)
        written = []
        for key, target in targets.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            self._retry(
                f"download oss://{uri.bucket}/{key}",
                lambda key=key, target=target: self._oss2.resumable_download(
                    bucket, key, str(target), multiget_threshold=self.multipart_threshold
                ),
            )
            written.append(target)
        return written


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _CredentialsBridge:
    """oss2's credentials provider over the Alibaba Cloud credentials client (STS refresh)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def get_credentials(self) -> Any:
        import oss2

        current = self.client.get_credential()
        return oss2.credentials.Credentials(
            current.access_key_id, current.access_key_secret, current.security_token or ""
        )
