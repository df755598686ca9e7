"""The sweep's folder: ``<sweep_root>/<sweep>/`` holds everything a backend and a later ``resume`` need.

::

    sweep.json            name, id, grid, backend, profile, tracking URI, code versions (the manifest)
    trials.json           every trial of the sweep (key, label, sub-grids, seed, config)
    trials/<key>/         one folder per trial (asr_core.contract.trial.TrialFolder): config.json, checkpoint.pt,
                          trial.log, progress.jsonl, segments.jsonl, attempts.jsonl, lease/, outbox/, DONE, and
                          CANCELLED after `orchestrate cancel` (written here, before any job is stopped)
    code/<version>.diff   the uncommitted changes of a dirty code version that submitted or resumed the sweep
    submissions/<id>.json one file per submission: backend, trial keys in array-task order, job id once known
    lock                  held (flock) while a process submits, resumes, retries, cancels or runs the sweep locally

Every command that changes the sweep takes the lock before it writes anything (the manifest, the trials, a code
diff, a trial folder): a second command finds the sweep busy and exits having changed nothing. The lock is
``flock``: a filesystem without it (Lustre mounted without ``-o flock``, some NFS mounts) is refused with what to do
rather than run unfenced.

Submissions are written *before* the scheduler is called, and the scheduler's job name carries the sweep and the
submission id, so a submitting process that dies between ``sbatch`` and recording the job id is recovered by
``resume`` (it finds the job by name and maps array tasks to keys with this file).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shlex
import socket
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterator

from asr_core.config import Config
from asr_core.contract.atomic import backup_of, write_atomic
from asr_core.contract.evaluation import EvaluationSpec, is_evaluation
from asr_core.contract.trial import TrialFolder, mark_cancelled, write_config
from asr_core.contract.tracking import SWEEP_ROOT_ENV
from orchestrate.sweep.mounts import flock_problem
from orchestrate.sweep.trial import Trial


class SweepError(RuntimeError):
    """The sweep folder is missing, busy or inconsistent; the message says what to do."""


class SweepBusy(SweepError):
    """Another command holds the sweep's lock; ``holder`` is what it wrote there ("submit by pid 4242 on login01")."""

    def __init__(self, message: str, holder: str = "") -> None:
        super().__init__(message)
        self.holder = holder


class SweepFileError(SweepError):
    """A file of the sweep folder cannot be read (truncated, empty, not JSON, the wrong shape): the message names it,
    why, and how to get it back (its ``.bak``, when that one reads)."""

    def __init__(self, path: Path, what: str, why: str) -> None:
        self.path, self.what, self.why = path, what, why
        super().__init__(f"{path} ({what}) is unreadable: {why}; {restore_hint(path)}")


def restore_hint(path: Path) -> str:
    """What to do about an unreadable sweep file: restore its ``.bak`` when that one reads, else from a backup."""
    bak = backup_of(path)
    try:
        json.loads(bak.read_text())
        good_bak = True
    except (OSError, UnicodeDecodeError, ValueError):
        good_bak = False
    if good_bak:
        older = (" (it may lack the trials of the last submit: submit that grid again to add them)"
                 if path.name == TRIALS_FILE else "")
        return (f"restore the version before its last write with `cp {bak} {path}`{older}, then run the command "
                "again")
    if path.name == TRIALS_FILE:
        return ("restore it from a backup of the sweep folder, or move it aside and submit the sweep's grid(s) "
                "again with the same --sweep (a trial keeps its key, so it finds its folder and run again); the "
                "trial folders are intact")
    if path.name == MANIFEST_FILE:
        return ("restore it from a backup of the sweep folder (its sweep_id is the tag sweep.id of the sweep's "
                "MLflow experiment); the trial folders are intact")
    return "restore it from a backup of the sweep folder, or remove it if it is a stray file"


MANIFEST_FILE = "sweep.json"
TRIALS_FILE = "trials.json"
DEFAULT_MAX_FAILURES = 3  # a trial that failed this often (its own error, killed, lost) is left FAILED
# flock's answers on a filesystem that has no locks: NFS without lockd, Lustre without `-o flock`, some FUSE mounts
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


