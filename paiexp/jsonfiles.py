"""JSON state files that readers may open at any moment: written atomically, read leniently.

Standard library only: the local job runner imports it without ``site``.
"""

from __future__ import annotations

import json
import os
from typing import Any


def write_json_atomic(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old or the new file, never half."""
    path = os.fspath(path)
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    with open(temporary, "w") as stream:
        stream.write(json.dumps(data))
    os.replace(temporary, path)


def read_json(path: str | os.PathLike[str]) -> Any:
    """The file's data, or None when there is no such file."""
    try:
        with open(path) as stream:
            return json.loads(stream.read())
    except FileNotFoundError:
        return None
