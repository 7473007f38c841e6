"""Which OpenPAI cluster a ``backend=openpai`` config names, and its token.

The token comes from ``OPENPAI_TOKEN``, or from a cluster alias of openpaisdk's
``~/.openpai/clusters.yaml`` (a list of ``{cluster_alias, pai_uri, user, token}``); never from
paiexp's config, so it never reaches a file, a log or MLflow.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from paiexp.backends.openpai_api import TOKEN_VARIABLE, Cluster
from paiexp.errors import UserError

REST_SERVER_SUFFIX = "/rest-server"


def clusters_file() -> Path:
    return Path.home() / ".openpai" / "clusters.yaml"


def resolve_cluster(config: Any) -> Cluster:
    """The rest-server, web portal, user and token of ``config`` (one line if any is missing)."""
    alias = _alias(config.cluster_alias) if config.cluster_alias else {}
    pai_uri = str(alias.get("pai_uri") or "").rstrip("/")
    rest = config.rest_server_uri or (pai_uri + REST_SERVER_SUFFIX if pai_uri else None)
    if not rest:
        raise UserError(
            "backend.rest_server_uri: required for backend=openpai (e.g. "
            "https://pai.example.com/rest-server), or backend.cluster_alias"
        )
    if not rest.startswith(("http://", "https://")):
        raise UserError(
            f"backend.rest_server_uri: invalid value {rest!r}; expected an http(s):// URI"
        )
    rest = rest.rstrip("/")
    user = config.user or alias.get("user")
    if not user:
        raise UserError(
            "backend.user: required for backend=openpai (your OpenPAI user name), "
            "or backend.cluster_alias"
        )
    token, source = _token(config.cluster_alias, alias)
    portal = config.web_portal_uri or pai_uri or rest.removesuffix(REST_SERVER_SUFFIX)
    return Cluster(rest, portal.rstrip("/"), str(user), token, source)


def _token(alias_name: str | None, alias: dict[str, Any]) -> tuple[str, str]:
    token = os.environ.get(TOKEN_VARIABLE, "").strip()
    if token:
        return token, TOKEN_VARIABLE
    if alias.get("token"):
        return str(alias["token"]), (
            f"the token of cluster alias {alias_name!r} in {clusters_file()}, or set "
            f"{TOKEN_VARIABLE}"
        )
    raise UserError(
        f"backend=openpai needs a token: set {TOKEN_VARIABLE} (the web portal's profile page "
        f"makes one), or backend.cluster_alias naming a cluster with a token in {clusters_file()}"
    )


def _alias(name: str) -> dict[str, Any]:
    import yaml

    path = clusters_file()
    try:
        clusters = yaml.safe_load(path.read_text()) or []
    except FileNotFoundError:
        raise UserError(
            f"backend.cluster_alias: {name!r} needs {path}, which does not exist"
        ) from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise UserError(f"backend.cluster_alias: {path} is not valid YAML ({problem})") from None
    if not isinstance(clusters, list):
        raise UserError(f"backend.cluster_alias: {path} should hold a list of clusters")
    known = {str(c.get("cluster_alias")): c for c in clusters if isinstance(c, dict)}
    if name not in known:
        raise UserError(
            f"backend.cluster_alias: unknown alias {name!r}; {path} has: "
            f"{', '.join(sorted(known)) or 'none'}"
        )
    return dict(known[name])
