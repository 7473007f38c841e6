"""JSON state files that readers may open at any moment: written atomically, read leniently.

Standard library only: the local job runner imports it without ``site``.
"""

from __future__ import annotations

import contextlib
import json
import os

TYPE_CHECKING = False  # typing itself is not loaded: a job's runner imports this module
if TYPE_CHECKING:
    from typing import Any


def write_json_atomic(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old or the new file, never half;
    a write that fails (a full disk) leaves the old file, and no temporary one."""
    path = os.fspath(path)
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "w") as stream:
            stream.write(json.dumps(data))
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        exc.filename = exc.filename or path
        raise


def read_json(path: str | os.PathLike[str]) -> Any:
    """The file's data, or None when there is no such file."""
    try:
        with open(path) as stream:
            return json.loads(stream.read())
    except FileNotFoundError:
        return None
