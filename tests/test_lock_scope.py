"""Per-node flock: a sweep on a filesystem whose ``flock`` locks only within one node (Lustre ``-o localflock``,
NFS ``local_lock=flock|all`` or ``nolock``) is refused by the sweep's lock with what to do; a network filesystem
whose options do not tell gets one note on stderr; a local one, and one whose locks reach every node, pass silently.

The verdicts are read from mount tables given as text (a mock of ``/proc/self/mountinfo``, as the names say); the
real lock is taken once on this machine's own filesystem."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrate.sweep.folder import SweepDir, SweepError

ROOT_FS = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard\n"
LUSTRE_LOCAL = "50 27 0:52 / /lustre rw,relatime shared:70 - lustre 10.0.0.1@o2ib:/fs rw,localflock,lazystatfs\n"
LUSTRE_FLOCK = "51 27 0:53 / /lustre2 rw,relatime - lustre 10.0.0.1@o2ib:/fs2 rw,flock,lazystatfs\n"
LUSTRE_SILENT = "52 27 0:54 / /lustre3 rw,relatime - lustre 10.0.0.1@o2ib:/fs3 rw,lazystatfs\n"
NFS_LOCAL = ("60 27 0:60 / /home rw,relatime shared:100 - nfs4 srv:/home rw,vers=4.2,hard,proto=tcp,"
             "local_lock=flock,addr=10.0.0.1\n")
NFS_NOLOCK = "61 27 0:61 / /data rw,relatime - nfs srv:/data rw,vers=3,nolock,proto=tcp,local_lock=all,addr=10.0.0.1\n"
NFS_SERVER = ("62 60 0:62 / /home/shared\\040dir rw,relatime - nfs4 srv:/s rw,vers=4.2,hard,local_lock=none,"
              "addr=10.0.0.1\n")
NFS_SILENT = "63 27 0:63 / /proj rw,relatime - nfs4 srv:/proj rw,vers=4.2,hard,addr=10.0.0.1\n"
BEEGFS = "64 27 0:64 / /beegfs rw,relatime - beegfs beegfs_nodev rw,cfgFile=/etc/beegfs/beegfs-client.conf\n"
GPFS = "65 27 0:65 / /gpfs rw,relatime - gpfs gpfs0 rw\n"
TABLE = ROOT_FS + LUSTRE_LOCAL + LUSTRE_FLOCK + LUSTRE_SILENT + NFS_LOCAL + NFS_NOLOCK + NFS_SERVER + NFS_SILENT \
    + BEEGFS + GPFS


@pytest.mark.parametrize(("path", "verdict", "words"), [
    ("/lustre/u/sweeps/s1", "per-node", ["/lustre", "localflock", "-o flock"]),
    ("/lustre2/u/sweeps", "cluster", []),
    ("/lustre3/u/sweeps", "unknown", ["/lustre3", "lustre"]),
    ("/home/u/sweeps", "per-node", ["/home", "local_lock=flock", "local_lock=none"]),
    ("/data/sweeps", "per-node", ["/data", "local_lock=all"]),
    ("/home/shared dir/sweeps", "cluster", []),  # the longest mount point prefix wins (octal escapes read)
    ("/home/shared dirx/sweeps", "per-node", ["/home"]),  # a prefix counts at a path separator only
    ("/proj/sweeps", "unknown", ["/proj", "nfs4"]),
    ("/beegfs/sweeps", "unknown", ["beegfs"]),
    ("/gpfs/sweeps", "cluster", []),
    ("/tmp/sweeps", "local", []),
])
def test_flock_scope_from_mocked_mountinfo(path: str, verdict: str, words: list[str]) -> None:
    from orchestrate.sweep.mounts import flock_scope, parse_mountinfo

    scope = flock_scope(Path(path), parse_mountinfo(TABLE))
    assert scope.verdict == verdict, scope
    for w in words:
        assert w in scope.message, scope.message


def test_sweep_lock_refuses_per_node_flock_with_mocked_mountinfo(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(ROOT_FS + f"70 27 0:70 / {tmp_path} rw - lustre 10.0.0.1@o2ib:/fs rw,localflock\n")
    monkeypatch.setattr("orchestrate.sweep.mounts.MOUNTINFO", str(table))
    monkeypatch.delenv("ORCHESTRATE_LOCAL_FLOCK_OK", raising=False)
    sweep = SweepDir(tmp_path / "sweeps", "s1")
    with pytest.raises(SweepError, match="localflock.*ORCHESTRATE_LOCAL_FLOCK_OK"):
        with sweep.lock("submit"):
            pass
    assert not (tmp_path / "sweeps" / "s1").exists()
    monkeypatch.setenv("ORCHESTRATE_LOCAL_FLOCK_OK", "1")  # every command and job on this one host: allowed
    with sweep.lock("submit"):
        assert (sweep.path / "lock").exists()


def test_sweep_lock_notes_a_network_filesystem_it_cannot_judge_with_mocked_mountinfo(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(ROOT_FS + f"71 27 0:71 / {tmp_path} rw - beegfs beegfs_nodev rw\n")
    monkeypatch.setattr("orchestrate.sweep.mounts.MOUNTINFO", str(table))
    with SweepDir(tmp_path / "sweeps", "s1").lock("submit"):
        pass
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot tell" in err[0] and "beegfs" in err[0], err


def test_sweep_lock_on_this_machines_filesystem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real mount table and the real flock: the sweep folder here is on a local filesystem or one whose locks
    reach every node, so the lock is taken and nothing is said."""
    sweep = SweepDir(tmp_path / "sweeps", "s1")
    with sweep.lock("submit"):
        assert (sweep.path / "lock").read_text().startswith("submit by pid")
    assert capsys.readouterr().err == ""
