"""The results of a sweep on disk: a journal that survives interruptions, and the tables built from it.

* ``journal.jsonl``: one line per finished point, appended by the one process that runs the sweep with a
  single ``write`` and an ``fsync`` per row, so an interrupted sweep keeps every finished row. The journal is
  only ever appended to: a line that is not a row (cut short by a crash, or damaged) is skipped with a
  :class:`SweepWarning` naming the file and line, and every row before and after it is kept. A last line
  without its newline is ended with one before the next row is appended, so rows never run together. Rows
  are matched to points by ``id``; the last row of an id wins (only ``--retry-failed`` writes a second one).
* ``results.jsonl`` and ``results.csv``: one row per point in spec order, written atomically (a temporary
  file renamed over the old one) whenever the sweep stops, so they never depend on the order points
  finished in, nor on how many workers ran them.
* ``journal.lock``: held (``flock``) while a sweep runs, so two sweeps never write one folder; it holds the
  owner's pid and host, which a second sweep names when it refuses. The kernel releases the lock when its
  process dies, so a lock left by a killed sweep is taken over (with a warning naming the dead process); on
  a filesystem without ``flock`` the pid decides: a lock of a live process on this host refuses, others are
  taken over.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import io
import json
import os
import socket
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tpusim.sweep.spec import COST_COLUMNS, METRIC_COLUMNS, SweepError

__all__ = ["Journal", "SweepWarning", "write_tables"]

_ROW_KEYS = {"index": int, "id": str, "program": str, "status": str}
"""What every row of a journal has (tpusim.sweep.point.run_point writes them); a line without them is skipped."""

_MAX_WARNINGS = 10


class SweepWarning(UserWarning):
    """Something a sweep worked around and kept going: a damaged journal line skipped, a stale lock taken over."""


def _parse_row(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """``line`` (without its newline) as a journal row, or None and why it is not one."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):  # JSONDecodeError, bad UTF-8, an integer over 4,300 digits
        return None, "not valid JSON" if line.strip() else "empty"
    if not isinstance(row, dict):
        return None, "not a JSON object"
    for key, tp in _ROW_KEYS.items():
        if not isinstance(row.get(key), tp) or isinstance(row.get(key), bool):
            return None, f"no {key!r}" if key not in row else f"{key!r} is not {tp.__name__}"
    if row["status"] not in ("ok", "error"):
        return None, f"status {str(row['status'])[:20]!r} is neither 'ok' nor 'error'"
    for key in (*METRIC_COLUMNS, *COST_COLUMNS):  # a measured column holds a number, or nothing
        value = row.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            return None, f"{key!r} is not a number"
    return row, ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0  # exists (someone else's), or not a pid at all
    return True


class Journal:
    """The append-only record of finished points in a sweep folder (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / "journal.jsonl"
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise SweepError(f"{directory}: the sweep's output folder is a file, or sits under one") from None
        self._lock_path = directory / "journal.lock"
        self._lock_fd = self._take_lock()
        try:
            self.rows: dict[str, dict[str, Any]] = {}
            self._load()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            if self._unterminated:
                os.write(self._fd, b"\n")  # the next row starts on a line of its own
        except BaseException:
            self._release_lock()
            raise

    # -- the lock
    def _take_lock(self) -> int:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
            except BlockingIOError:
                raise SweepError(
                    f"{self.directory}: another sweep ({self._owner_text(fd)}) is writing this folder "
                    f"({self._lock_path.name} is held); wait for it to finish, or give another --out"
                ) from None
            except OSError as e:  # no flock on this filesystem (some network ones): the pid decides
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
                locked = False
            owner = self._owner(fd)
            if owner is not None and owner.get("pid") != os.getpid():
                pid, host = owner.get("pid"), owner.get("host")
                alive = host == socket.gethostname() and isinstance(pid, int) and _pid_alive(pid)
                if not locked and (alive or host != socket.gethostname()):
                    raise SweepError(
                        f"{self.directory}: another sweep ({self._owner_text(fd)}) may be writing this folder "
                        f"({self._lock_path.name}; this filesystem has no flock); if it is gone, delete "
                        f"{self._lock_path} and run again"
                    )
                warnings.warn(
                    f"{self._lock_path}: taking over the lock of {self._owner_text(fd)}, which ended without "
                    "releasing it (killed?); its finished rows are kept",
                    SweepWarning,
                    stacklevel=3,
                )
            me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _owner(fd: int) -> dict[str, Any] | None:
        data = os.pread(fd, 4096, 0)
        if not data.strip():
            return None
        try:
            owner = json.loads(data)
        except ValueError:
            return {"pid": None, "host": None}
        return owner if isinstance(owner, dict) else {"pid": None, "host": None}

    def _owner_text(self, fd: int) -> str:
        owner = self._owner(fd) or {}
        pid, host, since = owner.get("pid"), owner.get("host"), owner.get("since")
        if not isinstance(pid, int):
            return "an unknown process"
        text = f"pid {pid}" + (f" on {str(host)[:60]}" if host and host != socket.gethostname() else "")
        return text + (f", since {str(since)[:25]}" if since else "")

    def _release_lock(self) -> None:
        try:
            os.ftruncate(self._lock_fd, 0)  # a clean exit leaves no owner to take over
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)

    # -- the rows
    def _load(self) -> None:
        self._unterminated = False
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        bad: list[tuple[int, str]] = []
        for number, line in enumerate(data.splitlines(keepends=True), 1):
            row, problem = _parse_row(line.rstrip(b"\r\n"))
            if row is not None:
                self.rows[row["id"]] = row
            elif not (problem == "empty" and line.endswith(b"\n")):
                cut = "" if line.endswith(b"\n") else ", cut short (a sweep stopped while writing it?)"
                bad.append((number, problem + cut))
        self._unterminated = bool(data) and not data.endswith(b"\n")
        for number, problem in bad[:_MAX_WARNINGS]:
            warnings.warn(f"{self.path}:{number}: skipped a line that is not a sweep row ({problem}); the rows "
                          "around it are kept", SweepWarning, stacklevel=3)  # fmt: skip
        if len(bad) > _MAX_WARNINGS:
            rest = ", ".join(str(n) for n, _ in bad[_MAX_WARNINGS : _MAX_WARNINGS + 20])
            warnings.warn(f"{self.path}: skipped {len(bad) - _MAX_WARNINGS} more lines that are not sweep rows "
                          f"(lines {rest}{', ...' if len(bad) > _MAX_WARNINGS + 20 else ''})", SweepWarning,
                          stacklevel=3)  # fmt: skip

    def append(self, row: dict[str, Any]) -> None:
        """Record a finished point durably (one write of one line, then fsync)."""
        line = (json.dumps(row, allow_nan=False, separators=(",", ":")) + "\n").encode()
        try:
            written = os.write(self._fd, line)
            while written < len(line):  # a short write (a full disk): finish the line or fail
                written += os.write(self._fd, line[written:])
            os.fsync(self._fd)
        except OSError as e:
            raise SweepError(f"{self.path}: cannot record a finished point: {e.strerror}") from None
        self.rows[row["id"]] = row

    def reload(self) -> None:
        """The rows as the file holds them now: after Ctrl-C or SIGTERM, which may have stopped :meth:`append`
        between its write and its note in memory (a signal's handler runs between any two bytecodes)."""
        self.rows = {}
        self._load()

    def close(self) -> None:
        os.close(self._fd)
        self._release_lock()


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
