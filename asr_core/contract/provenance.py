"""Which code ran: the git commit of the checkout that holds ``asr_core``, and whether its work tree was dirty.

:func:`code_version` answers with a :class:`CodeVersion` whose :attr:`~CodeVersion.label` is what the ledger
records: ``1a2b3c4d5e6f`` (a clean tree at that commit), ``1a2b3c4d5e6f+dirty.0f1e2d3c`` (a dirty one; the part
after :data:`DIRTY_SUFFIX` is the start of the SHA-256 of its diff, so two different uncommitted states of one
commit get two labels and the same state always the same one) or ``unknown``. It never raises: a job must run the same
whether or not git is installed or the code is a git checkout at all, so every failure becomes ``unknown`` with
the reason in :attr:`~CodeVersion.why`.

What counts as dirty:

* any change to a tracked file, staged or not, anywhere in the repository (``git diff HEAD`` is not empty);
* an untracked file inside a Python package of the repository (a top-level folder with an ``__init__.py``):
  an import can pick it up, so it is code that ran. Compiled files (``__pycache__``, ``*.pyc``) are copies of
  sources and do not count. Untracked files elsewhere (sweep folders, data, notes) are not code and do not count.

The diff of a dirty tree is ``git diff HEAD`` followed by one "new file" patch per untracked file that counts, so
that ``git apply`` on the commit rebuilds the code that ran (binary files and files over :data:`MAX_NEW_FILE_BYTES`
are named but not included, as git itself does for binaries).

Cost: one ``git status`` for a clean tree, a ``git diff`` more for a dirty one, each under :data:`GIT_TIMEOUT_S`.
Neither takes git's index lock (``GIT_OPTIONAL_LOCKS=0``), so a job never blocks a person committing in the same
checkout.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

UNKNOWN = "unknown"
DIRTY_SUFFIX = "+dirty"  # the label of a dirty tree: <commit>+dirty.<DIFF_DIGITS hex of sha256(diff)>
DIFF_DIGITS = 8  # tells apart the few uncommitted states one commit runs with; the diff itself is kept in full
LABEL_DIGITS = 12  # short enough for a tag list, long enough to stay unique in any repository this project sees
GIT_TIMEOUT_S = 10.0
MAX_NEW_FILE_BYTES = 1 << 20  # an untracked file this large is data, not a source file someone forgot to add
_COMPILED = ("__pycache__",)
_COMPILED_SUFFIXES = (".pyc", ".pyo")
_INSTALLED = ("site-packages", "dist-packages")


@dataclass(frozen=True)
class CodeVersion:
    """The code version of a checkout.

    ``commit`` is the full hash of ``HEAD`` (None when unknown); ``dirty`` whether the work tree differs from it
    (see the module docstring); ``diff`` the patch from ``commit`` to the work tree ("" when clean); ``root`` the
    checkout's top folder; ``why`` the reason the version is unknown ("" when known)."""

    commit: str | None
    dirty: bool = False
    diff: str = field(default="", repr=False)
    root: Path | None = None
    why: str = ""

    @property
    def known(self) -> bool:
        return self.commit is not None

    @property
    def label(self) -> str:
        """``1a2b3c4d5e6f`` (clean), ``1a2b3c4d5e6f+dirty.0f1e2d3c`` (dirty: :attr:`diff_digest`) or ``unknown``."""
        if self.commit is None:
            return UNKNOWN
        if not self.dirty:
            return self.commit[:LABEL_DIGITS]
        return f"{self.commit[:LABEL_DIGITS]}{DIRTY_SUFFIX}.{self.diff_digest}"

    @property
    def diff_digest(self) -> str:
        """The first :data:`DIFF_DIGITS` hex digits of the SHA-256 of :attr:`diff` (as the bytes it was read as)."""
        data = self.diff.encode(errors="surrogateescape")
        return hashlib.sha256(data).hexdigest()[:DIFF_DIGITS]

    def to_dict(self) -> dict[str, object]:
        """The JSON form recorded per trial segment and in sweep manifests (the diff is stored separately)."""
        return {"code": self.label, "commit": self.commit, "dirty": self.dirty}


def _unknown(why: str, root: Path | None = None) -> CodeVersion:
    return CodeVersion(commit=None, root=root, why=why)


