"""paiexp.oss against the emulator's OSS: content-addressed uploads, resumable big files."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from emulator import Emulator
from emulator.common import FaultPlan

from paiexp.credentials import credential_client
from paiexp.oss import OssTransfer, OssUri, pack_source
from paiexp.retry import RetryPolicy


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


def test_code_archives_are_byte_identical_for_identical_trees(tmp_path: Path) -> None:
    first = pack_source(code_tree(tmp_path / "a"))
    second_tree = code_tree(tmp_path / "b")
    os.utime(second_tree / "train.py", (1, 1))  # another mtime changes nothing
    time.sleep(0.01)
    assert pack_source(second_tree) == first
    (second_tree / "train.py").write_text("print('changed')\n")
    assert pack_source(second_tree) != first


def test_code_and_inputs_are_uploaded_once(
    cloud: Emulator, transfer: OssTransfer, tmp_path: Path
) -> None:
    base = OssUri(cloud.bucket, "paiexp")
    tree = code_tree(tmp_path / "code")
    data = tmp_path / "data"
    data.mkdir()
    (data / "part-0.csv").write_text("a,b\n1,2\n")
    uris = [transfer.upload_code(tree, base), transfer.upload_input(data, base)]
    puts = len([r for r in cloud.log.records("oss") if r.method == "PUT"])
    assert puts == 3  # the archive, the one data file, the directory's completion marker
    assert uris == [transfer.upload_code(tree, base), transfer.upload_input(data, base)]
    assert len([r for r in cloud.log.records("oss") if r.method == "PUT"]) == puts
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
