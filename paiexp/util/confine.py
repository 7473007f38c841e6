"""Names paiexp did not choose become paths only inside the directory they belong in.

Object keys under a downloaded OSS prefix, the files a job left in an output directory and
names read back from a platform may hold an absolute part, ``..``, an empty segment or a
symlink that leads out: written as they stand, they would overwrite any file the user can
write (the zip-slip class of bug that tarfile's ``data`` filter guards against).  Everything
here is checked whole before anything is written, so a refused copy writes nothing.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from paiexp.errors import UserError


class Escape(UserError):
    """A name that would be written outside its destination; nothing was written."""


def unsafe_name(relative: str) -> str | None:
    """Why ``relative`` (segments joined by '/') cannot name a path under a directory, or
    None when it can."""
    if not relative:
        return "an empty name"
    if relative.startswith("/"):
        return "an absolute path"
    for segment in relative.split("/"):
        if not segment:
            return "an empty segment ('//')"
        if segment in (".", ".."):
            return f"a {segment!r} segment"
        if "\0" in segment:
            return "a NUL character"
    return None


def one_segment(name: str, *, what: str) -> str:
    """``name``, when it can be one path segment (a job or channel name read back from a
    platform or a stored run); :class:`Escape` naming ``what`` when not."""
    reason = "a '/'" if "/" in name else unsafe_name(name)
    if reason is not None:
        raise Escape(f"{what}: {name!r} cannot name a file ({reason}); nothing was written")
    return name


def inside(root: Path, relative: str, *, name: str) -> Path:
    """``root/relative``; :class:`Escape` naming ``name`` when it would land outside ``root``
    (an absolute part, ``..``, an empty segment, or a symlink under ``root`` leading out)."""
    reason = unsafe_name(relative)
    target = root / relative
    if reason is None and not _within(target, root):
        reason = "a symlink on its way that leads out of it"
    if reason is not None:
        raise Escape(
            f"{name}: refused, it would be written outside {root} ({reason}); nothing was written"
        )
    return target


@dataclass(frozen=True)
class _Entry:
    relative: str
    kind: str  # "dir", "file" or "link"
    link_target: str = ""  # a link's target, relative to the link's directory


def copy_tree(source: Path, dest: Path) -> list[Path]:
    """Copy the directory ``source`` (what a job wrote) into ``dest``: the files written.

    A symlink is kept as a relative symlink when it points inside ``source``, and refused
    when it points outside it (never followed out); so is anything but a directory, a file
    or such a symlink.  Every entry is checked before the first is copied: a refused copy
    writes nothing.
    """
    entries = _entries(source)
    targets = [(e, inside(dest, e.relative, name=str(source / e.relative))) for e in entries]
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for entry, target in targets:
        if entry.kind == "dir":
            target.mkdir(exist_ok=True)
            continue
        if target.is_symlink() or (entry.kind == "link" and target.exists()):
            target.unlink()
        if entry.kind == "link":
            target.symlink_to(entry.link_target)
        else:
            shutil.copy2(source / entry.relative, target, follow_symlinks=False)
            written.append(target)
    return written


def persist_outputs(
    destinations: Mapping[str, str | None], output_dir: Callable[[str], Path]
) -> str | None:
    """Copy each output channel that names a local destination there, as PAI persists a
    channel to its URI; why one could not be (it holds a symlink out of it), or None."""
    for channel, destination in destinations.items():
        if destination:
            try:
                copy_tree(output_dir(channel), Path(destination))
            except Escape as exc:
                return f"output channel {channel} not copied to {destination}: {exc}"
    return None


def _entries(source: Path) -> list[_Entry]:
    """Everything under ``source``, parents before children; :class:`Escape` at the first
    entry that cannot be copied safely."""
    root = source.resolve()
    entries: list[_Entry] = []
    for directory, dirnames, filenames in os.walk(source):  # symlinked dirs not entered
        for name in sorted(dirnames) + sorted(filenames):
            path = Path(directory) / name
            relative = path.relative_to(source).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                real = path.resolve()
                if not real.is_relative_to(root):
                    raise Escape(
                        f"{path}: refused, a symlink to {os.readlink(path)}, outside {source};"
                        " nothing was written"
                    )
                link = os.path.relpath(real, path.parent.resolve())
                entries.append(_Entry(relative, "link", link))
            elif stat.S_ISDIR(mode):
                entries.append(_Entry(relative, "dir"))
            elif stat.S_ISREG(mode):
                entries.append(_Entry(relative, "file"))
            else:
                raise Escape(
                    f"{path}: refused, not a regular file, directory or symlink;"
                    " nothing was written"
                )
    return entries


def _within(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())
