"""The distributed contract of multi-instance jobs (paiexp.contract.distributed) and the job type
rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paiexp.config.schema import PaiBackendConfig, PaiJobType, PaiOssConfig
from paiexp.config.spec import JobSpec
from paiexp.contract.distributed import PYTORCH_JOB, TF_JOB, Topology, job_type

ADDRESSES = [("master", 23456), ("w0", 23457), ("w1", 23458)]


def test_instances_are_named_as_dlc_names_them() -> None:
    assert Topology(3).names == ["master-0", "worker-0", "worker-1"]
    assert Topology(3, "XGBoostJob").names == ["master-0", "worker-0", "worker-1"]
    assert Topology(3, TF_JOB).names == ["worker-0", "worker-1", "worker-2"]


def test_every_instance_is_told_the_master_the_instances_and_its_rank() -> None:
    topology = Topology(3, gpus=4)
    assert topology.environment(2, ADDRESSES) == {
        "MASTER_ADDR": "master",
        "MASTER_PORT": "23456",
        "WORLD_SIZE": "3",  # instances, not processes
        "RANK": "2",
        "NPROC_PER_NODE": "4",
    }
    assert Topology(3).environment(0, ADDRESSES)["NPROC_PER_NODE"] == "1"  # no GPUs: one


def test_a_tfjob_instance_gets_tf_config_in_dlcs_shape() -> None:
    env = Topology(3, TF_JOB).environment(1, ADDRESSES)
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": ["master:23456", "w0:23457", "w1:23458"]},
        "task": {"type": "worker", "index": 1},
        "environment": "cloud",
    }


def test_the_addresses_must_be_every_instances() -> None:
    with pytest.raises(ValueError):
        Topology(3).environment(0, ADDRESSES[:1])


def test_a_topology_survives_its_file() -> None:
    topology = Topology(2, TF_JOB, 1)
    assert Topology.from_dict(json.loads(json.dumps(topology.to_dict()))) == topology


def test_the_job_types_are_pais() -> None:
    assert job_type(None) == PYTORCH_JOB
    assert {PYTORCH_JOB, TF_JOB, "XGBoostJob", "MPIJob"} <= set(PaiJobType)


def test_job_job_type_wins_over_backend_job_type_on_pai(tmp_path: Path) -> None:
    from paiexp.backends.pai import PaiBackend

    config = PaiBackendConfig(
        workspace_id="1", oss=PaiOssConfig(bucket="b"), job_type=PaiJobType.XGBoostJob
    )
    backend = PaiBackend(config, tmp_path)
    spec = JobSpec(name="typed", command="true", image="image")
    assert backend.request_body(spec)["AlgorithmSpec"]["JobType"] == "XGBoostJob"
    typed = JobSpec(name="typed", command="true", image="image", job_type=TF_JOB)
    assert backend.request_body(typed)["AlgorithmSpec"]["JobType"] == TF_JOB


def test_checkpoints_to_start_from_are_the_pai_jobs_checkpoints_channel(tmp_path: Path) -> None:
    from paiexp.backends.pai import PaiBackend

    backend = PaiBackend(PaiBackendConfig(workspace_id="1", oss=PaiOssConfig(bucket="b")), tmp_path)
    uri = "oss://b/pai/training_job/lost-t0000/checkpoints/"
    spec = JobSpec(name="again", command="true", image="image", checkpoints=uri)
    channels = {c["Name"]: c["OutputUri"] for c in backend.request_body(spec)["OutputChannels"]}
    assert channels["checkpoints"] == uri  # the SDK's checkpoints_path
    assert channels["model"].endswith("/training_job/again/model/")
