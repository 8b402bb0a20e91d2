"""Lockstep rendezvous of the devices of a multi-device reference run, with exact deadlock detection.

Every device runs the same program in its own thread. A collective instruction calls
:meth:`Exchange.meet` with the device's contribution; the call returns once every device has arrived
at the *same* instruction, with all N contributions in device order (each device then computes its own
group's result from them, deterministically). A device is always in one of three states: running,
waiting at a collective, or gone (finished or failed). When no device is running the state is decided:

* all waiting at one instruction: the exchange happens;
* waiting at different instructions, or some waiting while others finished: a :class:`CollectiveError`
  naming the instructions and the devices at each (XLA would hang here);
* a device failed: the others stop with :class:`DeviceAborted` and the failure is reported.

So no run can hang at a collective; an optional timeout also bounds each wait.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from tpusim.compiler.hlo.ir import Instruction
from tpusim.compiler.hlo.reference.core import EvaluationError, Value, format_instr
from tpusim.errors import TpusimError

__all__ = ["CollectiveError", "DeviceAborted", "Exchange", "run_devices"]

T = TypeVar("T")


class CollectiveError(EvaluationError):
    """Devices that cannot meet at a collective (deadlock, divergence, timeout) or a malformed group."""


class DeviceAborted(TpusimError):
    """Raised in a device thread waiting at a collective when another device failed; :func:`run_devices`
    reports the other device's error instead."""


class Exchange:
    """The rendezvous point of ``num_devices`` device threads.

    Args:
        num_devices: devices taking part in every collective.
        timeout: seconds one wait may last before the run fails, or None for no limit.
    """

    def __init__(self, num_devices: int, timeout: float | None = None) -> None:
        self.num_devices = num_devices
        self.timeout = timeout
        self._cond = threading.Condition()
        self._waiting: dict[int, tuple[Instruction, Value]] = {}
        self._gone: dict[int, str] = {}  # device -> "finished" | "failed"
        self._generation = 0
        self._results: list[Value] = []
        self._error: CollectiveError | None = None
        self._failed = False

    def meet(self, device: int, instr: Instruction, value: Value) -> list[Any]:
        """Contribute ``value`` at collective ``instr``; returns every device's contribution, by device id."""
        if self.num_devices == 1:
            return [value]
        with self._cond:
            self._raise_if_broken(instr)
            self._waiting[device] = (instr, value)
            generation = self._generation
            self._decide()
            while self._generation == generation:
                self._raise_if_broken(instr)
                if not self._cond.wait(self.timeout):
                    self._error = CollectiveError(
                        instr,
                        f"timed out after {self.timeout} s: device {device} waits here; {self._state_text()}",
                    )
                    self._cond.notify_all()
            return self._results

    def finish(self, device: int) -> None:
        """Device ``device`` ran to the end of its program."""
        with self._cond:
            self._gone[device] = "finished"
            self._decide()

    def fail(self, device: int) -> None:
        """Device ``device`` stopped with an error: release everybody."""
        with self._cond:
            self._gone[device] = "failed"
            self._failed = True
            self._cond.notify_all()

    # ------------------------------------------------------------------ internals (lock held)
    def _raise_if_broken(self, instr: Instruction) -> None:
        if self._error is not None:
            raise CollectiveError(self._error.instr, self._error.message)
        if self._failed:
            raise DeviceAborted(f"{format_instr(instr)}: another device failed")

    def _decide(self) -> None:
        if len(self._waiting) + len(self._gone) < self.num_devices or not self._waiting:
            return
        names = {ins.name for ins, _ in self._waiting.values()}
        first = min(self._waiting)
        instr = self._waiting[first][0]
        if "failed" in self._gone.values():
            return  # waiters see _failed
        if len(names) > 1 or self._gone:
            self._error = CollectiveError(
                instr, f"deadlock: the devices cannot all reach the same collective; {self._state_text()}"
            )
        else:
            self._results = [self._waiting[d][1] for d in range(self.num_devices)]
            self._waiting.clear()
            self._generation += 1
        self._cond.notify_all()

    def _state_text(self) -> str:
        at: dict[str, list[int]] = {}
        for d, (ins, _) in sorted(self._waiting.items()):
            at.setdefault(f"%{ins.name}", []).append(d)
        parts = [f"devices {devs} wait at {name}" for name, devs in at.items()]
        done = sorted(d for d, s in self._gone.items() if s == "finished")
        if done:
            parts.append(f"devices {done} finished the program")
        running = sorted(set(range(self.num_devices)) - set(self._waiting) - set(self._gone))
        if running:
            parts.append(f"devices {running} are still running")
        return "; ".join(parts)


def run_devices(exchange: Exchange, body: Callable[[int], T]) -> list[T]:
    """Run ``body(d)`` for every device in its own thread; return the results by device.

    Raises the error of the lowest-numbered device that failed for a reason of its own (devices that only
    stopped because another failed are not reported).
    """
    n = exchange.num_devices
    results: list[Any] = [None] * n
    errors: list[BaseException | None] = [None] * n

    def thread_main(d: int) -> None:
        try:
            results[d] = body(d)
        except BaseException as exc:  # recorded and re-raised in the caller's thread below
            errors[d] = exc
            exchange.fail(d)
        else:
            exchange.finish(d)

    if n == 1:
        thread_main(0)
    else:
        threads = [threading.Thread(target=thread_main, args=(d,), name=f"tpusim-device-{d}") for d in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    real = [e for e in errors if e is not None and not isinstance(e, DeviceAborted)]
    if real:
        raise real[0]
    if any(e is not None for e in errors):
        raise next(e for e in errors if e is not None)
    return results
