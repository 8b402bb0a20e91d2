"""Paths checked before they are used: an output path before the work that fills it (a run must not simulate
for an hour and then find that ``--out`` or ``--report`` names a file, sits under a file or cannot be
written), and an input path before it is read (a device such as ``/dev/zero`` or a pipe is never read
whole)."""

from __future__ import annotations

import os
from pathlib import Path

from tpusim.errors import TpusimError

__all__ = [
    "InputPathError",
    "OutputPathError",
    "check_output_path",
    "fresh_path",
    "regular_file_problem",
    "same_file",
]


class OutputPathError(TpusimError):
    """An output file or folder that cannot be written where the user asked."""


class InputPathError(TpusimError):
    """An input path that names something other than a file to read."""


def regular_file_problem(path: str | Path) -> str | None:
    """Why ``path`` must not be read as an input file (None: it can be tried, and a missing file or a folder
    gets its reader's own error): it is not a regular file but a device, a pipe or a socket, whose reading
    might never end (``/dev/zero``)."""
    p = Path(path)
    if p.exists() and not p.is_file() and not p.is_dir():
        return "is not a regular file (a device, a pipe or a socket)"
    return None


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name the same existing file."""
    try:
        return Path(a).exists() and Path(b).exists() and os.path.samefile(a, b)
    except OSError:
        return False


def fresh_path(path: str | Path) -> Path:
    """``path`` if nothing is there yet, else the first of ``NAME-2``, ``NAME-3`` ... (before the suffix) that
    is free: a default output never replaces what an earlier run wrote."""
    path = Path(path)
    if not path.exists():
        return path
    suffix = "".join(path.suffixes) if path.suffix and not path.is_dir() else ""
    stem = path.name[: len(path.name) - len(suffix)] if suffix else path.name
    n = 2
    while (path.parent / f"{stem}-{n}{suffix}").exists():
        n += 1
    return path.parent / f"{stem}-{n}{suffix}"


def check_output_path(path: str | Path, flag: str, *, folder: bool) -> Path:
    """Check that ``path`` can be written as a file (``folder=False``) or as a folder, without creating
    anything; returns it as a Path.

    Raises:
        OutputPathError: ``"{flag} {path}: ..."``: a file where a folder is wanted or the reverse, a path under
            a file, or a folder the user may not write.
    """
    path = Path(path)
    where = f"{flag} {path}"
    if path.exists():
        if folder and not path.is_dir():
            raise OutputPathError(f"{where}: is a file, not a folder")
        if not folder and path.is_dir():
            raise OutputPathError(f"{where}: is a folder, not a file")
        if not os.access(path, os.W_OK | (os.X_OK if folder else 0)):
            raise OutputPathError(f"{where}: cannot be written: permission denied")
        return path
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputPathError(f"{where}: cannot be written: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputPathError(f"{where}: cannot be written: {ancestor} is not writable (permission denied)")
    return path
