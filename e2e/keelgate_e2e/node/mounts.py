"""A container's entry point on the node agent: enter a private mount namespace, bind the pod's
volumes at their mountPaths, then exec the container's command in place.

Why it exists: containers are host processes, yet a program must find its volumes where the pod
spec says (`/var/run/secrets/kubernetes.io/serviceaccount/token`, `/etc/config/...`). The agent
starts every container as

    python -I -S mounts.py STATUS_FD SPEC_JSON -- COMMAND ARGS...

This program unshares a mount namespace (propagation private, so nothing it mounts reaches the
host), masks host paths a container must not inherit (the host's own service-account directory,
with an empty read-only tmpfs), bind-mounts each volume directory (read-only ones remounted `ro`),
creating missing mount points on the host, changes to `workingDir`, and `execvpe`s the command
with its environment. The process keeps its pid, process group, environment (the run and
container markers) and output pipes, so the agent's kill, log and sweep logic see the command
itself. When the node agent does not run as root it first enters a user namespace that maps only
its own uid and gid, which lets it mount without changing the uid the command runs as.

A failure (a mount, a missing program, a missing working directory) is written to STATUS_FD and
the process exits 128; on success exec closes STATUS_FD (it is close-on-exec), which is how the
agent tells "started" from "could not start" (StartError) as the kubelet does.

It must never mount anything in the host's mount namespace (it refuses to mount if unshare
failed), never import anything outside the standard library (it runs as `python -I -S`, so the
pod's PYTHON* variables and the venv cannot change it), and never print (the container's output
starts with the container).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
#: statvfs f_flag bits that a read-only remount of a bind mount must keep: in a user namespace
#: the kernel refuses to clear a locked flag, and as root keeping them changes nothing.
_KEEP = (
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, MS_NOATIME),
    (os.ST_NODIRATIME, MS_NODIRATIME),
    (os.ST_RELATIME, MS_RELATIME),
)
#: Exit code when the container could not be started (as runc reports StartError).
START_ERROR = 128

_libc = ctypes.CDLL(None, use_errno=True)  # the interpreter's own C library: no search, no fork
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_void_p,
]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.syscall.restype = ctypes.c_long

# open_tree(2) and move_mount(2) (x86_64; Linux 5.2+): a detached copy of a source's mount,
# attached later at its target, whatever has been mounted over the source's path meanwhile.
SYS_OPEN_TREE, SYS_MOVE_MOUNT = 428, 429
AT_FDCWD = -100
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4


class SetupError(Exception):
    """The container's mounts or working directory cannot be set up."""


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            source.encode() if source is not None else None,
            target.encode(),
            fstype.encode() if fstype is not None else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {source or fstype or ''} on {target}",
    )


def _write(path: str, text: str) -> None:
    with open(path, "w") as out:
        out.write(text)


def enter_namespace() -> None:
    """Unshare a private mount namespace (inside a fresh user namespace when not root)."""
    if os.geteuid() == 0:
        _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    else:
        uid, gid = os.geteuid(), os.getegid()
        _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare(CLONE_NEWUSER|CLONE_NEWNS)")
        # Map only ourselves: the command keeps its uid; the namespace's capabilities (needed to
        # mount) are dropped by execve since that uid is not 0.
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
        _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
    # Like `unshare --propagation private`: no mount here propagates back to the host.
    _mount(None, "/", None, MS_REC | MS_PRIVATE)


def _mount_point(target: str, directory: bool) -> None:
    """Create a missing mount point on the host (it stays there, empty, after the container)."""
    if os.path.lexists(target):
        return
    parent = os.path.dirname(target.rstrip("/")) or "/"
    os.makedirs(parent, exist_ok=True)
    if directory:
        os.makedirs(target, exist_ok=True)
    else:
        with open(target, "a"):
            pass


def detach(source: str) -> tuple[int, bool]:
    """A detached clone of `source`'s mount (an fd), and whether it is a directory."""
    if not os.path.exists(source):
        raise SetupError(f"volume path {source} is missing")
    fd = _libc.syscall(
        SYS_OPEN_TREE,
        AT_FDCWD,
        source.encode(),
        ctypes.c_uint(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC),
    )
    if fd < 0:
        raise SetupError(f"open_tree {source}: {os.strerror(ctypes.get_errno())}")
    return int(fd), os.path.isdir(source)


