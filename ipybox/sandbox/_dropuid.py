"""Run as root by the host, this starts bwrap under the kernel's own unprivileged host uid.

``python -I -S _dropuid.py PLAN -- bwrap ...``: in a mount namespace of its own (so nothing it
mounts is seen by the host), it bind-mounts each source the plan names at a staging path the
kernel's uid can reach (bwrap resolves its sources with the uid it runs as, and a venv under
``/root`` or a workspace under a ``0700`` directory are out of that uid's reach), the writable
ones as idmapped mounts (their owner's files appear as the kernel's, and what the kernel creates
is written as their owner's), then takes the kernel's uid and gid, drops every supplementary
group and execs bwrap. bwrap then makes its user namespace as that uid, so every per-user
counter the sandbox takes is that uid's, not host root's.

Standard library only, and no ipybox import: it runs with ``-I -S`` before anything else.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
from typing import TypedDict, cast

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
# The mount API's numbers are the same on every architecture (added after the syscall table unification).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_OPEN_TREE_CLONE = 1
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_IDMAP = 0x00100000
# Exit status when the plan cannot be carried out (the host reports stderr).
_FAILED = 125


class _Bind(TypedDict):
    src: str | None
    fd: int | None
    dst: str
    dir: bool
    idmap: list[int] | None


class _Plan(TypedDict):
    uid: int
    gid: int
    binds: list[_Bind]
    nproc: int | None
    rlimits: list[list[int]]


class _MountAttr(ctypes.Structure):
    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _mapping_namespace(owner_uid: int, owner_gid: int, uid: int, gid: int) -> int:
    """A user namespace mapping ``owner`` to the kernel's ids, for an idmapped mount: a child
    process makes it, this one writes its maps (as root, no ``setgroups`` deny needed)."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(ready_r)
            os.close(done_w)
            _check(_libc.unshare(_CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
            os.write(ready_w, b"1")
            os.read(done_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError("the process making the idmap's user namespace failed (user namespaces disabled?)")
        with open(f"/proc/{child}/uid_map", "w") as f:
            f.write(f"{owner_uid} {uid} 1\n")
        with open(f"/proc/{child}/gid_map", "w") as f:
            f.write(f"{owner_gid} {gid} 1\n")
        return os.open(f"/proc/{child}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(done_w)
        os.waitpid(child, 0)


def _idmapped_bind(source: str, target: str, userns: int) -> None:
    tree = _check(
        _syscall(_SYS_OPEN_TREE, -100, source.encode(), _OPEN_TREE_CLONE | os.O_CLOEXEC), f"open_tree({source})"
    )
    try:
        attr = _MountAttr(attr_set=_MOUNT_ATTR_IDMAP, userns_fd=userns)
        _check(
            _syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)),
            f"an idmapped mount of {source}",
        )
        _attach(tree, target)
    finally:
        os.close(tree)


def _clone_tree(fd: int) -> int:
    """A detached copy of the mount tree at ``fd``. Taken before this process has a mount namespace of
    its own: a bind of a descriptor opened in another namespace is refused (EINVAL), attaching a
    detached tree is not."""
    flags = _OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_EMPTY_PATH | _AT_RECURSIVE
    return _check(_syscall(_SYS_OPEN_TREE, fd, b"", flags), f"open_tree(descriptor {fd})")


def _attach(tree: int, target: str) -> None:
    _check(
        _syscall(_SYS_MOVE_MOUNT, tree, b"", -100, target.encode(), _MOVE_MOUNT_F_EMPTY_PATH), f"move_mount({target})"
    )


def _stage(plan: _Plan) -> None:
    uid, gid = plan["uid"], plan["gid"]
    trees = {bind["dst"]: _clone_tree(bind["fd"]) for bind in plan["binds"] if bind["fd"] is not None}
    _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "making / private")
    namespaces: dict[tuple[int, int], int] = {}
    for bind in plan["binds"]:
        fd, target = bind["fd"], bind["dst"]
        source = f"/proc/self/fd/{fd}" if fd is not None else str(bind["src"])
        if bind["dir"]:
            os.mkdir(target, 0o700)
        else:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        owner = bind["idmap"]
        if target in trees:
            _attach(trees.pop(target), target)
        elif owner is None:
            _check(_libc.mount(source.encode(), target.encode(), None, _MS_BIND | _MS_REC, None), f"binding {source}")
        else:
            key = (owner[0], owner[1])
            if key not in namespaces:
                namespaces[key] = _mapping_namespace(*key, uid, gid)
            _idmapped_bind(source, target, namespaces[key])
    for fd in [bind["fd"] for bind in plan["binds"]]:
        if fd is not None:
            os.close(fd)
    for userns in namespaces.values():
        os.close(userns)
    # Set here, as root, so that bwrap and the sandbox's init start with them: root without
    # CAP_SYS_RESOURCE cannot set another uid's limits once it runs.
    for which, value in plan["rlimits"]:
        resource.setrlimit(which, (value, value))
    nproc = plan["nproc"]
    if nproc is not None:
        # Counted per uid: with a uid of its own, this bounds the sandbox's processes even where
        # there is no pids cgroup (root is exempt from it, the kernel's uid is not).
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def main() -> None:
    plan = cast(_Plan, json.loads(sys.argv[1]))
    command = sys.argv[sys.argv.index("--") + 1 :]
    try:
        _stage(plan)
    except OSError as exc:
        print(f"ipybox could not start the sandbox under its own uid: {exc}", file=sys.stderr)
        sys.exit(_FAILED)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
