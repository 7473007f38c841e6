"""RunRecord: everything stored with a run so that it can be reproduced.

The resolved config (secrets replaced by ``${oc.env:NAME}`` references), the JobSpec, the
project directory relative paths were resolved against, the code version (git commit and a
content digest of the source dir) and the image.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paiexp import __version__
from paiexp.config.spec import JobSpec
from paiexp.contract.source import git_revision, source_digest
from paiexp.util.redact import redact_environments, redact_override


@dataclass(frozen=True)
class SourceInfo:
    """The code version of a source dir: its content digest and git revision."""

    digest: str
    git_commit: str | None = None
    git_dirty: bool | None = None


def source_info(source_dir: str | None) -> SourceInfo | None:
    if source_dir is None:
        return None
    revision = git_revision(Path(source_dir))
    return SourceInfo(
        digest=source_digest(Path(source_dir)),
        git_commit=revision.commit if revision else None,
        git_dirty=revision.dirty if revision else None,
    )


@dataclass(frozen=True)
class RunRecord:
    spec: JobSpec
    config_yaml: str
    backend: str
    project_dir: str
    overrides: tuple[str, ...] = ()
    source: SourceInfo | None = None

    def spec_json(self) -> str:
        """The spec as stored with the run: secrets redacted like the config's."""
        return json.dumps(self.spec.to_dict(redact=True), indent=2)

    @property
    def config_hash(self) -> str:
        return hashlib.sha256(self.config_yaml.encode()).hexdigest()

    def params(self) -> dict[str, str]:
        params = dict(self.spec.hyperparameters)
        job_fields = {
            "job.image": self.spec.image,
            "job.instance_type": self.spec.instance_type,
            "job.instance_count": str(self.spec.instance_count),
            "job.job_type": self.spec.job_type,
            "job.backend": self.backend,
            "job.command": self.spec.command,
        }
        params.update({key: value for key, value in job_fields.items() if value is not None})
        return params

    def tags(self) -> dict[str, str]:
        tags = {
            "paiexp.job_name": self.spec.name,
            "paiexp.backend": self.backend,
            "paiexp.status": "PENDING",
            "paiexp.config_hash": self.config_hash,
            "paiexp.project_dir": self.project_dir,
            "paiexp.overrides": " ".join(map(redact_override, self.overrides)),
            "paiexp.version": __version__,
        }
        if self.spec.image:
            tags["paiexp.image"] = self.spec.image
        if self.source:
            tags["paiexp.source_digest"] = self.source.digest
            if self.source.git_commit:
                tags["mlflow.source.git.commit"] = self.source.git_commit
                tags["paiexp.git_dirty"] = str(self.source.git_dirty).lower()
        return tags


def make_record(
    config: dict[str, Any],
    spec: JobSpec,
    *,
    project_dir: Path,
    overrides: tuple[str, ...] = (),
    source: SourceInfo | None = None,
) -> RunRecord:
    """The record of a job about to be submitted; ``config`` is the resolved config as a dict.

    ``source`` may be given when already known (a sweep computes it once for all trials).
    """
    import yaml

    return RunRecord(
        spec=spec,
        config_yaml=yaml.safe_dump(redact_config(config), sort_keys=False),
        backend=str(config["backend"]["name"]),
        project_dir=str(project_dir),
        overrides=overrides,
        source=source if source is not None else source_info(spec.source_dir),
    )


def redact_config(config: dict[str, Any]) -> dict[str, Any]:
    job = dict(config.get("job", {}))
    job["environments"] = redact_environments(dict(job.get("environments") or {}))
    return {**config, "job": job}
