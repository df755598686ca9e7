"""What a lease's liveness is judged by (:mod:`asr_core.contract.folder.lease`): the shared filesystem's clock, and
the processes of this host.

One clock
    A lease's heartbeat is its file's mtime, stamped by the filesystem (``os.utime(path)`` with no time: NFS sets
    the server's time). A reader compares it with the filesystem's "now" in the same folder, :func:`fs_now`: the
    mtime of a probe file it creates and touches there (and removes), carried forward by this process's monotonic
    clock between probes (one probe per filesystem per :data:`PROBE_EVERY_S`; a released lease needs none, so
    reading a finished sweep writes nothing). Neither node's wall clock enters the verdict, so a skew between the
    holder's node and the reader's cannot make a live lease look dead, nor a dead one live. A filesystem whose
    clients stamp times themselves (a local disk, some parallel filesystems) is one clock on one node and the nodes'
    clocks across nodes, as before. A folder the reader cannot write (a teammate's sweep) gives no probe: the reader
    then uses its own clock.

Processes of this host
    :func:`pid_alive` (a zombie or a reused pid counts as dead) and :func:`pid_start` from ``/proc/PID/stat``.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path

PROBE_EVERY_S = 60.0  # how long one probe of a filesystem's clock is carried forward by the monotonic clock
# st_dev -> (the filesystem's time at the probe, time.monotonic() then), or None: that folder cannot be probed
_probes: dict[int, tuple[float, float] | None] = {}
_probed_at: dict[int, float] = {}


def fs_now(folder: Path | str, max_age_s: float = PROBE_EVERY_S) -> float | None:
    """The shared filesystem's clock now, as stamped in ``folder`` (seconds since the epoch), or None when no probe
    file can be written there. A probe younger than ``max_age_s`` is reused (moved on by the monotonic clock)."""
    try:
        dev = os.stat(folder).st_dev
    except OSError:
        return None
    mono = time.monotonic()
    if dev in _probed_at and mono - _probed_at[dev] < max_age_s:
        probe = _probes[dev]
        return None if probe is None else probe[0] + (mono - probe[1])
    probe = _probe(Path(folder))
    _probes[dev], _probed_at[dev] = probe, time.monotonic()
    return None if probe is None else probe[0] + (time.monotonic() - probe[1])


def _probe(folder: Path) -> tuple[float, float] | None:
    """(the mtime the filesystem stamps on a file touched now in ``folder``, time.monotonic() then)."""
    path = folder / f".clock.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return None
    try:
        os.close(fd)
        before = time.monotonic()
        os.utime(path)  # no time given: the filesystem's own "now" (NFS: SET_TO_SERVER_TIME)
        stamped = os.stat(path).st_mtime
        return stamped, (before + time.monotonic()) / 2
    except OSError:
        return None
    finally:
        try:
            path.unlink()
        except OSError:
            pass


# ---- processes of this host ----------------------------------------------------------------------------------------
def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of a pid from ``/proc/PID/stat``; None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
        fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def pid_start(pid: int) -> int | None:
    """The start time of ``pid`` (``/proc/PID/stat`` ticks), to tell a reused pid; None when unreadable."""
    stat = proc_stat(pid)
    return stat[1] if stat else None


def pid_alive(pid: int, start: int | None = None) -> bool:
    """Whether ``pid`` (of this host) is a running process, and the one that started at ``start`` when given.

    A zombie (dead, not yet reaped by its parent) is dead. A pid that cannot be judged (0, negative) counts as
    alive: its lease then ends by staleness only."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    except OSError:
        return True
    stat = proc_stat(pid)
    if stat is None:
        return not os.path.isdir("/proc/self")  # no /proc on this system: trust kill(); else it just ended
    state, started = stat
    if state in ("Z", "X", "x"):
        return False
    return start is None or started == start
