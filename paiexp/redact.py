"""Keeping secrets out of everything paiexp writes (MLflow, job directories, logs)."""

from __future__ import annotations

import re

SECRET_NAME = re.compile(r"(?i)(secret|token|passw(or)?d|access_?key|api_?key|credential)")


def redact_environments(environments: dict[str, str]) -> dict[str, str]:
    """Values with secret-looking names become ``${oc.env:NAME}`` references."""
    return {
        name: f"${{oc.env:{name}}}" if SECRET_NAME.search(name) else value
        for name, value in environments.items()
    }


def redact_override(override: str) -> str:
    """``+job.environments.MY_TOKEN=abc`` -> ``+job.environments.MY_TOKEN=<redacted>``."""
    key, sep, _ = override.partition("=")
    return f"{key}=<redacted>" if sep and SECRET_NAME.search(key) else override


def redact_url(url: str) -> str:
    """``postgresql://user:pw@host/db`` -> ``postgresql://user:<redacted>@host/db``."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if not parts.password:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:<redacted>@{host}"))
