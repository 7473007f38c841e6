"""Names paiexp did not choose never write outside their destination (the zip-slip class).

OSS keys under a downloaded prefix may hold ``//``, ``..`` or an absolute part (all legal
object keys); a job's output directory may hold a symlink to a file outside it.  Each is
refused with one line naming the key or file, before anything is written; a normal model
prefix still downloads whole.  The OSS is the emulator's, reached by the real oss2 client.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import all_runs, assert_one_line_error, run_paiexp
from emulator import Emulator

from paiexp.cloud.credentials import credential_client
from paiexp.cloud.oss import OssTransfer, OssUri
from paiexp.config.spec import JobSpec
from paiexp.util.confine import Escape, copy_tree
from paiexp.util.retry import RetryPolicy

pytestmark = pytest.mark.slow  # runs jobs, sweeps or the paiexp command

MODEL = {"m/model.json": b'{"trees": 3}', "m/sub/weights.bin": b"\x00\x01"}


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "cloud") as emulator:
        for key, data in MODEL.items():
            emulator.store.put(emulator.bucket, key, data)
        yield emulator


@pytest.fixture
def transfer(cloud: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> OssTransfer:
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", cloud.credentials.access_key_id)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", cloud.credentials.access_key_secret)
    policy = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.1)
    return OssTransfer(
        cloud.oss_endpoint, cloud.region, credential_client(), tmp_path / "cache", policy
    )


def escaping_keys(tmp_path: Path) -> dict[str, str]:
    """Keys under ``m/`` whose names would land in ``tmp_path/outside`` (from ``tmp_path/x``)."""
    return {
        "absolute": f"m/{tmp_path}/outside/abs.txt",  # m//tmp/...: absolute after the prefix
        "dotdot": "m/../outside/dotdot.txt",
        "deep-dotdot": "m/sub/../../outside/deep.txt",
        "empty-segment": "m/sub//inner.txt",
        "dot": "m/./here.txt",
    }


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_a_model_prefix_downloads_whole(
    cloud: Emulator, transfer: OssTransfer, tmp_path: Path
) -> None:
    written = transfer.download(OssUri(cloud.bucket, "m/"), tmp_path / "dest")
    assert sorted(written) == [tmp_path / "dest" / "model.json", tmp_path / "dest/sub/weights.bin"]
    assert (tmp_path / "dest" / "model.json").read_bytes() == MODEL["m/model.json"]
    assert (tmp_path / "dest/sub/weights.bin").read_bytes() == MODEL["m/sub/weights.bin"]


@pytest.mark.parametrize("kind", list(escaping_keys(Path("/t"))))
def test_a_key_that_would_escape_is_refused_and_nothing_is_written(
    cloud: Emulator, transfer: OssTransfer, tmp_path: Path, kind: str
) -> None:
    key = escaping_keys(tmp_path)[kind]
    cloud.store.put(cloud.bucket, key, b"pwned")
    cloud.log.clear()
    dest = tmp_path / "dest"
    with pytest.raises(Escape) as refused:
        transfer.download(OssUri(cloud.bucket, "m/"), dest)
    message = str(refused.value)
    assert "\n" not in message and f"oss://{cloud.bucket}/{key}" in message, message
    assert str(dest) in message, message
    assert files_under(tmp_path / "outside") == [] and files_under(dest) == []
    assert not cloud.log.records("oss", "GetObject"), "an object was fetched"

    # docker's cache of oss:// inputs takes the same keys the same way
    cache = tmp_path / "cache"
    with pytest.raises(Escape):
        transfer.sync_down(OssUri(cloud.bucket, "m/"), cache)
    assert files_under(tmp_path / "outside") == [] and files_under(cache / cloud.bucket) == []


def test_a_symlink_out_of_an_output_directory_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "home" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("private")
    output = tmp_path / "output"
    (output / "sub").mkdir(parents=True)
    (output / "model.json").write_text("{}")
    (output / "sub" / "alias.json").symlink_to("../model.json")  # inside: kept as a link
    (output / "leak").symlink_to(secret)
    with pytest.raises(Escape) as refused:
        copy_tree(output, tmp_path / "dest")
    assert str(output / "leak") in str(refused.value) and "outside" in str(refused.value)
    assert not (tmp_path / "dest").exists()

    (output / "leak").unlink()
    written = copy_tree(output, tmp_path / "dest")
    assert written == [tmp_path / "dest" / "model.json"]
    alias = tmp_path / "dest" / "sub" / "alias.json"
    assert alias.is_symlink() and alias.resolve() == tmp_path / "dest" / "model.json"


def test_a_destination_symlink_leading_out_is_not_written_through(tmp_path: Path) -> None:
    output = tmp_path / "output"
    (output / "sub").mkdir(parents=True)
    (output / "sub" / "w.bin").write_bytes(b"w")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "sub").symlink_to(elsewhere)
    with pytest.raises(Escape, match="outside"):
        copy_tree(output, dest)
    assert files_under(elsewhere) == []


def write_job(project: Path, command: str, outputs: dict[str, str] | None = None) -> None:
    job = {"name": "linker", "command": command, "metric_definitions": []}
    if outputs:
        job["outputs"] = outputs
    (project / "conf" / "job" / "linker.yaml").write_text(yaml.safe_dump(job))


def test_paiexp_download_refuses_a_model_holding_a_symlink_out(project: Path) -> None:
    secret = project / "secret.txt"
    secret.write_text("private")
    write_job(project, f"echo w > $PAI_OUTPUT_MODEL/model.bin; ln -s {secret} $PAI_OUTPUT_MODEL/x")
    assert run_paiexp(project, "job=linker", "-q").returncode == 0
    (run,) = all_runs(project)
    done = run_paiexp(project, "download", run.info.run_id, "fetched")
    line = assert_one_line_error(done)
    assert "/x: refused, a symlink to" in line and str(secret) in line, line
    assert not (project / "fetched").exists()


def test_a_local_output_destination_is_never_written_through_a_symlink_out(
    project: Path,
) -> None:
    secret = project / "secret.txt"
    secret.write_text("private")
    write_job(
        project,
        f"echo w > $PAI_OUTPUT_MODEL/model.bin; ln -s {secret} $PAI_OUTPUT_MODEL/x",
        outputs={"model": "kept"},
    )
    done = run_paiexp(project, "job=linker", "-q")
    assert done.returncode == 1, done.stderr
    (run,) = all_runs(project)
    reason = run.data.tags["paiexp.failure_reason"]
    assert "output channel model not copied to" in reason and "a symlink to" in reason, reason
    assert files_under(project / "kept") == []


def test_a_stored_spec_whose_names_are_not_file_names_is_refused() -> None:
    good = {"name": "job-1", "command": "true", "outputs": {"model": None}}
    assert JobSpec.from_dict(good).name == "job-1"
    for bad in ({**good, "name": "../../x"}, {**good, "outputs": {"..": None}}):
        with pytest.raises(Escape, match="cannot name a file"):
            JobSpec.from_dict(bad)


def test_attach_takes_only_a_job_name(project: Path) -> None:
    line = assert_one_line_error(run_paiexp(project, "attach", "../../etc/x"))
    assert "JOB_NAME: invalid value '../../etc/x'" in line, line
