"""A local job's private ``/ml``: a mount namespace in which ``/ml`` is the job's own tree.

The local runner enters it before the job starts, and the job's processes inherit it, so a
script's absolute ``/ml/...`` paths, its relative paths and the ``PAI_*`` variables all reach
the job directory's ``ml`` tree, as on PAI and in Docker, and nothing is written to the
host's ``/ml``.  The view's root is a tmpfs holding every top-level entry of the host's ``/``
(directories and files bound recursively, symbolic links copied; a host ``/ml`` is left out)
and ``/ml``, bound to the job's tree.  Root unshares a mount namespace; another user a user
namespace with it, mapping only its own uid and gid, so its files stay its own and the job
holds no capabilities once it runs.  Standard library only (ctypes): the runner imports it.

Where the machine makes no namespace (or ``PAIEXP_LOCAL_NAMESPACE=0``), the job sees the
host's ``/ml``; :func:`snapshot` before and after it tells whether it wrote there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from urllib.parse import quote, unquote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import MutableMapping

ML = "/ml"
SWITCH = "PAIEXP_LOCAL_NAMESPACE"  # "0": no private /ml (as where namespaces are refused)
ROOT_MOUNT = ".root"  # in the job directory: where the view's root is built

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 2

# The variables that name a place in the job's tree (PAI_HPS_* and PAI_USER_ARGS do not).
PATH_VARIABLES = ("PAI_WORKING_DIR", "PAI_CONFIG_DIR")
PATH_VARIABLE_PREFIXES = ("PAI_INPUT_", "PAI_OUTPUT_")
# The variables that name a place in it as a file: URI (the job's own MLflow store).
URI_VARIABLES = ("MLFLOW_TRACKING_URI",)
FILE_URI = "file://"


def enter(job_dir: str) -> str | None:
    """Enter a mount namespace whose ``/ml`` is ``<job_dir>/ml``; None once in it, else why
    not (the process then sees the host's files as before)."""
    if os.environ.get(SWITCH) == "0":
        return f"{SWITCH}=0"
    ml_dir = os.path.join(job_dir, "ml")
    if _under(ml_dir, ML):
        return f"the job directory is under {ML}"
    libc = ctypes.CDLL(None, use_errno=True)
    new_root = os.path.join(job_dir, ROOT_MOUNT)
    step = "unshare"
    try:
        _unshare(libc)
        step = "mount"
        _switch_root(libc, ml_dir, new_root)
    except OSError as exc:
        return f"{step}: {exc.strerror or exc}"
    finally:
        _tidy(libc, new_root)
    return None


def _unshare(libc: ctypes.CDLL) -> None:
    """A new mount namespace: root's own, else in a user namespace mapping this user only."""
    if os.geteuid() == 0 and libc.unshare(CLONE_NEWNS) == 0:
        return
    uid, gid = os.geteuid(), os.getegid()
    _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS))
    for name, line in [
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ]:
        with open(f"/proc/self/{name}", "w") as stream:
            stream.write(line)


def _switch_root(libc: ctypes.CDLL, ml_dir: str, new_root: str) -> None:
    """Build the view on a tmpfs at ``new_root`` and make it this process's ``/``."""
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates to the host
    os.makedirs(new_root, exist_ok=True)
    _mount(libc, "tmpfs", new_root, "tmpfs", 0, "mode=0755")
    # The entry holding new_root first: its copy of the tmpfs then holds nothing bound yet.
    names = sorted(os.listdir("/"), key=lambda name: not _under(new_root, "/" + name))
    for name in names:
        host, place = "/" + name, os.path.join(new_root, name)
        if host == ML:
            continue  # hidden: the job's /ml takes its place
        if os.path.islink(host):
            os.symlink(os.readlink(host), place)
            continue
        if os.path.isdir(host):
            os.mkdir(place)
        else:
            os.close(os.open(place, os.O_CREAT | os.O_WRONLY, 0o644))
        _mount(libc, host, place, None, MS_BIND | MS_REC)
    os.mkdir(new_root + ML)
    _mount(libc, ml_dir, new_root + ML, None, MS_BIND | MS_REC)
    os.chdir(new_root)
    _mount(libc, new_root, "/", None, MS_MOVE)  # as switch_root: the view is the root mount,
    os.chroot(".")  # not a chroot inside one (the job may make namespaces of its own)


def _tidy(libc: ctypes.CDLL, new_root: str) -> None:
    """Take the tmpfs (seen again through the host's directories, or left by a failed set-up)
    out of the view, and its mount point out of the job directory: best effort."""
    while os.path.ismount(new_root) and libc.umount2(new_root.encode(), MNT_DETACH) == 0:
        pass
    with contextlib.suppress(OSError):
        os.rmdir(new_root)


def _mount(
    libc: ctypes.CDLL,
    source: str | None,
    target: str,
    fstype: str | None,
    flags: int,
    data: str | None = None,
) -> None:
    def encoded(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    _check(
        libc.mount(
            encoded(source),
            encoded(target),
            encoded(fstype),
            ctypes.c_ulong(flags),
            encoded(data),
        )
    )


def _check(result: int) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def in_view(path: str, ml_dir: str, root: str = ML) -> str:
    """Where ``path`` under ``ml_dir`` is in the view: under ``/ml`` (or another ``root``)."""
    return root + path[len(ml_dir) :] if _under(path, ml_dir) else path


def rebase_paths(env: MutableMapping[str, str], ml_dir: str, root: str = ML) -> None:
    """Point the variables that name a place under ``ml_dir`` at ``/ml`` (or another
    ``root``: an instance's own tree) instead."""
    for name, value in list(env.items()):
        if name in PATH_VARIABLES or name.startswith(PATH_VARIABLE_PREFIXES):
            env[name] = in_view(value, ml_dir, root)
        elif name in URI_VARIABLES and value.startswith(FILE_URI):
            env[name] = FILE_URI + quote(in_view(unquote(value[len(FILE_URI) :]), ml_dir, root))


Snapshot = frozenset[tuple[str, int, int]]


def snapshot() -> Snapshot | None:
    """What the host's ``/ml`` holds (every entry's path, modification time and size), or
    None where there is none: a job that writes there changes it."""
    if not os.path.lexists(ML):
        return None
    entries: set[tuple[str, int, int]] = set()
    pending = [ML]
    while pending:
        directory = pending.pop()
        with contextlib.suppress(OSError):  # unreadable, or gone meanwhile: seen as it is
            stat = os.lstat(directory)
            entries.add((directory, stat.st_mtime_ns, stat.st_size))
            with os.scandir(directory) as listing:
                for entry in listing:
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
                    else:
                        stat = entry.stat(follow_symlinks=False)
                        entries.add((entry.path, stat.st_mtime_ns, stat.st_size))
    return frozenset(entries)
