"""paiexp.cloud.oss against the emulator's OSS: content-addressed uploads, resumable big files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from emulator import Emulator
from emulator.common import FaultPlan

from paiexp.cloud.credentials import credential_client
from paiexp.cloud.oss import OssTransfer, OssUri
from paiexp.util.retry import RetryPolicy


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "cloud") as emulator:
        yield emulator


@pytest.fixture
def transfer(cloud: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> OssTransfer:
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", cloud.credentials.access_key_id)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", cloud.credentials.access_key_secret)
    return OssTransfer(
        cloud.oss_endpoint,
        cloud.region,
        credential_client(),
        tmp_path / "cache",
        RetryPolicy(attempts=12, base_delay=0.01, max_delay=0.1),
        multipart_threshold=200 * 1024,
    )


def code_tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "util.py").write_text("X = 1\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "junk.pyc").write_bytes(b"\0")
    return root


def puts(cloud: Emulator) -> list[str]:
    """The keys of every PutObject so far (paths without the bucket)."""
    return [r.path.split("/", 2)[-1] for r in cloud.log.records("oss") if r.method == "PUT"]


def test_code_goes_up_as_files_under_a_content_addressed_prefix(
    cloud: Emulator, transfer: OssTransfer, tmp_path: Path
) -> None:
    base = OssUri(cloud.bucket, "paiexp")
    uri = transfer.upload_code(code_tree(tmp_path / "a"), base)
    assert uri.key.startswith("paiexp/training_src/") and uri.key.endswith("/")  # the SDK's form
    assert list(cloud.store.keys(cloud.bucket, uri.key)) == [
        f"{uri.key}pkg/util.py",
        f"{uri.key}train.py",
    ]  # uncompressed, caches left out, the completion marker outside the prefix
    assert cloud.store.get(cloud.bucket, f"{uri.key}train.py") == b"print('hi')\n"
    same = code_tree(tmp_path / "b")
    os.utime(same / "train.py", (1, 1))  # another mtime changes nothing
    assert transfer.upload_code(same, base) == uri
    (same / "train.py").write_text("print('changed')\n")
    assert transfer.upload_code(same, base) != uri


def test_an_upload_cut_short_is_finished_not_taken_for_complete(
    cloud: Emulator, transfer: OssTransfer, tmp_path: Path
) -> None:
    base = OssUri(cloud.bucket, "paiexp")
    tree = code_tree(tmp_path / "code")
    uri = transfer.upload_code(tree, base)
    marker = uri.key.rstrip("/") + ".paiexp-complete"
    assert puts(cloud)[-1] == marker  # the marker goes up last
    # as if the upload had died after its first file: no marker, one file missing
    cloud.store.delete(cloud.bucket, marker)
    cloud.store.delete(cloud.bucket, f"{uri.key}train.py")
    cloud.log.clear()
    assert transfer.upload_code(tree, base) == uri
    assert puts(cloud) == [f"{uri.key}train.py", marker]  # the file already there skipped
    assert cloud.store.get(cloud.bucket, f"{uri.key}train.py") == b"print('hi')\n"


def test_code_and_inputs_are_uploaded_once(
    cloud: Emulator, transfer: OssTransfer, tmp_path: Path
) -> None:
    base = OssUri(cloud.bucket, "paiexp")
    tree = code_tree(tmp_path / "code")
    data = tmp_path / "data"
    data.mkdir()
    (data / "part-0.csv").write_text("a,b\n1,2\n")
    uris = [transfer.upload_code(tree, base), transfer.upload_input(data, base)]
    # the two code files, their marker, the one data file, the directory's marker
    assert len(puts(cloud)) == 5
    assert uris == [transfer.upload_code(tree, base), transfer.upload_input(data, base)]
    assert len(puts(cloud)) == 5
    assert str(uris[1]).endswith("/data/")
    fetched = transfer.download(uris[1], tmp_path / "back")
    assert [p.read_text() for p in fetched] == ["a,b\n1,2\n"]


def test_big_files_go_up_in_parts_and_survive_faults(
    cloud: Emulator, transfer: OssTransfer, tmp_path: Path
) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(700 * 1024))
    cloud.faults = FaultPlan(rate=0.25, seed=int(os.environ.get("FAULT_SEED", "1")))
    uri = transfer.upload_input(big, OssUri(cloud.bucket, "paiexp"))
    cloud.faults = FaultPlan()
    actions = [r.action for r in cloud.log.records("oss")]
    assert "InitiateMultipartUpload" in actions and "CompleteMultipartUpload" in actions
    assert "ListParts" in actions
    assert any(r.fault for r in cloud.log.records("oss"))
    # 7 parts of 100 KiB: a retry resumes from the parts already up, never starts over
    assert actions.count("UploadPart") < 14
    bucket, key = uri.bucket, uri.key
    assert cloud.store.get(bucket, key) == big.read_bytes()


def test_a_growing_file_is_mirrored_by_its_new_bytes_only(
    cloud: Emulator, transfer: OssTransfer, tmp_path: Path
) -> None:
    """As a job's event files grow on OSS: each mirror fetches the bytes past the copy's end
    (appended to it, so a whole object fetched again would double it); a replaced, shorter
    object is fetched whole."""
    prefix = OssUri(cloud.bucket, "jobs/j1/tensorboard/")
    events = OssUri(cloud.bucket, "jobs/j1/tensorboard/train/events.out.tfevents.1.host")
    mirror = tmp_path / "mirror"
    transfer.put_bytes(events, b"first records|")
    transfer.mirror_growing(prefix, mirror)
    copy = mirror / "train" / "events.out.tfevents.1.host"
    assert copy.read_bytes() == b"first records|"
    transfer.put_bytes(events, b"first records|more records|")
    transfer.mirror_growing(prefix, mirror)
    assert copy.read_bytes() == b"first records|more records|"
    gets = [r for r in cloud.log.records("oss") if r.action == "GetObject"]
    transfer.mirror_growing(prefix, mirror)  # unchanged: listed, not fetched
    assert [r for r in cloud.log.records("oss") if r.action == "GetObject"] == gets
    transfer.put_bytes(events, b"rewritten")
    transfer.mirror_growing(prefix, mirror)
    assert copy.read_bytes() == b"rewritten"
