"""``paiexp download``: fetch a tracked run's output channel (its model by default)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from paiexp.errors import UserError


def output_uri(tags: dict[str, str], run_id: str, channel: str) -> str:
    uri = tags.get(f"paiexp.output.{channel}")
    if not uri:
        prefix = "paiexp.output."
        known = sorted(k.removeprefix(prefix) for k in tags if k.startswith(prefix))
        raise UserError(
            f"--channel: run {run_id} has no output channel {channel!r}"
            + (f"; it has {', '.join(known)}" if known else " (the job may not have finished)")
        )
    return uri


def download(uri: str, dest: Path, backend_config: Any) -> list[Path]:
    """Copy ``uri`` (an ``oss://`` object or prefix, or a local path) into ``dest``."""
    if uri.startswith("oss://"):
        from paiexp.backends.pai import make_transfer
        from paiexp.credentials import credential_client
        from paiexp.oss import OssUri

        if getattr(backend_config, "name", None) != "pai":
            raise UserError(f"cannot download {uri}: the run's backend has no OSS settings")
        transfer = make_transfer(backend_config, credential_client())
        return transfer.download(OssUri.parse(uri), dest)
    source = Path(uri.removeprefix("file://"))
    if not source.exists():
        raise UserError(f"the run's output {source} no longer exists")
    if source.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        return [Path(shutil.copy2(source, dest / source.name))]
    shutil.copytree(source, dest, dirs_exist_ok=True)
    return sorted(p for p in dest.rglob("*") if p.is_file())
