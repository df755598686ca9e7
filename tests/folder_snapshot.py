"""A snapshot of a folder tree, to show that a refused command changed nothing in it."""

from __future__ import annotations

from pathlib import Path


def snapshot(folder: Path) -> dict[str, tuple[str, int, bytes]]:
    """Every file and folder under ``folder`` (itself included), by relative path: kind, mtime (ns) and bytes. A
    folder's mtime changes when an entry is created or removed in it, even a temporary file that is gone again, so
    equal snapshots mean nothing was written. An absent folder gives {}."""
    out: dict[str, tuple[str, int, bytes]] = {}
    if not folder.exists():
        return out
    for p in sorted([folder, *folder.rglob("*")]):
        st = p.lstat()
        rel = str(p.relative_to(folder))
        out[rel] = ("dir", st.st_mtime_ns, b"") if p.is_dir() else ("file", st.st_mtime_ns, p.read_bytes())
    return out