@dataclass(frozen=True)
class Manifest:
    name: str
    grid: str
    backend: str
    profile: str
    tracking_uri: str
    overrides: tuple[str, ...] = ()
    created: float = 0.0
    workdir: str = ""  # where `submit` ran: trials run there, so relative data paths mean the same thing
    sweep_id: str = ""  # written once when the folder is created; the MLflow experiment carries it (ownership)
    code: tuple[str, ...] = ()  # code versions (contract.provenance labels) that submitted or resumed it, in order
    max_failures: int = DEFAULT_MAX_FAILURES  # failures (attempts.jsonl) after which a trial stays FAILED
    allow_sqlite: bool = False  # a cluster backend may use a sqlite ledger (`submit --allow-sqlite`): jobs share a host

    def with_code(self, label: str) -> "Manifest":
        """This manifest with ``label`` appended to :attr:`code` unless it is already the latest."""
        return self if self.code[-1:] == (label,) else replace(self, code=self.code + (label,))


def new_sweep_id() -> str:
    return uuid.uuid4().hex


def read_json(path: Path, what: str, shape: type) -> Any:
    """``path`` parsed as JSON of ``shape`` (dict or list), or :class:`SweepFileError` naming it. ``what`` says what
    the file is, for the message."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SweepFileError(path, what, f"{type(e).__name__}: {e}") from None
    if not isinstance(data, shape):
        raise SweepFileError(path, what, f"a JSON {type(data).__name__}, not the {shape.__name__} it should be")
    return data


class SweepDir:
    """A sweep's folder on disk (shared with the compute nodes on a cluster)."""

    def __init__(self, root: str | Path, name: str) -> None:
        _check_name(name)
        self.name = name
        self.path = (Path(root) / name).resolve()

    def command(self, verb: str) -> str:
        """The command line ``orchestrate VERB`` of this sweep that works from any folder (its root spelled out)."""
        return f"orchestrate {verb} {self.name} --sweep-root {shlex.quote(str(self.path.parent))}"

    # ---- manifest and trials ----------------------------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST_FILE

    @property
    def trials_path(self) -> Path:
        return self.path / TRIALS_FILE

    def exists(self) -> bool:
        return self.manifest_path.exists()

    def read_manifest(self) -> Manifest:
        try:
            d = read_json(self.manifest_path, "the sweep's manifest", dict)
        except FileNotFoundError:
            raise SweepError(f"no sweep {self.name!r} under {self.path.parent} (no {self.manifest_path}); "
                             f"submit it first, or pass --sweep-root (or set ${SWEEP_ROOT_ENV})") from None
        known = set(Manifest.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise SweepError(f"{self.manifest_path}: unknown field {unknown[0]!r} (written by a newer version of the "
                             "project?); update the project, or remove the field")
        try:
            d["overrides"] = tuple(d.get("overrides", ()))
            d["code"] = tuple(d.get("code", ()))
            m = Manifest(**d)
        except TypeError as e:
            raise SweepFileError(self.manifest_path, "the sweep's manifest", str(e)) from None
        if not all(isinstance(getattr(m, f), str) for f in ("name", "grid", "backend", "tracking_uri")):
            raise SweepFileError(self.manifest_path, "the sweep's manifest", "name, grid, backend and tracking_uri "
                                 "must be strings")
        return m

    def write_manifest(self, m: Manifest) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.manifest_path, json.dumps(asdict(m), indent=1), keep=True)

    def read_trials(self) -> list[Trial]:
        p = self.trials_path
        try:
            rows = read_json(p, "the sweep's trials", list)
        except FileNotFoundError:
            return []
        try:
            return [Trial.from_dict(d) for d in rows]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise SweepFileError(p, "the sweep's trials", f"a trial record is not one ({type(e).__name__}: "
                                 f"{e})") from None

    def write_trials(self, trials: list[Trial]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.trials_path, json.dumps([t.to_dict() for t in trials]), keep=True)

    def trial_keys_on_disk(self) -> list[str]:
        """The keys of every trial folder under ``trials/`` (what ``cancel`` finds when ``trials.json`` is
        unreadable)."""
        d = self.path / "trials"
        return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []

    def trial_dir(self, key: str) -> Path:
        return self.path / "trials" / key

    def prepare_trial(self, trial: Trial) -> Path:
        """The trial's folder with the config.json its job reads: written when missing or when the trial's
        execution settings or data locations changed (same key, so the same experiment); a finished trial's is
        left as it ran."""
        folder = TrialFolder(self.trial_dir(trial.key))
        folder.path.mkdir(parents=True, exist_ok=True)
        if folder.done.exists():
            return folder.path
        config = trial.config
        if folder.evaluated.exists() and folder.config.exists():  # its evaluation is done: keep the one it ran
            config = replace(config, eval=Config.from_yaml(folder.config, stored=True).eval)
        if trial.evaluation is not None and not is_evaluation(folder.path):
            EvaluationSpec.from_dict(trial.evaluation).write(folder.path)
        write_config(folder.path, config)
        return folder.path

    def cancel_trial(self, key: str, why: str) -> bool:
        """Write ``CANCELLED`` into the trial's folder (the job then ends KILLED and is never requeued); False when
        it was there already."""
        folder = TrialFolder(self.trial_dir(key))
        if folder.cancelled.exists():
            return False
        folder.path.mkdir(parents=True, exist_ok=True)
        mark_cancelled(folder.path, why)
        return True

    def uncancel_trial(self, key: str) -> bool:
        """Remove the trial's ``CANCELLED`` (``retry --cancelled``); False when there was none."""
        folder = TrialFolder(self.trial_dir(key))
        try:
            folder.cancelled.unlink()
        except FileNotFoundError:
            return False
        return True

    def save_diff(self, label: str, diff: str) -> Path:
        """Keep the uncommitted changes of a dirty code version beside the manifest (``code/<label>.diff``)."""
        d = self.path / "code"
        d.mkdir(parents=True, exist_ok=True)
        out = d / f"{label.replace('+', '-')}.diff"
        write_atomic(out, diff)
        return out

    # ---- submissions ------------------------------------------------------------------------------------------------
    @property
    def submissions_dir(self) -> Path:
        return self.path / "submissions"

    def new_submission(self, backend: str, keys: list[str], run_ids: dict[str, str]) -> "Submission":
        sub_id = time.strftime("%Y%m%d%H%M%S") + "-" + uuid.uuid4().hex[:6]
        s = Submission(self, sub_id, {"id": sub_id, "backend": backend, "keys": keys,
                                      "run_ids": [run_ids[k] for k in keys], "job_id": None,
                                      "created": time.time()})
        s.save()
        return s

    def submissions(self) -> list["Submission"]:
        if not self.submissions_dir.exists():
            return []
        return [self.submission(p.stem) for p in sorted(self.submissions_dir.glob("*.json"))]

    def submission_ids(self) -> list[str]:
        """The id of every submission file, readable or not, oldest first (its job name is ``orch.<sweep>.<id>``)."""
        return sorted(p.stem for p in self.submissions_dir.glob("*.json")) if self.submissions_dir.is_dir() else []

    def job_name(self, sub_id: str) -> str:
        """The scheduler's name for submission ``sub_id``'s jobs (``orch.<sweep>.<id>``): finds them again after a
        crash, or when the submission's own file does not read."""
        return f"orch.{self.name}.{sub_id}"

    def submission(self, sub_id: str) -> "Submission":
        p = self.submissions_dir / f"{sub_id}.json"
        data = read_json(p, "a submission record", dict)
        if not isinstance(data.get("keys"), list):
            raise SweepFileError(p, "a submission record", "it lists no trial keys")
        return Submission(self, sub_id, data)

    # ---- exclusive access -------------------------------------------------------------------------------------------
    @contextmanager
    def lock(self, what: str) -> Iterator[None]:
        """One command at a time: two concurrent ``submit``/``resume`` calls could otherwise both create a run
        for the same key. A local sweep holds it while its trials run.

        Taken before the command reads the sweep's files (``sweep.json``, ``trials.json``) that it may write back,
        so that no command writes a copy read before another changed them. A busy sweep raises :class:`SweepBusy`
        having changed no file (the folder and its lock file are created only when the sweep is new, and removed
        again when the command fails having written nothing else). A filesystem without ``flock`` raises
        :class:`SweepError` saying how to get one, and leaves no folder or lock file it created. Reentrant within
        one process: a command holding the lock calls code that takes it again."""
        if self.path in _HELD:
            yield
            return
        if (per_node := flock_problem(self.path)) is not None:  # flock that locks within one node only
            raise SweepError(per_node)
        created = [p for p in (self.path, *self.path.parents) if not p.exists()]  # deepest first: removed so
        new_dir = bool(created)
        self.path.mkdir(parents=True, exist_ok=True)
        lock_path = self.path / "lock"
        new_file = not lock_path.exists()
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
                raise SweepBusy(f"sweep {self.name!r} is busy ({holder or 'another process'}); wait for it, or "
                                "stop that process first", holder=holder) from None
            except OSError as e:
                if e.errno not in NO_LOCKS:
                    raise
                if new_file:
                    lock_path.unlink(missing_ok=True)
                _remove_empty(*created)
                raise SweepError(
                    f"{lock_path}: the filesystem holding the sweep has no file locks (flock: {e.strerror}); "
                    "two commands could then change the sweep at once. Mount it with locks (Lustre: `-o flock`; "
                    "NFS: with lockd running; per-node locks such as `local_lock=flock` only with "
                    "ORCHESTRATE_LOCAL_FLOCK_OK=1 when every command and job runs on this one host), or "
                    "pass --sweep-root on a filesystem with locks (the compute nodes must see it too)") from None
            before, stat = os.pread(fd, 4096, 0), os.fstat(fd)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{what} by pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
            _HELD.add(self.path)
            try:
                yield
            except BaseException:
                if new_dir and set(os.listdir(self.path)) <= {"lock"}:  # a new sweep that got nothing: no trace
                    lock_path.unlink(missing_ok=True)
                    _remove_empty(*created)
                elif not new_file:  # a refused command leaves even the holder line as it found it
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, before, 0)
                    os.utime(fd, ns=(stat.st_atime_ns, stat.st_mtime_ns))
                raise
            finally:
                _HELD.discard(self.path)
        finally:
            os.close(fd)


