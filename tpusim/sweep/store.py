"""The results of a sweep on disk: a journal that survives interruptions, and the tables built from it.

* ``journal.jsonl``: one line per finished point, appended by the one process that runs the sweep with a
  single ``write`` and an ``fsync`` per row, so an interrupted sweep keeps every finished row. A last line cut
  short by a crash is dropped when the journal is opened again. Rows are matched to points by ``id``; the
  last row of an id wins (only ``--retry-failed`` writes a second one).
* ``results.jsonl`` and ``results.csv``: one row per point in spec order, written atomically (a temporary
  file renamed over the old one) whenever the sweep stops, so they never depend on the order points
  finished in, nor on how many workers ran them.
* ``journal.lock``: held (``flock``) while a sweep runs, so two sweeps never write one folder.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tpusim.sweep.spec import SweepError

__all__ = ["Journal", "write_tables"]


class Journal:
    """The append-only record of finished points in a sweep folder (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / "journal.jsonl"
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = open(directory / "journal.lock", "w")  # noqa: SIM115 - held for the journal's life
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise SweepError(f"another sweep is writing {directory} (journal.lock is held)") from None
        self.rows: dict[str, dict[str, Any]] = {}
        self._repair_and_load()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _repair_and_load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        good = 0
        for number, line in enumerate(data.splitlines(keepends=True), 1):
            if not line.endswith(b"\n"):
                break  # cut short by a crash: dropped
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break
            if not isinstance(row, dict) or "id" not in row:
                raise SweepError(f"{self.path}: line {number} is not a sweep row")
            self.rows[row["id"]] = row
            good += len(line)
        if good < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(good)

    def append(self, row: dict[str, Any]) -> None:
        """Record a finished point durably (one write of one line, then fsync)."""
        line = (json.dumps(row, allow_nan=False, separators=(",", ":")) + "\n").encode()
        os.write(self._fd, line)
        os.fsync(self._fd)
        self.rows[row["id"]] = row

    def close(self) -> None:
        os.close(self._fd)
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_tables(directory: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> tuple[Path, Path]:
    """Write ``results.jsonl`` and ``results.csv`` (rows in the given order, columns in the given order)."""
    lines = "".join(json.dumps({c: r.get(c) for c in columns}, allow_nan=False) + "\n" for r in rows)
    _atomic(directory / "results.jsonl", lines)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow(["" if r.get(c) is None else r.get(c) for c in columns])
    _atomic(directory / "results.csv", buf.getvalue())
    return directory / "results.jsonl", directory / "results.csv"