def _find_root(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` holding ``.git`` (a folder, or a file in worktrees and
    submodules); walking up here saves a ``git rev-parse`` call."""
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def _git(root: Path, *args: str) -> str:
    """stdout of ``git args`` in ``root``; raises OSError / subprocess errors, which :func:`code_version` turns
    into ``unknown``."""
    # GIT_DIR and friends inherited from a hook or an IDE would point git at another repository than ``root``
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_OPTIONAL_LOCKS"] = "0"
    env["LC_ALL"] = "C"
    out = subprocess.run(["git", *args], cwd=root, env=env, capture_output=True, timeout=GIT_TIMEOUT_S,
                         stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        err = out.stderr.decode(errors="replace").strip().splitlines()
        raise subprocess.CalledProcessError(out.returncode, ["git", *args], stderr=err[-1] if err else "")
    return out.stdout.decode(errors="surrogateescape")


def _counts_untracked(root: Path, rel: str) -> bool:
    parts = rel.rstrip("/").split("/")
    if any(p in _COMPILED for p in parts) or rel.endswith(_COMPILED_SUFFIXES):
        return False
    return (root / parts[0] / "__init__.py").is_file()


def _untracked_files(root: Path, rel: str) -> list[str]:
    """``rel`` itself, or every file under it when git reported an untracked folder (``dir/``)."""
    if not rel.endswith("/"):
        return [rel]
    files = []
    for folder, dirs, names in os.walk(root / rel):
        dirs[:] = sorted(d for d in dirs if d not in _COMPILED)
        for name in sorted(names):
            if not name.endswith(_COMPILED_SUFFIXES):
                files.append(Path(folder, name).relative_to(root).as_posix())
    return files


def _new_file_patch(root: Path, rel: str) -> str:
    """A git-style "new file" patch of an untracked file."""
    path = root / rel
    try:
        mode = "100755" if os.access(path, os.X_OK) else "100644"
        data = path.read_bytes() if path.stat().st_size <= MAX_NEW_FILE_BYTES else None
    except OSError:
        return ""
    head = f"diff --git a/{rel} b/{rel}\nnew file mode {mode}\n"
    if data is None or b"\0" in data:
        return head + f"Binary files /dev/null and b/{rel} differ\n"
    if not data:
        return head
    text = data.decode(errors="surrogateescape")
    lines = text.splitlines(keepends=True)
    body = "".join("+" + ln if ln.endswith("\n") else "+" + ln + "\n\\ No newline at end of file\n" for ln in lines)
    return head + f"--- /dev/null\n+++ b/{rel}\n@@ -0,0 +1,{len(lines)} @@\n" + body


def cpu_kernels() -> str:
    """The CPU kernel level PyTorch runs with (``default``, ``avx2``, ``avx512`` on x86; ``ATEN_CPU_CAPABILITY``
    lowers it): kernels of different levels sum in different orders, so the same seed trains other weights on
    another level. "" when torch cannot say. Never raises."""
    try:
        import torch

        return str(torch.backends.cpu.get_cpu_capability()).lower()
    except Exception:  # noqa: BLE001  provenance must never stop a job
        return ""


X86_LEVELS = ("default", "avx2", "avx512")


def cpu_level() -> str:
    """The x86 kernel level this CPU itself has (``avx512``: avx512f, bw, vl and dq; ``avx2``; else ``default``),
    whatever ``ATEN_CPU_CAPABILITY`` says; "" off x86 Linux."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return ""
    if not flags:
        return ""
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "default"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else :func:`platform.processor`); "" when unknown. Never raises."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def code_version(path: Path | str | None = None) -> CodeVersion:
    """The code version of the checkout holding ``path`` (default: the ``asr_core`` package). Never raises."""
    start = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        start = start.resolve()
        if path is None and any(p in _INSTALLED for p in start.parts):
            # an installed copy: whatever checkout encloses the virtual environment is not the code that runs
            return _unknown(f"{start} is an installed copy, not a git checkout")
        root = _find_root(start if start.is_dir() else start.parent)
        if root is None:
            return _unknown(f"{start} is not inside a git checkout")
        status = _git(root, "status", "--porcelain=v2", "-z", "--branch", "--untracked-files=normal")
        commit, tracked, untracked = None, False, []
        entries = iter(status.split("\0"))
        for entry in entries:
            if entry.startswith("# branch.oid "):
                oid = entry.split()[2]
                commit = oid if oid != "(initial)" else None
            elif entry[:2] in ("1 ", "2 ", "u "):
                tracked = True
                if entry[:2] == "2 ":
                    next(entries, None)  # a rename's original path is one more field, not an entry
            elif entry.startswith("? ") and _counts_untracked(root, entry[2:]):
                untracked.append(entry[2:])
        if commit is None:
            return _unknown(f"the git repository at {root} has no commit yet", root)
        if not tracked and not untracked:
            return CodeVersion(commit=commit, root=root)
        diff = _git(root, "diff", "HEAD", "--no-color", "--no-ext-diff") if tracked else ""
        new = [_new_file_patch(root, f) for rel in untracked for f in _untracked_files(root, rel)]
        return CodeVersion(commit=commit, dirty=True, diff=diff + "".join(new), root=root)
    except FileNotFoundError:
        return _unknown("git is not installed (no 'git' on PATH)")
    except subprocess.TimeoutExpired:
        return _unknown(f"git took longer than {GIT_TIMEOUT_S:g} s")
    except subprocess.CalledProcessError as e:
        return _unknown(f"git failed: {e.stderr or e}")
    except (OSError, ValueError, IndexError) as e:
        return _unknown(f"cannot read the git state: {e}")
