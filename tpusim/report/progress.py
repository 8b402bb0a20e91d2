"""A one-line progress display for long jobs: a bar, counts, rate and ETA on a terminal, nothing otherwise.

No dependency: a carriage return redraws the line at most ``hz`` times a second; when the stream is not a
terminal (a log file, a pipe, CI) nothing is written unless asked for.

    >>> import io
    >>> p = Progress(3, "points", stream=io.StringIO())   # not a terminal: quiet
    >>> p.advance(); p.advance(failed=True); p.close()
    >>> p.enabled, p.done, p.failed
    (False, 2, 1)
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from tpusim.devices import RunMonitor

__all__ = ["Activity", "Progress", "format_duration", "run_status"]


def format_duration(seconds: float) -> str:
    """``75.3`` -> ``1:15``; ``3700`` -> ``1:01:40``."""
    s = max(round(seconds), 0)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def run_status(monitor: RunMonitor) -> str:
    """The state of a simulation for :class:`Activity`: simulated cycles, instructions and their rate, and
    an ETA when the run's instruction count is known (no loops); ``compiling`` before it starts."""
    if not monitor.running:
        return "compiling"
    done, sec = monitor.instructions, monitor.seconds
    text = f"{monitor.cycles:,} cycles simulated, {done:,} instructions"
    if monitor.total:
        text += f" of {monitor.total:,}"
    if sec > 0 and done:
        rate = done / sec
        text += f" ({rate:,.0f}/s)"
        if monitor.total and done < monitor.total:
            text += f", ETA {format_duration((monitor.total - done) / rate)}"
    return text


class Progress:
    """Progress of ``total`` items (``None``: unknown, no bar and no ETA).

    Args:
        total: items to do.
        label: what the items are (``points``, ``instructions``).
        stream: where to draw (default stderr).
        enabled: force on or off; default: on when ``stream`` is a terminal.
        hz: most redraws per second.
    """

    def __init__(
        self,
        total: int | None,
        label: str,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        hz: float = 10.0,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = enabled if enabled is not None else bool(isatty and isatty())
        self.total = total
        self.label = label
        self.done = 0
        self.failed = 0
        self.note = ""
        self.began = time.monotonic()
        self._interval = 1.0 / hz
        self._last = 0.0
        self._width = 0

    def advance(self, n: int = 1, *, failed: bool = False, note: str | None = None) -> None:
        """``n`` more items are done (``failed``: they failed)."""
        self.done += n
        self.failed += n if failed else 0
        if note is not None:
            self.note = note
        self.draw()

    def set(self, done: int, note: str | None = None) -> None:
        """Set the count of items done (for jobs that report a running total)."""
        self.done = done
        if note is not None:
            self.note = note
        self.draw()

    def line(self) -> str:
        """The text of the progress line."""
        elapsed = time.monotonic() - self.began
        parts = []
        if self.total:
            frac = min(self.done / self.total, 1.0)
            filled = round(24 * frac)
            parts.append(f"[{'#' * filled}{'.' * (24 - filled)}] {self.done:,}/{self.total:,} {self.label} {frac:4.0%}")
        else:
            parts.append(f"{self.done:,} {self.label}")
        parts.append(f"elapsed {format_duration(elapsed)}")
        if self.done and elapsed > 0:
            parts.append(f"{self.done / elapsed:,.1f} {self.label}/s")
        if self.total and 0 < self.done < self.total:
            parts.append(f"ETA {format_duration(elapsed / self.done * (self.total - self.done))}")
        if self.failed:
            parts.append(f"{self.failed} failed")
        if self.note:
            parts.append(self.note)
        return "  ".join(parts)

    def draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self._interval:
            return
        self._last = now
        text = self.line()
        pad = max(self._width - len(text), 0)
        self._width = len(text)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()

    def close(self) -> None:
        """Draw the final state and end the line."""
        if self.enabled:
            self.draw(force=True)
            self.stream.write("\n")
            self.stream.flush()


class Activity:
    """A context manager that shows, on a terminal, that a long step is running and for how long.

    ``probe`` (optional) returns a short status (such as simulated cycles) to show beside the time.

        >>> with Activity("simulating", enabled=False):
        ...     pass
    """

    def __init__(
        self,
        label: str,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        probe: Callable[[], str] | None = None,
        interval: float = 0.5,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = enabled if enabled is not None else bool(isatty and isatty())
        self.label = label
        self.probe = probe
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._width = 0
        self.began = 0.0

    def _draw(self) -> None:
        extra = f"  {self.probe()}" if self.probe is not None else ""
        text = f"{self.label}... {format_duration(time.monotonic() - self.began)}{extra}"
        self.stream.write("\r" + text + " " * max(self._width - len(text), 0))
        self.stream.flush()
        self._width = len(text)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._draw()

    def __enter__(self) -> Activity:
        self.began = time.monotonic()
        if self.enabled:
            self._thread = threading.Thread(target=self._loop, name="tpusim-activity", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