_HELD: set[Path] = set()  # sweep folders whose lock this process holds


def _remove_empty(*folders: Path) -> None:
    """Remove each of ``folders``, in order, while it is empty (folders this process created and left nothing in;
    give the deepest first)."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


class Submission:
    """One call to a scheduler: the keys it carries (array index i runs keys[i]) and the job id once known."""

    def __init__(self, sweep: SweepDir, sub_id: str, data: dict[str, Any]) -> None:
        self.sweep = sweep
        self.id = sub_id
        self.data = data

    @property
    def path(self) -> Path:
        return self.sweep.submissions_dir / f"{self.id}.json"

    @property
    def keys(self) -> list[str]:
        return list(self.data["keys"])

    @property
    def job_id(self) -> str | None:
        return self.data.get("job_id")

    def job_name(self) -> str:
        """Scheduler job name: finds this submission again after a crash (``orch.<sweep>.<id>``)."""
        return self.sweep.job_name(self.id)

    def save(self) -> None:
        self.sweep.submissions_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(self.data, indent=1))

    def record_job(self, job_id: str) -> None:
        self.data["job_id"] = job_id
        self.save()


def _check_name(name: str) -> None:
    ok = name and all(c.isalnum() or c in "-_" for c in name) and not name.startswith("-")
    if not ok:
        raise SweepError(f"invalid sweep name {name!r}; valid: letters, digits, '-' and '_' (it names a folder, an "
                         "MLflow experiment and SLURM jobs)")


def merge_trials(known: list[Trial], grid_trials: list[Trial]) -> list[Trial]:
    """The sweep's trials after a later ``submit``: every trial it had, in order, then the grid's new ones.

    A grid trial whose key the sweep already has is the same experiment: it takes the grid's config (its execution
    settings and data locations may have changed) and keeps its key, label and run. A trial recorded under a key
    of an older version of the project is matched by its science and keeps the old key, so its runs stay found."""
    by_key = {t.key: t for t in known}
    by_science = {t.config.key(): t for t in known if not t.is_evaluation}  # a job carries its model's config
    merged: dict[str, Trial] = dict(by_key)
    added: list[Trial] = []
    for g in grid_trials:
        old = by_key.get(g.key) or by_science.get(g.key)
        if old is None:
            added.append(g)
            continue
        subgrids = old.subgrids + tuple(s for s in g.subgrids if s not in old.subgrids)
        merged[old.key] = replace(old, config=g.config, subgrids=subgrids)
    return list(merged.values()) + added
