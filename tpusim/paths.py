"""Output paths checked before the work that fills them: a run must not simulate for an hour and then find
that ``--out`` or ``--report`` names a file, sits under a file or cannot be written."""

from __future__ import annotations

import os
from pathlib import Path

from tpusim.errors import TpusimError

__all__ = ["OutputPathError", "check_output_path"]


class OutputPathError(TpusimError):
    """An output file or folder that cannot be written where the user asked."""


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
