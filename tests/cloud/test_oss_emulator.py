"""The OSS emulator, driven by the real oss2 client over real HTTP on 127.0.0.1."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import oss2
import pytest
from emulator.common import Credentials, FaultPlan, RequestLog
from emulator.oss_server import OssServer
from emulator.store import ObjectStore

BUCKET = "bucket"
KEY = "dir/sub dir/naïve+file.txt"  # a space, a plus, non-ASCII and slashes: all percent-encoded
CREDENTIALS = Credentials()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[OssServer]:
    store = ObjectStore(tmp_path / "oss")
    store.create_bucket(BUCKET)
    with OssServer(store, CREDENTIALS, RequestLog()) as running:
        yield running


def bucket_for(
    server: OssServer,
    auth: oss2.Auth | oss2.AuthV2 | oss2.AuthV4 | oss2.StsAuth | oss2.AnonymousAuth | None = None,
    name: str = BUCKET,
    region: str | None = None,
) -> oss2.Bucket:
    auth = auth or oss2.Auth(CREDENTIALS.access_key_id, CREDENTIALS.access_key_secret)
    return oss2.Bucket(auth, server.endpoint, name, region=region)


def actions(server: OssServer) -> list[str]:
    return [record.action for record in server.log.records("oss")]


def test_put_get_head_and_meta_with_metadata(server: OssServer) -> None:
    bucket = bucket_for(server)
    data = b"hello, emulated OSS"
    put = bucket.put_object(
        KEY, data, headers={"Content-Type": "text/plain", "x-oss-meta-Owner": "alice"}
    )
    etag = hashlib.md5(data).hexdigest().upper()
    assert put.status == 200 and put.etag == etag

    got = bucket.get_object(KEY)
    assert got.read() == data
    assert got.content_type == "text/plain"
    assert got.headers["x-oss-meta-owner"] == "alice"

    head = bucket.head_object(KEY)
    assert (head.content_length, head.etag, head.object_type) == (len(data), etag, "Normal")
    assert abs(head.last_modified - time.time()) < 5

    meta = bucket.get_object_meta(KEY)
    assert (meta.content_length, meta.etag) == (len(data), etag)
    assert bucket.object_exists(KEY) and not bucket.object_exists("missing")

    stored = server.store.head(BUCKET, KEY)
    assert stored is not None and stored.metadata == {"owner": "alice"}
    assert actions(server)[:4] == ["PutObject", "GetObject", "HeadObject", "GetObjectMeta"]
    assert server.log.records("oss")[0].path == f"/{BUCKET}/{KEY}"


def test_errors_for_missing_objects_buckets_and_bad_digests(server: OssServer) -> None:
    bucket = bucket_for(server)
    with pytest.raises(oss2.exceptions.NoSuchKey) as missing:
        bucket.get_object("missing")
    assert missing.value.request_id and missing.value.details["Key"] == "missing"
    with pytest.raises(oss2.exceptions.NoSuchKey):
        bucket.head_object("missing")  # HEAD: the error document travels in x-oss-err
    with pytest.raises(oss2.exceptions.NoSuchBucket):
        bucket_for(server, name="no-such-bucket").put_object("k", b"x")
    with pytest.raises(oss2.exceptions.InvalidDigest):
        bucket.put_object("k", b"x", headers={"Content-MD5": oss2.utils.content_md5(b"y")})
    assert bucket.delete_object("never-there").status == 204
    assert server.store.head(BUCKET, "k") is None


def test_range_get(server: OssServer) -> None:
    bucket = bucket_for(server)
    bucket.put_object("digits", b"0123456789")
    middle = bucket.get_object("digits", byte_range=(2, 5))
    assert (middle.status, middle.read(), middle.content_range) == (206, b"2345", "bytes 2-5/10")
    assert bucket.get_object("digits", byte_range=(None, 3)).read() == b"789"
    assert bucket.get_object("digits", byte_range=(7, None)).read() == b"789"
    beyond = bucket.get_object("digits", byte_range=(5, 100))  # OSS ignores what it can't serve
    assert (beyond.status, beyond.read()) == (200, b"0123456789")


def test_list_objects_v2_pagination_and_delimiter(server: OssServer) -> None:
    bucket = bucket_for(server)
    keys = ["a/1", "a/2", "b/x/1", "c", "d", "e/1"]
    for key in keys:
        bucket.put_object(key, key.encode())

    first = bucket.list_objects_v2(max_keys=4)
    assert [o.key for o in first.object_list] == keys[:4] and first.is_truncated
    rest = bucket.list_objects_v2(max_keys=4, continuation_token=first.next_continuation_token)
    assert [o.key for o in rest.object_list] == keys[4:] and not rest.is_truncated
    assert rest.object_list[0].size == 1 and rest.object_list[0].etag

    assert [o.key for o in oss2.ObjectIteratorV2(bucket, max_keys=2)] == keys
    listed = [
        (o.key, o.is_prefix()) for o in oss2.ObjectIteratorV2(bucket, delimiter="/", max_keys=2)
    ]
    assert listed == [("a/", True), ("b/", True), ("c", False), ("d", False), ("e/", True)]
    nested = bucket.list_objects_v2(prefix="b/", delimiter="/")
    assert nested.prefix_list == ["b/x/"] and nested.object_list == []

    after = bucket.list_objects_v2(start_after="b/x/1", fetch_owner=True)
    assert [o.key for o in after.object_list] == ["c", "d", "e/1"]
    assert after.object_list[0].owner is not None
    assert [o.key for o in oss2.ObjectIterator(bucket, delimiter="/", max_keys=1)] == [
        "a/",
        "b/",
        "c",
        "d",
        "e/",
    ]
    assert "ListObjectsV2" in actions(server) and "ListObjects" in actions(server)


def test_batch_delete_copy_and_bucket_info(server: OssServer) -> None:
    bucket = bucket_for(server)
    for key in ("k1", "k2", "k3"):
        bucket.put_object(key, key.encode(), headers={"x-oss-meta-tag": key})
    deleted = bucket.batch_delete_objects(["k1", "k2", "missing"])
    assert sorted(deleted.deleted_keys) == ["k1", "k2", "missing"]
    assert list(server.store.keys(BUCKET)) == ["k3"]

    copied = bucket.copy_object(BUCKET, "k3", "copies/k3")
    assert copied.etag == hashlib.md5(b"k3").hexdigest().upper()
    assert bucket.get_object("copies/k3").headers["x-oss-meta-tag"] == "k3"

    fresh = bucket_for(server, name="fresh-bucket")
    fresh.create_bucket()
    info = fresh.get_bucket_info()
    assert (info.name, info.storage_class) == ("fresh-bucket", "Standard")
    assert actions(server).count("DeleteMultipleObjects") == 1 and "CopyObject" in actions(server)


def test_resumable_upload_and_download_use_multipart_and_ranges(
    server: OssServer, tmp_path: Path
) -> None:
    bucket = bucket_for(server)
    data = os.urandom(350 * 1024)
    source = tmp_path / "model.bin"
    source.write_bytes(data)
    oss2.resumable_upload(
        bucket,
        "models/model.bin",
        str(source),
        store=oss2.ResumableStore(root=str(tmp_path / "resume")),
        multipart_threshold=100 * 1024,
        part_size=100 * 1024,
        num_threads=2,
    )
    uploaded = actions(server)
    assert uploaded[:2] == ["InitiateMultipartUpload", "ListParts"]
    assert uploaded[2:] == ["UploadPart"] * 4 + ["CompleteMultipartUpload"]
    assert [r.bytes_in for r in server.log.records("oss", "UploadPart")].count(100 * 1024) == 3

    digests = b"".join(
        hashlib.md5(data[i : i + 100 * 1024]).digest() for i in range(0, len(data), 100 * 1024)
    )
    head = bucket.head_object("models/model.bin")
    assert head.etag == hashlib.md5(digests).hexdigest().upper() + "-4"
    assert head.object_type == "Multipart"
    assert server.store.get(BUCKET, "models/model.bin") == data
    assert not any((server.store.root / ".multipart").iterdir())

    server.log.clear()
    target = tmp_path / "downloaded.bin"
    oss2.resumable_download(
        bucket,
        "models/model.bin",
        str(target),
        store=oss2.ResumableDownloadStore(root=str(tmp_path / "resume")),
        multiget_threshold=100 * 1024,
        part_size=100 * 1024,
        num_threads=2,
    )
    assert target.read_bytes() == data
    gets = server.log.records("oss", "GetObject")
    assert actions(server)[0] == "HeadObject" and [r.status for r in gets] == [206] * 4


def test_multipart_validation(server: OssServer) -> None:
    bucket = bucket_for(server)
    upload_id = bucket.init_multipart_upload("parts").upload_id
    small = bucket.upload_part("parts", upload_id, 1, b"tiny")
    last = bucket.upload_part("parts", upload_id, 2, b"end")
    assert [p.part_number for p in bucket.list_parts("parts", upload_id).parts] == [1, 2]

    with pytest.raises(oss2.exceptions.ServerError) as too_small:
        bucket.complete_multipart_upload(
            "parts",
            upload_id,
            [oss2.models.PartInfo(1, small.etag), oss2.models.PartInfo(2, last.etag)],
        )
    assert (too_small.value.status, too_small.value.code) == (400, "EntityTooSmall")
    with pytest.raises(oss2.exceptions.ServerError) as wrong_etag:
        bucket.complete_multipart_upload("parts", upload_id, [oss2.models.PartInfo(1, "0" * 32)])
    assert wrong_etag.value.code == "InvalidPart"

    one = bucket.complete_multipart_upload(
        "parts", upload_id, [oss2.models.PartInfo(1, small.etag)]
    )
    assert bucket.get_object("parts").read() == b"tiny" and one.etag.endswith("-1")
    with pytest.raises(oss2.exceptions.NoSuchUpload):
        bucket.upload_part("parts", upload_id, 3, b"late")

    aborted = bucket.init_multipart_upload("parts").upload_id
    assert bucket.abort_multipart_upload("parts", aborted).status == 204
    with pytest.raises(oss2.exceptions.NoSuchUpload):
        bucket.list_parts("parts", aborted)


@pytest.mark.parametrize("version", ["v2", "v4"])
def test_other_signature_versions(server: OssServer, version: str) -> None:
    ak, secret = CREDENTIALS.access_key_id, CREDENTIALS.access_key_secret
    auth = oss2.AuthV2(ak, secret) if version == "v2" else oss2.AuthV4(ak, secret)
    bucket = bucket_for(server, auth, region="cn-hangzhou")
    bucket.put_object(KEY, b"signed", headers={"x-oss-meta-v": version})
    assert bucket.get_object(KEY, byte_range=(0, 3)).read() == b"sign"
    assert [o.key for o in bucket.list_objects_v2(prefix="dir/sub dir/").object_list] == [KEY]
    wrong = oss2.AuthV2(ak, "x") if version == "v2" else oss2.AuthV4(ak, "x")
    with pytest.raises(oss2.exceptions.SignatureDoesNotMatch):
        bucket_for(server, wrong, region="cn-hangzhou").get_object(KEY)


def test_wrong_secret_is_rejected_without_leaking_it(server: OssServer) -> None:
    bucket = bucket_for(server, oss2.Auth(CREDENTIALS.access_key_id, "not-the-secret"))
    with pytest.raises(oss2.exceptions.ServerError) as error:
        bucket.put_object("k", b"x")
    assert (error.value.status, error.value.code) == (403, "SignatureDoesNotMatch")
    assert CREDENTIALS.access_key_secret not in str(error.value)
    assert "not-the-secret" not in str(error.value)
    assert server.store.head(BUCKET, "k") is None


def test_unknown_key_id_and_anonymous_requests_are_rejected(server: OssServer) -> None:
    with pytest.raises(oss2.exceptions.ServerError) as unknown:
        bucket_for(server, oss2.Auth("LTAI-unknown", CREDENTIALS.access_key_secret)).get_object("k")
    assert (unknown.value.status, unknown.value.code) == (403, "InvalidAccessKeyId")
    with pytest.raises(oss2.exceptions.AccessDenied):
        bucket_for(server, oss2.AnonymousAuth()).get_object("k")


def test_security_token_is_required_when_the_credentials_have_one(tmp_path: Path) -> None:
    store = ObjectStore(tmp_path)
    store.create_bucket(BUCKET)
    sts = Credentials("STS.key", "sts-secret", security_token="token-1")
    with OssServer(store, sts, RequestLog()) as server:
        good = bucket_for(server, oss2.StsAuth("STS.key", "sts-secret", "token-1"))
        assert good.put_object("k", b"x").status == 200
        with pytest.raises(oss2.exceptions.ServerError) as missing:
            bucket_for(server, oss2.Auth("STS.key", "sts-secret")).get_object("k")
        assert missing.value.code == "InvalidAccessKeyId"
        with pytest.raises(oss2.exceptions.ServerError) as wrong:
            bucket_for(server, oss2.StsAuth("STS.key", "sts-secret", "token-2")).get_object("k")
        assert wrong.value.code == "InvalidSecurityToken"


def test_error_fault_answers_5xx_without_storing(server: OssServer) -> None:
    bucket = bucket_for(server)
    server.faults = FaultPlan(rate=1.0, kinds=("error",))
    statuses = set()
    for _ in range(2):
        with pytest.raises(oss2.exceptions.ServerError) as error:
            bucket.put_object("k", b"x" * 1000)
        statuses.add(error.value.status)
        assert error.value.code in ("InternalError", "ServiceUnavailable")
    assert statuses == {500, 503}
    assert server.store.head(BUCKET, "k") is None
    assert [r.fault for r in server.log.records("oss")] == ["error", "error"]

    server.faults = None  # the kept-alive connection is still in step
    assert bucket.put_object("k", b"x").status == 200


def test_throttle_fault_is_the_oss_qps_limit_error(server: OssServer) -> None:
    server.faults = FaultPlan(rate=1.0, kinds=("throttle",))
    with pytest.raises(oss2.exceptions.ServerError) as error:
        bucket_for(server).put_object("k", b"x")
    assert (error.value.status, error.value.code) == (503, "TotalQpsLimitExceeded")
    assert error.value.ec == "0004-00000302"
    assert server.store.head(BUCKET, "k") is None


def test_drop_fault_closes_the_connection(server: OssServer) -> None:
    bucket = bucket_for(server)
    server.faults = FaultPlan(rate=1.0, kinds=("drop",), seed=3)
    for index in range(8):
        with pytest.raises(oss2.exceptions.RequestError):
            bucket.put_object(f"k{index}", b"x")
    assert {(r.status, r.fault) for r in server.log.records("oss")} == {(0, "drop")}
    stored = list(server.store.keys(BUCKET))
    assert 0 < len(stored) < 8  # some were dropped after processing, some before

    server.faults = None
    assert bucket.put_object("after", b"x").status == 200
