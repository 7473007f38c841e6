"""A local OSS server that speaks the real OSS wire protocol, so tests can drive the real oss2.

Path-style addressing (``http://127.0.0.1:PORT/<bucket>/<percent-encoded key>``, which is what
oss2 sends for an IP endpoint). Request signatures V1 (``OSS``), V2 (``OSS2``) and V4
(``OSS4-HMAC-SHA256``) are verified against the emulated account's :class:`Credentials`. Objects
live in the shared :class:`ObjectStore`; pending multipart uploads under
``<store root>/.multipart/<upload id>/``. Every request lands in the :class:`RequestLog`, and a
:class:`FaultPlan` injects server errors, throttling and dropped connections.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import itertools
import json
import re
import shutil
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email.utils import formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from .common import Credentials, Fault, FaultPlan, RequestLog, RequestRecord
from .http_server import ServiceHttpServer
from .store import ObjectInfo, ObjectStore, _atomic_write

MIN_PART_SIZE = 100 * 1024  # OSS rejects smaller parts (all but the last) at completion
MAX_PART_NUMBER = 10_000
LOCATION = "oss-cn-hangzhou"
OWNER_ID = "1700000000000000"

# Sub-resources that take part in a V1 signature: oss2 2.19.1, auth.ProviderAuth.
SUBRESOURCES = frozenset(
    """response-content-type response-content-language response-cache-control logging
    response-content-encoding acl uploadId uploads partNumber group link delete website location
    objectInfo objectMeta response-expires response-content-disposition cors lifecycle restore qos
    referer stat bucketInfo append position security-token live comp status vod startTime endTime
    x-oss-process symlink callback callback-var tagging encryption versions versioning versionId
    policy requestPayment x-oss-traffic-limit qosInfo asyncFetch x-oss-request-payer sequential
    inventory inventoryId continuation-token worm wormId wormExtend replication
    replicationLocation replicationProgress transferAcceleration cname metaQuery
    x-oss-ac-source-ip x-oss-ac-subnet-mask x-oss-ac-vpc-id x-oss-ac-forward-allow resourceGroup
    style styleName x-oss-async-process regionList x-oss-write-get-object-response
    bucketArchiveDirectRead httpsConfig redundancyTransition x-oss-target-redundancy-type
    x-oss-redundancy-transition-taskid accessPoint accessPointPolicy publicAccessBlock
    x-oss-access-point-name requesterQosInfo qosRequester resourcePoolInfo resourcePool
    resourcePoolBuckets""".split()  # noqa: SIM905 (a literal would take 90 lines)
)

# (method, object-level?, operation sub-resources) -> action
_ACTIONS = {
    ("GET", False, frozenset()): "ListObjects",
    ("GET", False, frozenset({"bucketInfo"})): "GetBucketInfo",
    ("PUT", False, frozenset()): "PutBucket",
    ("POST", False, frozenset({"delete"})): "DeleteMultipleObjects",
    ("PUT", True, frozenset()): "PutObject",
    ("GET", True, frozenset()): "GetObject",
    ("HEAD", True, frozenset()): "HeadObject",
    ("HEAD", True, frozenset({"objectMeta"})): "GetObjectMeta",
    ("DELETE", True, frozenset()): "DeleteObject",
    ("POST", True, frozenset({"uploads"})): "InitiateMultipartUpload",
    ("PUT", True, frozenset({"partNumber", "uploadId"})): "UploadPart",
    ("GET", True, frozenset({"uploadId"})): "ListParts",
    ("POST", True, frozenset({"uploadId"})): "CompleteMultipartUpload",
    ("DELETE", True, frozenset({"uploadId"})): "AbortMultipartUpload",
}
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
_RESPONSE_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}


class OssError(Exception):
    """An OSS error response: HTTP status, error code, message and extra ``<Error>`` fields."""

    def __init__(self, status: int, code: str, message: str, **extra: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra


def _no_such_key(key: str) -> OssError:
    return OssError(404, "NoSuchKey", "The specified key does not exist.", Key=key)


def _no_such_bucket(bucket: str) -> OssError:
    return OssError(404, "NoSuchBucket", "The specified bucket does not exist.", BucketName=bucket)


def _no_such_upload(upload_id: str) -> OssError:
    message = (
        "The specified upload does not exist. The upload ID may be invalid, or the upload may "
        "have been aborted or completed."
    )
    return OssError(404, "NoSuchUpload", message, UploadId=upload_id)


def _malformed_xml() -> OssError:
    message = (
        "The XML you provided was not well-formed or did not validate against our published schema."
    )
    return OssError(400, "MalformedXML", message)


def _invalid_argument(name: str, value: str, message: str) -> OssError:
    return OssError(400, "InvalidArgument", message, ArgumentName=name, ArgumentValue=value)


@dataclass
class _Request:
    method: str
    bucket: str
    key: str
    query: dict[str, str]
    headers: dict[str, str]  # names lower-cased
    body: bytes


@dataclass
class _Response:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass(frozen=True)
class _Signature:
    """A request's claimed signature and how the server recomputes it."""

    access_key_id: str
    provided: str
    string_to_sign: str
    sign: Callable[[str], str]  # secret -> expected signature
    extra: dict[str, str] = field(default_factory=dict)  # debugging fields for a mismatch


