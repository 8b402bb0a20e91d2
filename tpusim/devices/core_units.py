"""The execution units of one TensorCore, which its sequencers share.

A core's main sequencer and its async sequencer (``tpusim.isa.ASYNC_SEQUENCER``) issue into the same units:
one vector unit (one next-free cycle, one FIFO), the XLUs, the fallback unit, the MXUs and the DMA engines.
:class:`CoreUnits` holds their clocks, FIFOs and state, and the trace ids of their lanes; the sequencer that
issues (:class:`tpusim.devices.core.Core`) holds only what is its own (program counter, registers,
scoreboard, its scalar and sync lanes). Sharing is one object, not copied fields.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from tpusim.devices.dma import DmaEngines
from tpusim.devices.mxu import MxuState

if TYPE_CHECKING:
    from tpusim.devices.chip import Machine

__all__ = ["CoreUnits"]


class CoreUnits:
    """Clocks, FIFOs and state of the units of one TensorCore.

    Args:
        machine: the machine (config, flow network, trace lane ids).
        name: the core's trace prefix, ``chipN.coreK``.

    Attributes:
        queues: per unit kind (``vpu``, ``xlu``, ``fallback``) the start cycles of its last
            ``core.instruction_queue_depth`` instructions (a full FIFO holds back issue).
        vpu_free, xlu_free, fallback_free: next free cycle of the vector unit, of each XLU, of the fallback unit.
        mxus, mxu_queues: each MXU's state and FIFO; ``mxu_ctx`` zips them with the lane ids and depth.
        dma: the DMA engines (transfers within the chip).
        ici_queues: per link, the queue of the pushes to other chips that start on it.
        vpu_unit, fallback_unit, dma_unit, xlu_units, mxu_units: trace lane ids.
    """

    __slots__ = (
        "_cfg",
        "_network",
        "dma",
        "dma_unit",
        "fallback_free",
        "fallback_unit",
        "ici_queues",
        "mxu_ctx",
        "mxu_queues",
        "mxu_units",
        "mxus",
        "queues",
        "vpu_free",
        "vpu_queue",
        "vpu_unit",
        "xlu_free",
        "xlu_units",
    )

    def __init__(self, machine: Machine, name: str) -> None:
        cfg = machine.cfg
        depth = cfg.core.instruction_queue_depth
        self.queues: dict[str, deque[int]] = {k: deque(maxlen=depth) for k in ("vpu", "xlu", "fallback")}
        self.vpu_queue = self.queues["vpu"]
        self.vpu_free = 0
        self.xlu_free = [0] * cfg.xlu.count
        self.fallback_free = 0
        self.mxus = [MxuState(cfg) for _ in range(cfg.mxu.count)]
        self.mxu_queues: list[deque[int]] = [deque(maxlen=depth) for _ in range(cfg.mxu.count)]
        # lane ids in the order the trace has always listed them: dma, vpu, fallback, then XLUs and MXUs
        self.dma_unit = machine.unit_id(f"{name}.dma")
        self.vpu_unit = machine.unit_id(f"{name}.vpu")
        self.fallback_unit = machine.unit_id(f"{name}.fallback")
        self.xlu_units = [machine.unit_id(f"{name}.xlu{i}") for i in range(cfg.xlu.count)]
        self.mxu_units = [machine.unit_id(f"{name}.mxu{i}") for i in range(cfg.mxu.count)]
        # per MXU: its state, its FIFO of start cycles, its trace lane and the FIFO's depth (issue_mxu_fast)
        self.mxu_ctx = [(m, q, u, depth) for m, q, u in zip(self.mxus, self.mxu_queues, self.mxu_units)]
        self.dma = DmaEngines(cfg, machine.network)
        self._cfg = cfg
        self.ici_queues: dict[Any, DmaEngines] = {}
        self._network = machine.network

    def ici_queue(self, port: Any) -> DmaEngines:
        """The ICI queue of the link ``port``: the pushes that start on it, ``ici.pushes_per_link`` in their data
        phase at once, the others waiting in issue order (created when first used)."""
        queue = self.ici_queues.get(port)
        if queue is None:
            queue = self.ici_queues[port] = DmaEngines(self._cfg, self._network, self._cfg.ici.pushes_per_link)
        return queue
