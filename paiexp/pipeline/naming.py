"""A step's identity: the names its job or study get, and the digest of its config.

Each attempt of a step (a failed step's next run, ``--rerun``) gets a token from the
pipeline's id, the step and the attempt: its job's name and its study's name carry it, so a
relaunch finds the same job (never submitting it twice) and a new attempt never reuses one.
The digest covers the step's resolved config (secrets redacted): a completed step whose
digest changed was changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from paiexp.config.record import redact_config


def instance_token(pipeline_id: str, step: str, attempt: int) -> str:
    return hashlib.sha256(f"{pipeline_id}/{step}/{attempt}".encode()).hexdigest()[:8]


def _slug(text: str, limit: int) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")[:limit].rstrip("-")


def job_name(base: str, step: str, token: str) -> str:
    """``<job.name>-<step>-<token>``: letters, digits and '-', as every backend takes."""
    return f"{base[:30].rstrip('-')}-{_slug(step, 20) or 'step'}-{token}"


def study_name(pipeline: str, step: str, token: str) -> str:
    return f"{_slug(pipeline, 20) or 'pipeline'}-{_slug(step, 20) or 'step'}-{token}"


def redacted(data: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved config as the state file keeps it: secrets replaced by references."""
    return redact_config(dict(data))


def config_digest(kind: str, data: Mapping[str, Any]) -> str:
    text = json.dumps({"kind": kind, "config": redacted(data)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def first_difference(old: Any, new: Any, key: str = "") -> str | None:
    """``key: old -> new`` for the first key whose value differs, in key order."""
    if isinstance(old, dict) and isinstance(new, dict):
        for name in sorted(set(old) | set(new), key=str):
            inner = f"{key}.{name}" if key else str(name)
            if name not in old:
                return f"{inner}: added ({_short(new[name])})"
            if name not in new:
                return f"{inner}: removed (was {_short(old[name])})"
            found = first_difference(old[name], new[name], inner)
            if found:
                return found
        return None
    if old != new:
        return f"{key or 'config'}: {_short(old)} -> {_short(new)}"
    return None


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
