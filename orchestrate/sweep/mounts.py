"""Whether the sweep's ``flock`` reaches every node: the filesystem holding a path, from the mount table.

The sweep's lock (:meth:`orchestrate.sweep.folder.SweepDir.lock`) and the SLURM throttle take ``flock`` and trust it
across the login and compute nodes. Some mounts grant ``flock`` while locking only within one node: Lustre with
``-o localflock``, NFS with ``local_lock=flock`` or ``local_lock=all`` (``nolock`` implies it), GFS2 and OCFS2 with
``localflocks``. There two commands on two nodes would both get the lock. :func:`flock_scope` reads the options of the
mount holding a path (``/proc/self/mountinfo``, the longest mount point that is a prefix of the path) and answers
``local`` (a filesystem of this machine only), ``cluster`` (locks reach every node), ``per-node`` (refused, with what to
do) or ``unknown`` (a network filesystem whose options do not tell: one note on stderr, once per process and mount).
``ORCHESTRATE_LOCAL_FLOCK_OK=1`` accepts per-node locks for a sweep that every command and job touches from one host
only (the local backend). Without a readable mount table (not Linux) nothing is said.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = "/proc/self/mountinfo"
ENV_LOCAL_OK = "ORCHESTRATE_LOCAL_FLOCK_OK"
# filesystems of one machine: a lock there is the machine's, which is all it can be
LOCAL_TYPES = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "tmpfs", "ramfs", "overlay", "f2fs", "vfat",
                         "exfat", "ntfs", "ntfs3", "reiserfs", "jfs", "bcachefs", "squashfs", "hfsplus", "devtmpfs"})
# network filesystems whose flock reaches every client unless an option below says otherwise
CLUSTER_TYPES = frozenset({"gpfs", "ceph", "fuse.ceph-fuse", "gfs2", "ocfs2"})


@dataclass(frozen=True)
class Mount:
    """One line of the mount table: where it is mounted, its type and source, and all its options."""

    point: str
    fstype: str
    source: str
    options: frozenset[str]


@dataclass(frozen=True)
class FlockScope:
    """What the mount holding a path makes of ``flock``: ``verdict`` one of ``local``, ``cluster``, ``per-node``,
    ``unknown``; ``message`` says why and, where needed, what to do."""

    verdict: str
    mount: Mount | None
    message: str = ""


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a ``/proc/PID/mountinfo`` text, in its order (a later mount on one point hides earlier ones)."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 2:
            continue
        options = set(fields[5].split(",")) | set((tail[2] if len(tail) > 2 else "").split(","))
        mounts.append(Mount(_unescape(fields[4]), tail[0], _unescape(tail[1]), frozenset(options - {""})))
    return mounts


def mount_of(path: Path, mounts: list[Mount]) -> Mount | None:
    """The mount holding ``path``: the longest mount point that is ``path`` or one of its parents (the last
    mounted, among equals)."""
    text = str(path)
    best: Mount | None = None
    for m in mounts:
        point = m.point.rstrip("/") or "/"
        inside = text == point or text.startswith(point if point == "/" else point + "/")
        if inside and (best is None or len(point) >= len(best.point.rstrip("/") or "/")):
            best = m
    return best


def _option(options: frozenset[str], name: str) -> str | None:
    return next((o.split("=", 1)[1] for o in options if o.startswith(name + "=")), None)


def flock_scope(path: Path, mounts: list[Mount]) -> FlockScope:
    """Whether ``flock`` on ``path`` (absolute, symlinks resolved) locks across nodes, by its mount's type and
    options (see the module's docstring)."""
    m = mount_of(path, mounts)
    if m is None:
        return FlockScope("unknown", None, f"{path} is on no mount in the mount table")
    fs, opts = m.fstype, m.options
    where = f"{path} is on {m.point} ({fs} {m.source})"
    if fs in LOCAL_TYPES:
        return FlockScope("local", m)
    if fs == "lustre":
        if "localflock" in opts:
            return FlockScope("per-node", m, f"{where}, mounted with localflock: flock there locks within one node "
                              "only; mount it with -o flock")
        if "flock" in opts:
            return FlockScope("cluster", m)
    elif fs in ("nfs", "nfs4"):
        local_lock = _option(opts, "local_lock")
        if local_lock in ("flock", "all") or "nolock" in opts:
            return FlockScope("per-node", m, f"{where}, mounted with local_lock={local_lock or 'all'} "
                              f"{'(nolock) ' if 'nolock' in opts else ''}: flock there locks within one node only; "
                              "mount it with local_lock=none (and lockd running for NFSv3)")
        if local_lock in ("none", "posix"):
            return FlockScope("cluster", m)
    elif fs in CLUSTER_TYPES:
        if "localflocks" in opts:
            return FlockScope("per-node", m, f"{where}, mounted with localflocks: flock there locks within one node "
                              "only; mount it without localflocks")
        return FlockScope("cluster", m)
    return FlockScope("unknown", m, f"{where}, a filesystem whose mount options do not say whether flock locks "
                      "across nodes")


_noted: set[str] = set()


def flock_problem(path: Path) -> str | None:
    """The refusal for a sweep folder at ``path`` whose ``flock`` is per node (None when it is not, or when
    :data:`ENV_LOCAL_OK` accepts it); a mount it cannot judge is noted on stderr once per process."""
    try:
        with open(MOUNTINFO, encoding="utf-8", errors="replace") as f:
            mounts = parse_mountinfo(f.read())
    except OSError:
        return None
    scope = flock_scope(Path(os.path.realpath(path)), mounts)
    if scope.verdict == "per-node" and os.environ.get(ENV_LOCAL_OK, "") not in ("1", "true", "yes"):
        return (f"{scope.message}, or pass --sweep-root on a filesystem whose locks reach every node; two "
                f"commands on two nodes would otherwise both hold the sweep's lock. Only if every command and job "
                f"of this sweep runs on this one host (the local backend), set {ENV_LOCAL_OK}=1")
    if scope.verdict == "unknown" and scope.mount is not None and scope.mount.point not in _noted:
        _noted.add(scope.mount.point)
        print(f"note: {scope.message}; orchestrate cannot tell whether the sweep's lock holds across nodes (it does "
              f"if the filesystem's flock is cluster-wide)", file=sys.stderr, flush=True)
    return None
