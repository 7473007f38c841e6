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


URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def redact_urls(text: str) -> str:
    """Every URL in ``text`` with its password left out (see :func:`redact_url`)."""
    return URL.sub(lambda match: _redacted(match.group(0)), text)


def _redacted(url: str) -> str:
    try:
        return redact_url(url)
    except ValueError:  # not a URL after all (a malformed host or port): kept out whole
        return "<url>"