def attach(fd: int, is_dir: bool, target: str, read_only: bool) -> None:
    """Attach a detached clone at `target` (remounted read-only when asked)."""
    try:
        _mount_point(target, is_dir)
    except OSError as exc:
        raise SetupError(f"cannot create mount point {target}: {exc.strerror}") from exc
    moved = _libc.syscall(
        SYS_MOVE_MOUNT,
        fd,
        b"",
        AT_FDCWD,
        target.encode(),
        ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH),
    )
    if moved != 0:
        raise SetupError(f"mount on {target}: {os.strerror(ctypes.get_errno())}")
    os.close(fd)
    if read_only:
        kept = os.statvfs(target).f_flag
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        flags |= sum(ms for st, ms in _KEEP if kept & st)
        _mount(None, target, None, flags)


def mask(path: str) -> None:
    """Hide a host directory behind an empty read-only tmpfs (if it exists on the host)."""
    if os.path.isdir(path):
        _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k")


def depth(path: str) -> int:
    """Number of components of an absolute path: parents are mounted before their children."""
    return len([p for p in os.path.normpath(path).split("/") if p])


def join_cgroup(procs: str | None) -> None:
    """Join the pod's CPU group (its `cgroup.procs`) before anything else, so the command is
    weighed from its first instruction. Never fatal: a command without its weight still runs
    (and this helper must never print)."""
    if procs:
        try:
            with open(procs, "w") as group:
                group.write("0")  # 0: the writing process, which the command then becomes
        except OSError:
            pass


def prepare(spec: dict[str, Any]) -> None:
    """Apply `spec` (CPU group, masks, mounts, workingDir) to this process."""
    join_cgroup(spec.get("cgroup"))
    mounts: list[dict[str, Any]] = spec.get("mounts") or []
    masks: list[str] = spec.get("masks") or []
    if mounts or masks:
        enter_namespace()
        for path in masks:  # first, so that a volume mounted at the same path lands on top
            mask(path)
        # Clone every source before attaching anything: a volume mounted over a parent of the
        # agent's state directory (an emptyDir at /tmp, with the state under /tmp) would hide
        # the sources of the mounts after it.
        detached = [(entry, detach(str(entry["source"]))) for entry in mounts]
        targets = [os.path.normpath(str(entry["target"])) for entry in mounts]
        # The host programs standing in for the image, where a mount would hide them.
        hidden = [
            path
            for path in spec.get("keep") or []
            if any(path.startswith(t.rstrip("/") + "/") for t in targets) and os.path.isdir(path)
        ]
        kept = [(path, detach(path)) for path in hidden]
        for entry, (fd, is_dir) in sorted(detached, key=lambda d: depth(str(d[0]["target"]))):
            attach(fd, is_dir, str(entry["target"]), bool(entry.get("readOnly")))
        for path, (fd, is_dir) in kept:
            attach(fd, is_dir, path, read_only=True)
    workdir = spec.get("workingDir")
    if workdir:
        try:
            os.chdir(workdir)
        except OSError as exc:
            raise SetupError(f"cannot change to working directory {workdir!r}: {exc}") from exc


def main(argv: list[str]) -> int:
    """`mounts.py STATUS_FD SPEC_JSON -- COMMAND ARGS...`: set up, then exec COMMAND."""
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: mounts.py STATUS_FD SPEC_JSON -- COMMAND [ARGS...]\n")
        return 2
    status_fd = int(argv[0])
    os.set_inheritable(status_fd, False)  # exec closes it: EOF tells the agent we started
    command = argv[3:]
    try:
        prepare(json.loads(argv[1]))
        os.execvpe(command[0], command, os.environ)
    except (SetupError, OSError) as exc:
        if isinstance(exc, SetupError):
            message = str(exc)
        else:  # exec failed: say it as the agent said it before this helper existed
            message = f"failed to start {command[0]!r}: {exc}"
        os.write(status_fd, message.encode(errors="replace"))
    return START_ERROR


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