class OssServer:
    """The emulated OSS endpoint; bind happens at construction, so ``endpoint`` is known early."""

    def __init__(
        self,
        store: ObjectStore,
        credentials: Credentials,
        log: RequestLog,
        faults: FaultPlan | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.store = store
        self.credentials = credentials
        self.log = log
        self.faults = faults
        self._uploads = store.root / ".multipart"
        self._errors = itertools.count()
        self._httpd = _HttpServer((host, port), self)
        self._thread: threading.Thread | None = None
        self._operations: dict[str, Callable[[_Request], _Response]] = {
            "ListObjects": self._list_objects,
            "ListObjectsV2": self._list_objects_v2,
            "GetBucketInfo": self._get_bucket_info,
            "PutBucket": self._put_bucket,
            "DeleteMultipleObjects": self._delete_multiple_objects,
            "PutObject": self._put_object,
            "CopyObject": self._copy_object,
            "GetObject": self._get_object,
            "HeadObject": self._get_object,
            "GetObjectMeta": self._get_object_meta,
            "DeleteObject": self._delete_object,
            "InitiateMultipartUpload": self._initiate_multipart_upload,
            "UploadPart": self._upload_part,
            "ListParts": self._list_parts,
            "CompleteMultipartUpload": self._complete_multipart_upload,
            "AbortMultipartUpload": self._abort_multipart_upload,
        }

    @property
    def endpoint(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},  # stop() waits for the next poll
            name=f"oss-server {self.endpoint}",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the listening socket and all kept-alive connections."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()
        self._httpd.close_connections()

    def __enter__(self) -> OssServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # one request -----------------------------------------------------------------------------
    def serve(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> _Response | None:
        """Answer one HTTP request; None means: drop the connection without answering."""
        started = time.time()
        split = urlsplit(target)
        bucket, _, key = split.path.lstrip("/").partition("/")
        request = _Request(
            method=method,
            bucket=unquote(bucket),
            key=unquote(key),
            query=dict(parse_qsl(split.query, keep_blank_values=True)),
            headers=headers,
            body=body,
        )
        action = _action(request)
        request_id = uuid.uuid4().hex[:24].upper()
        fault, after = self.faults.draw() if self.faults is not None else (None, False)
        response: _Response | None = None
        if fault is None or after:
            response = self._process(request, action, request_id)
        elif fault != "drop":
            response = self._error(request, self._fault_error(fault), request_id)
        if fault == "drop":
            response = None
        if response is not None:
            response.headers["x-oss-request-id"] = request_id
        self.log.add(
            RequestRecord(
                time=started,
                service="oss",
                method=method,
                path=unquote(split.path),
                query=request.query,
                action=action,
                status=0 if response is None else response.status,
                fault=fault,
                bytes_in=len(body),
            )
        )
        return response

    def _fault_error(self, fault: Fault) -> OssError:
        if fault == "throttle":
            # What OSS answers past its QPS limit: alibabacloud.com/help/en/oss/support/
            # http-status-code-503 (TotalQpsLimitExceeded) and .../support/0004-00000302
            return OssError(
                503, "TotalQpsLimitExceeded", "Max total qps limit is exceeded", EC="0004-00000302"
            )
        if next(self._errors) % 2 == 0:
            return OssError(
                500, "InternalError", "We encountered an internal error. Please try again."
            )
        return OssError(503, "ServiceUnavailable", "Thread pool is almost full, please retry later")

    def _process(self, request: _Request, action: str, request_id: str) -> _Response:
        try:
            self._authenticate(request)
            operation = self._operations.get(action)
            if operation is None:
                asked = f"{request.method} {_resource(request)} {sorted(request.query)}"
                message = f"The OSS emulator does not implement this request: {asked}"
                raise OssError(501, "NotImplemented", message)
            if action != "PutBucket" and not self.store.bucket_exists(request.bucket):
                raise _no_such_bucket(request.bucket)
            return operation(request)
        except OssError as error:
            return self._error(request, error, request_id)
        except Exception as exc:  # an emulator bug: report it the way OSS reports its own failures
            failure = OssError(500, "InternalError", f"OSS emulator failure: {exc!r}")
            return self._error(request, failure, request_id)

    def _error(self, request: _Request, error: OssError, request_id: str) -> _Response:
        root = _node(
            "Error",
            None,
            _node("Code", error.code),
            _node("Message", error.message),
            _node("RequestId", request_id),
            _node("HostId", urlsplit(self.endpoint).netloc),
            *(_node(name, value) for name, value in error.extra.items()),
        )
        body = _xml(root)
        headers = {"Content-Type": "application/xml"}
        if "EC" in error.extra:
            headers["x-oss-ec"] = error.extra["EC"]
        if request.method == "HEAD":  # no body: OSS puts the error document in a header
            headers["x-oss-err"] = base64.b64encode(body).decode()
            return _Response(error.status, headers)
        return _Response(error.status, headers, body)

    # authentication --------------------------------------------------------------------------
    def _authenticate(self, request: _Request) -> None:
        signature = _parse_signature(request)
        credentials = self.credentials
        if signature.access_key_id != credentials.access_key_id:
            raise _invalid_access_key(signature.access_key_id)
        token = request.headers.get("x-oss-security-token")
        if token != credentials.security_token:
            if token is None or credentials.security_token is None:
                raise _invalid_access_key(signature.access_key_id)
            raise OssError(
                403, "InvalidSecurityToken", "The security token you provided is invalid."
            )
        expected = signature.sign(credentials.access_key_secret)
        if not hmac.compare_digest(expected.encode(), signature.provided.encode()):
            raise OssError(
                403,
                "SignatureDoesNotMatch",
                "The request signature we calculated does not match the signature you provided. "
                "Check your key and signing method.",
                OSSAccessKeyId=signature.access_key_id,
                SignatureProvided=signature.provided,
                StringToSign=signature.string_to_sign,
                **signature.extra,
            )

    # buckets ---------------------------------------------------------------------------------
    def _put_bucket(self, request: _Request) -> _Response:
        if not _BUCKET_NAME.fullmatch(request.bucket):
            raise OssError(
                400,
                "InvalidBucketName",
                "The specified bucket is not valid.",
                BucketName=request.bucket,
            )
        self.store.create_bucket(request.bucket)
        return _Response(headers={"Location": f"/{request.bucket}"})

    def _get_bucket_info(self, request: _Request) -> _Response:
        netloc = urlsplit(self.endpoint).netloc
        created = (self.store.root / request.bucket).stat().st_mtime
        bucket = _node(
            "Bucket",
            None,
            _node("AccessMonitor", "Disabled"),
            _node("CreationDate", _iso8601(created)),
            _node("ExtranetEndpoint", netloc),
            _node("IntranetEndpoint", netloc),
            _node("Location", LOCATION),
            _node("StorageClass", "Standard"),
            _node("Name", request.bucket),
            _node("DataRedundancyType", "LRS"),
            _owner(),
            _node("AccessControlList", None, _node("Grant", "private")),
            _node("Versioning", "Disabled"),
        )
        return _xml_response(_node("BucketInfo", None, bucket))

    def _list_objects(self, request: _Request) -> _Response:
        query = request.query
        encode = _encoder(query)
        prefix, delimiter, marker = (query.get(n, "") for n in ("prefix", "delimiter", "marker"))
        max_keys = _max_keys(query)
        objects, prefixes, truncated, last = self._list(
            request.bucket, prefix, delimiter, marker, max_keys
        )
        root = _node(
            "ListBucketResult",
            None,
            _node("Name", request.bucket),
            _node("Prefix", encode(prefix)),
            _node("Marker", encode(marker)),
            _node("MaxKeys", max_keys),
            _node("Delimiter", encode(delimiter)),
        )
        if "encoding-type" in query:
            root.append(_node("EncodingType", query["encoding-type"]))
        root.append(_node("IsTruncated", _bool(truncated)))
        if truncated:
            root.append(_node("NextMarker", encode(last)))
        root.extend(_contents(info, encode, owner=True) for info in objects)
        root.extend(_node("CommonPrefixes", None, _node("Prefix", encode(p))) for p in prefixes)
        return _xml_response(root)

    def _list_objects_v2(self, request: _Request) -> _Response:
        query = request.query
        encode = _encoder(query)
        prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
        token, start_after = query.get("continuation-token", ""), query.get("start-after", "")
        after = start_after
        if token:
            try:
                after = max(after, base64.urlsafe_b64decode(token.encode()).decode())
            except ValueError as exc:
                message = "The continuation token provided is incorrect"
                raise _invalid_argument("continuation-token", token, message) from exc
        max_keys = _max_keys(query)
        objects, prefixes, truncated, last = self._list(
            request.bucket, prefix, delimiter, after, max_keys
        )
        root = _node("ListBucketResult", None, _node("Name", request.bucket))
        root.append(_node("Prefix", encode(prefix)))
        if start_after:
            root.append(_node("StartAfter", encode(start_after)))
        if token:
            root.append(_node("ContinuationToken", encode(token)))
        root.append(_node("MaxKeys", max_keys))
        root.append(_node("Delimiter", encode(delimiter)))
        if "encoding-type" in query:
            root.append(_node("EncodingType", query["encoding-type"]))
        root.append(_node("IsTruncated", _bool(truncated)))
        if truncated:
            next_token = base64.urlsafe_b64encode(last.encode()).decode()
            root.append(_node("NextContinuationToken", encode(next_token)))
        root.append(_node("KeyCount", len(objects) + len(prefixes)))
        owner = query.get("fetch-owner") == "true"
        root.extend(_contents(info, encode, owner=owner) for info in objects)
        root.extend(_node("CommonPrefixes", None, _node("Prefix", encode(p))) for p in prefixes)
        return _xml_response(root)

    def _list(
        self, bucket: str, prefix: str, delimiter: str, after: str, max_keys: int
    ) -> tuple[list[ObjectInfo], list[str], bool, str]:
        """One page: objects, common prefixes, whether more follow, and the page's last entry."""
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        last = after
        for key in self.store.keys(bucket, prefix):
            if key <= after:
                continue
            cut = key.find(delimiter, len(prefix)) if delimiter else -1
            common = key[: cut + len(delimiter)] if cut >= 0 else None
            if common is not None and (common <= after or (prefixes and prefixes[-1] == common)):
                continue  # rolled up into a common prefix already listed
            if len(objects) + len(prefixes) >= max_keys:
                return objects, prefixes, True, last
            if common is not None:
                prefixes.append(common)
                last = common
            elif (info := self.store.head(bucket, key)) is not None:
                objects.append(info)
                last = key
        return objects, prefixes, False, last

    def _delete_multiple_objects(self, request: _Request) -> _Response:
        _check_md5(request)
        root = _parse_xml(request.body, "Delete")
        keys = [node.findtext("Key") or "" for node in root.findall("Object")]
        if not keys or len(keys) > 1000 or "" in keys:
            raise _malformed_xml()
        for key in keys:
            self.store.delete(request.bucket, key)
        encode = _encoder(request.query)
        result = _node("DeleteResult")
        if "encoding-type" in request.query:
            result.append(_node("EncodingType", request.query["encoding-type"]))
        if (root.findtext("Quiet") or "false").lower() != "true":
            result.extend(_node("Deleted", None, _node("Key", encode(key))) for key in keys)
        return _xml_response(result)

    # objects ---------------------------------------------------------------------------------
    def _put_object(self, request: _Request) -> _Response:
        _check_md5(request)
        forbid = request.headers.get("x-oss-forbid-overwrite", "").lower() == "true"
        if forbid and self.store.head(request.bucket, request.key) is not None:
            message = "The object you specified already exists and can not be overwritten."
            raise OssError(409, "FileAlreadyExists", message)
        info = self.store.put(
            request.bucket,
            request.key,
            request.body,
            content_type=_content_type(request),
            metadata=_metadata(request),
        )
        return _Response(headers={"ETag": f'"{info.etag}"'})

    def _copy_object(self, request: _Request) -> _Response:
        source = request.headers["x-oss-copy-source"].split("?", 1)[0]
        raw_bucket, _, raw_key = source.lstrip("/").partition("/")
        source_bucket, source_key = unquote(raw_bucket), unquote(raw_key)
        if not self.store.bucket_exists(source_bucket):
            raise _no_such_bucket(source_bucket)
        info = self.store.head(source_bucket, source_key)
        data = self.store.get(source_bucket, source_key)
        if info is None or data is None:
            raise _no_such_key(source_key)
        replace = request.headers.get("x-oss-metadata-directive", "").upper() == "REPLACE"
        copied = self.store.put(
            request.bucket,
            request.key,
            data,
            content_type=_content_type(request) if replace else info.content_type,
            metadata=_metadata(request) if replace else info.metadata,
            etag=info.etag,
        )
        root = _node(
            "CopyObjectResult",
            None,
            _node("ETag", f'"{copied.etag}"'),
            _node("LastModified", _iso8601(copied.last_modified)),
        )
        response = _xml_response(root)
        response.headers["ETag"] = f'"{copied.etag}"'
        return response

    def _object(self, request: _Request) -> ObjectInfo:
        info = self.store.head(request.bucket, request.key)
        if info is None:
            raise _no_such_key(request.key)
        return info

    def _get_object(self, request: _Request) -> _Response:
        info = self._object(request)
        headers = {
            "Content-Type": info.content_type,
            "ETag": f'"{info.etag}"',
            "Last-Modified": formatdate(info.last_modified, usegmt=True),
            "Accept-Ranges": "bytes",
            "x-oss-object-type": "Multipart" if "-" in info.etag else "Normal",
            "x-oss-storage-class": "Standard",
        }
        headers.update({f"x-oss-meta-{k}": v for k, v in info.metadata.items()})
        if _not_modified(request.headers, info):
            return _Response(304, {"ETag": headers["ETag"]})
        if request.method == "HEAD":
            headers["Content-Length"] = str(info.size)
            return _Response(headers=headers)
        data = self.store.get(request.bucket, request.key)
        if data is None:
            raise _no_such_key(request.key)
        for name, header in _RESPONSE_OVERRIDES.items():
            if name in request.query:
                headers[header] = request.query[name]
        byte_range = _byte_range(request.headers.get("range"), len(data))
        if byte_range is None:
            return _Response(200, headers, data)
        start, end = byte_range
        headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        return _Response(206, headers, data[start : end + 1])

    def _get_object_meta(self, request: _Request) -> _Response:
        info = self._object(request)
        headers = {
            "ETag": f'"{info.etag}"',
            "Last-Modified": formatdate(info.last_modified, usegmt=True),
            "Content-Length": str(info.size),
        }
        return _Response(headers=headers)

    def _delete_object(self, request: _Request) -> _Response:
        self.store.delete(request.bucket, request.key)
        return _Response(204)

    # multipart uploads -----------------------------------------------------------------------
    def _upload(self, request: _Request) -> tuple[Path, dict[str, Any]]:
        """The pending upload named by ``uploadId`` (its directory and record)."""
        upload_id = request.query.get("uploadId", "")
        directory = self._uploads / upload_id
        record: dict[str, Any] = {}
        if upload_id.isalnum():  # never a path outside the uploads directory
            with contextlib.suppress(FileNotFoundError):
                record = json.loads((directory / "upload.json").read_bytes())
        if [record.get("bucket"), record.get("key")] != [request.bucket, request.key]:
            raise _no_such_upload(upload_id)
        return directory, record

    def _initiate_multipart_upload(self, request: _Request) -> _Response:
        upload_id = uuid.uuid4().hex.upper()
        record = {
            "bucket": request.bucket,
            "key": request.key,
            "content_type": _content_type(request),
            "metadata": _metadata(request),
            "initiated": time.time(),
        }
        _atomic_write(self._uploads / upload_id / "upload.json", json.dumps(record).encode())
        encode = _encoder(request.query)
        root = _node(
            "InitiateMultipartUploadResult",
            None,
            _node("Bucket", request.bucket),
            _node("Key", encode(request.key)),
            _node("UploadId", upload_id),
        )
        return _xml_response(root)

    def _upload_part(self, request: _Request) -> _Response:
        raw_number = request.query["partNumber"]
        if not raw_number.isdigit() or not 1 <= int(raw_number) <= MAX_PART_NUMBER:
            message = "Part number must be an integer between 1 and 10000, inclusive."
            raise _invalid_argument("partNumber", raw_number, message)
        if "x-oss-copy-source" in request.headers:
            raise OssError(
                501, "NotImplemented", "The OSS emulator does not implement UploadPartCopy."
            )
        directory, _ = self._upload(request)
        _check_md5(request)
        _atomic_write(directory / f"part-{int(raw_number):05d}", request.body)
        return _Response(headers={"ETag": f'"{_md5_hex(request.body)}"'})

    def _list_parts(self, request: _Request) -> _Response:
        directory, _ = self._upload(request)
        marker = _int_argument(request.query, "part-number-marker", 0, 0, MAX_PART_NUMBER)
        max_parts = _int_argument(request.query, "max-parts", 1000, 1, 1000)
        parts = _parts(directory)
        numbers = sorted(n for n in parts if n > marker)
        page = numbers[:max_parts]
        root = _node(
            "ListPartsResult",
            None,
            _node("Bucket", request.bucket),
            _node("Key", request.key),
            _node("UploadId", request.query["uploadId"]),
            _node("PartNumberMarker", marker),
            _node("NextPartNumberMarker", page[-1] if page else marker),
            _node("MaxParts", max_parts),
            _node("IsTruncated", _bool(len(numbers) > max_parts)),
        )
        for number in page:
            path = parts[number]
            data = path.read_bytes()
            root.append(
                _node(
                    "Part",
                    None,
                    _node("PartNumber", number),
                    _node("LastModified", _iso8601(path.stat().st_mtime)),
                    _node("ETag", f'"{_md5_hex(data)}"'),
                    _node("Size", len(data)),
                )
            )
        return _xml_response(root)

    def _complete_multipart_upload(self, request: _Request) -> _Response:
        directory, record = self._upload(request)
        parts = _parts(directory)
        chosen: list[tuple[int, str | None]]
        if request.headers.get("x-oss-complete-all", "").lower() == "yes":
            chosen = [(number, None) for number in sorted(parts)]
        else:
            chosen = _completion_list(request.body)
        blobs: list[bytes] = []
        digests: list[str] = []
        for number, etag in chosen:
            data = parts[number].read_bytes() if number in parts else b""
            digest = _md5_hex(data)
            if number not in parts or etag not in (None, digest):
                raise OssError(
                    400,
                    "InvalidPart",
                    "One or more of the specified parts could not be found or the specified "
                    "entity tag might not have matched the part's entity tag.",
                    PartNumber=str(number),
                    UploadId=request.query["uploadId"],
                )
            blobs.append(data)
            digests.append(digest)
        if not blobs:
            raise _malformed_xml()
        if any(len(blob) < MIN_PART_SIZE for blob in blobs[:-1]):
            message = "Your proposed upload smaller than the minimum allowed size."
            raise OssError(400, "EntityTooSmall", message)
        etag = f"{hashlib.md5(bytes.fromhex(''.join(digests))).hexdigest().upper()}-{len(blobs)}"
        self.store.put(
            request.bucket,
            request.key,
            b"".join(blobs),
            content_type=record["content_type"],
            metadata=record["metadata"],
            etag=etag,
        )
        shutil.rmtree(directory, ignore_errors=True)
        encode = _encoder(request.query)
        root = _node("CompleteMultipartUploadResult")
        if "encoding-type" in request.query:
            root.append(_node("EncodingType", request.query["encoding-type"]))
        root.extend(
            [
                _node("Location", f"{self.endpoint}/{request.bucket}/{quote(request.key)}"),
                _node("Bucket", request.bucket),
                _node("Key", encode(request.key)),
                _node("ETag", f'"{etag}"'),
            ]
        )
        response = _xml_response(root)
        response.headers["ETag"] = f'"{etag}"'
        return response

    def _abort_multipart_upload(self, request: _Request) -> _Response:
        directory, _ = self._upload(request)
        shutil.rmtree(directory, ignore_errors=True)
        return _Response(204)


# request helpers ---------------------------------------------------------------------------------
def _action(request: _Request) -> str:
    """The OSS API action a request asks for ("Unsupported" when the emulator lacks it)."""
    if not request.bucket:
        return "Unsupported"
    operation = frozenset(
        name
        for name in request.query
        if name in SUBRESOURCES and name not in _RESPONSE_OVERRIDES and name != "continuation-token"
    )
    action = _ACTIONS.get((request.method, bool(request.key), operation), "Unsupported")
    if action == "ListObjects" and request.query.get("list-type") == "2":
        return "ListObjectsV2"
    if action == "PutObject" and "x-oss-copy-source" in request.headers:
        return "CopyObject"
    return action


def _content_type(request: _Request) -> str:
    return request.headers.get("content-type") or "application/octet-stream"


def _metadata(request: _Request) -> dict[str, str]:
    prefix = "x-oss-meta-"
    return {k[len(prefix) :]: v for k, v in request.headers.items() if k.startswith(prefix)}


def _md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest().upper()


def _check_md5(request: _Request) -> None:
    claimed = request.headers.get("content-md5")
    if claimed is None:
        return
    try:
        matches = base64.b64decode(claimed, validate=True) == hashlib.md5(request.body).digest()
    except ValueError:
        matches = False
    if not matches:
        raise OssError(400, "InvalidDigest", "The Content-MD5 you specified was invalid.")


def _int_argument(query: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name) or str(default)
    if not raw.isdigit() or not low <= int(raw) <= high:
        message = f"Argument {name} must be an integer between {low} and {high}."
        raise _invalid_argument(name, raw, message)
    return int(raw)


def _max_keys(query: dict[str, str]) -> int:
    return _int_argument(query, "max-keys", 100, 1, 1000)


def _encoder(query: dict[str, str]) -> Callable[[str], str]:
    if query.get("encoding-type") == "url":
        return lambda text: quote(text, safe="")
    return lambda text: text


def _parse_xml(body: bytes, tag: str) -> ET.Element:
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        raise _malformed_xml() from None
    if root.tag != tag:
        raise _malformed_xml()
    return root


def _completion_list(body: bytes) -> list[tuple[int, str | None]]:
    """The (part number, ETag) list of a CompleteMultipartUpload body, in ascending order."""
    chosen: list[tuple[int, str | None]] = []
    for node in _parse_xml(body, "CompleteMultipartUpload").findall("Part"):
        raw = (node.findtext("PartNumber") or "").strip()
        if not raw.isdigit():
            raise _malformed_xml()
        number = int(raw)
        if chosen and number <= chosen[-1][0]:
            raise OssError(
                400,
                "InvalidPartOrder",
                "The list of parts was not in ascending order. Parts list must be specified in "
                "order by part number.",
            )
        chosen.append((number, (node.findtext("ETag") or "").strip().strip('"').upper()))
    return chosen


def _parts(directory: Path) -> dict[int, Path]:
    return {int(path.name[len("part-") :]): path for path in directory.glob("part-*")}


def _http_time(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


def _not_modified(headers: dict[str, str], info: ObjectInfo) -> bool:
    """Evaluate the conditional headers: True means 304; a failed precondition raises 412."""
    modified = int(info.last_modified)  # Last-Modified has whole seconds
    if_match = headers.get("if-match")
    unmodified_since = _http_time(headers.get("if-unmodified-since"))
    if (if_match is not None and if_match.strip('"') != info.etag) or (
        unmodified_since is not None and modified > unmodified_since
    ):
        message = "At least one of the pre-conditions you specified did not hold."
        raise OssError(412, "PreconditionFailed", message)
    if_none_match = headers.get("if-none-match")
    modified_since = _http_time(headers.get("if-modified-since"))
    return (if_none_match is not None and if_none_match.strip('"') == info.etag) or (
        modified_since is not None and modified <= modified_since
    )


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The inclusive range a ``Range`` header asks for, or None for the whole object: by default
    OSS ignores a range it cannot satisfy (or parse) and answers 200 with everything."""
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, _, last = header[len("bytes=") :].strip().partition("-")
    try:
        if first:
            start, end = int(first), int(last) if last else size - 1
        else:
            start, end = max(size - int(last), 0), size - 1
    except ValueError:
        return None
    if not 0 <= start <= end < size:
        return None
    return start, end


# signatures --------------------------------------------------------------------------------------
def _invalid_access_key(access_key_id: str) -> OssError:
    return OssError(
        403,
        "InvalidAccessKeyId",
        "The OSS Access Key Id you provided does not exist in our records.",
        OSSAccessKeyId=access_key_id,
    )


def _parse_signature(request: _Request) -> _Signature:
    header = request.headers.get("authorization")
    if not header:
        raise OssError(
            403, "AccessDenied", "You have no right to access this object because of bucket acl."
        )
    scheme, _, credential = header.partition(" ")
    if scheme == "OSS" and ":" in credential:
        access_key_id, _, provided = credential.rpartition(":")
        return _v1_signature(request, access_key_id, provided)
    separator = ":" if scheme == "OSS2" else "="
    fields: dict[str, str] = {}
    for part in credential.split(","):
        name, _, value = part.strip().partition(separator)
        fields[name] = value
    if scheme == "OSS2" and {"AccessKeyId", "Signature"} <= fields.keys():
        return _v2_signature(request, fields)
    if scheme == "OSS4-HMAC-SHA256" and {"Credential", "Signature"} <= fields.keys():
        return _v4_signature(request, fields)
    raise OssError(400, "InvalidArgument", "Authorization header is invalid.")


def _resource(request: _Request) -> str:
    return f"/{request.bucket}/{request.key}" if request.bucket else "/"


def _query_string(pairs: Iterable[tuple[str, str]]) -> str:
    return "&".join(f"{k}={v}" if v else k for k, v in sorted(pairs))


def _v1_signature(request: _Request, access_key_id: str, provided: str) -> _Signature:
    headers = request.headers
    canonical_headers = "".join(
        f"{k}:{v}\n" for k, v in sorted(headers.items()) if k.startswith("x-oss-")
    )
    subresources = _query_string((k, v) for k, v in request.query.items() if k in SUBRESOURCES)
    resource = _resource(request) + (f"?{subresources}" if subresources else "")
    date = headers.get("x-oss-date") or headers.get("date", "")
    string_to_sign = "\n".join(
        [
            request.method,
            headers.get("content-md5", ""),
            headers.get("content-type", ""),
            date,
            canonical_headers + resource,
        ]
    )

    def sign(secret: str) -> str:
        digest = hmac.new(secret.encode(), string_to_sign.encode(), hashlib.sha1).digest()
        return base64.b64encode(digest).decode()

    return _Signature(access_key_id, provided, string_to_sign, sign)


def _v2_signature(request: _Request, fields: dict[str, str]) -> _Signature:
    headers = request.headers
    additional = sorted(h.lower() for h in fields.get("AdditionalHeaders", "").split(";") if h)
    canonical_headers = "".join(
        f"{k}:{v}\n"
        for k, v in sorted(headers.items())
        if k.startswith("x-oss-") or k in additional
    )
    query = _query_string((quote(k, safe=""), quote(v, safe="")) for k, v in request.query.items())
    resource = quote(_resource(request), safe="") + (f"?{query}" if query else "")
    string_to_sign = "\n".join(
        [
            request.method,
            headers.get("content-md5", ""),
            headers.get("content-type", ""),
            headers.get("date", ""),
            canonical_headers + ";".join(additional),
            resource,
        ]
    )

    def sign(secret: str) -> str:
        digest = hmac.new(secret.encode(), string_to_sign.encode(), hashlib.sha256).digest()
        return base64.b64encode(digest).decode()

    return _Signature(fields["AccessKeyId"], fields["Signature"], string_to_sign, sign)


def _v4_signature(request: _Request, fields: dict[str, str]) -> _Signature:
    headers = request.headers
    access_key_id, _, scope = fields["Credential"].partition("/")
    scope_parts = scope.split("/")
    if len(scope_parts) != 4 or scope_parts[3] != "aliyun_v4_request":
        raise OssError(400, "InvalidArgument", "Invalid credential scope in Authorization header.")
    additional = sorted(h.lower() for h in fields.get("AdditionalHeaders", "").split(";") if h)
    signed_headers = "".join(
        f"{k}:{v}\n"
        for k, v in sorted(headers.items())
        if k.startswith("x-oss-") or k in ("content-type", "content-md5") or k in additional
    )
    canonical_request = "\n".join(
        [
            request.method,
            quote(_resource(request), safe="/"),
            _query_string((quote(k, safe=""), quote(v, safe="")) for k, v in request.query.items()),
            signed_headers,
            ";".join(additional),
            headers.get("x-oss-content-sha256", "UNSIGNED-PAYLOAD"),
        ]
    )
    string_to_sign = "\n".join(
        [
            "OSS4-HMAC-SHA256",
            headers.get("x-oss-date", ""),
            scope,
            hashlib.sha256(canonical_request.encode()).hexdigest(),
        ]
    )

    def sign(secret: str) -> str:
        key = ("aliyun_v4" + secret).encode()
        for part in scope_parts:
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()

    extra = {"CanonicalRequest": canonical_request}
    return _Signature(access_key_id, fields["Signature"], string_to_sign, sign, extra)


# XML -----------------------------------------------------------------------------------------
def _node(tag: str, text: object = None, *children: ET.Element) -> ET.Element:
    element = ET.Element(tag)
    if text is not None:
        element.text = str(text)
    element.extend(children)
    return element


def _xml(root: ET.Element) -> bytes:
    return (
        b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode").encode()
    )


def _xml_response(root: ET.Element) -> _Response:
    return _Response(200, {"Content-Type": "application/xml"}, _xml(root))


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _iso8601(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(timestamp))


def _owner() -> ET.Element:
    return _node("Owner", None, _node("ID", OWNER_ID), _node("DisplayName", OWNER_ID))


def _contents(info: ObjectInfo, encode: Callable[[str], str], *, owner: bool) -> ET.Element:
    node = _node(
        "Contents",
        None,
        _node("Key", encode(info.key)),
        _node("LastModified", _iso8601(info.last_modified)),
        _node("ETag", f'"{info.etag}"'),
        _node("Type", "Multipart" if "-" in info.etag else "Normal"),
        _node("Size", info.size),
        _node("StorageClass", "Standard"),
    )
    if owner:
        node.append(_owner())
    return node


# HTTP ------------------------------------------------------------------------------------------
class _HttpServer(ServiceHttpServer):
    def __init__(self, address: tuple[str, int], app: OssServer) -> None:
        self.app = app
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as oss2's requests.Session expects
    server_version = "AliyunOSS"
    sys_version = ""
    timeout = 120
    disable_nagle_algorithm = True  # headers and body go out in two writes
    server: _HttpServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the RequestLog records every request."""

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        body = self._read_body()  # always the whole body, so the connection stays in step
        headers = {name.lower(): value for name, value in self.headers.items()}
        response = self.server.app.serve(self.command, self.path, headers, body)
        if response is None:
            self.close_connection = True  # drop: no status line, the socket just closes
            return
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        if "Content-Length" not in response.headers and response.status not in (204, 304):
            self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if self.command != "HEAD" and response.body:
            self.wfile.write(response.body)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle
