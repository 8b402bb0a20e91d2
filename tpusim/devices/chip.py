"""A chip's state (HBM, per-core VMEM, SMEM and semaphores) and the per-run world that holds the chips.

A chip has ``core.count`` TensorCores sharing its HBM, and ICI ports to its neighbours (links are flow
resources of the system's :class:`~tpusim.devices.flows.FlowNetwork`). Memories exist for every core of
every chip, whether or not a stream runs there (a remote DMA may target any of them).
"""

from __future__ import annotations

from typing import Any

from tpusim.config import ChipConfig
from tpusim.devices.core import Core
from tpusim.devices.engine import make_env
from tpusim.devices.fallback import FallbackEvaluator
from tpusim.devices.flows import Flow, FlowNetwork, Resource, resource
from tpusim.devices.stores import ByteStore
from tpusim.devices.sync import BarrierState, Semaphores
from tpusim.isa import Program, Space
from tpusim.topology import Topology

__all__ = ["ChipState", "Machine"]


class ChipState:
    """The memories and semaphores of one chip, and the cores running on it."""

    def __init__(self, machine: Machine, index: int) -> None:
        cfg = machine.cfg
        self.machine = machine
        self.index = index
        self.hbm = ByteStore(f"hbm of chip {index}", cfg.hbm.bytes)
        n = cfg.core.count
        self.vmem = [ByteStore(f"vmem of chip {index} core {k}", cfg.vmem.bytes) for k in range(n)]
        self.smem = [ByteStore(f"smem of chip {index} core {k}", cfg.smem.bytes) for k in range(n)]
        self.sems = [Semaphores(machine.env, cfg.core.semaphores) for _ in range(n)]
        self.cores: list[Core] = []

    def store(self, space: Space, core: int) -> ByteStore:
        if space is Space.HBM:
            return self.hbm
        return self.vmem[core] if space is Space.VMEM else self.smem[core]


_Route = tuple[list[tuple[Resource, float]], int, float, tuple[int, ...]]
"""The links of a route as ``(resource, weight)`` pairs, its latency, their least capacity and their ids."""


class Machine:
    """Everything one run needs: the environment, the flow network, the chips, the trace records."""

    def __init__(
        self,
        cfg: ChipConfig,
        topology: Topology,
        program: Program,
        numeric: bool,
        max_steps: int,
        max_cycles: int,
        fallback_evaluator: FallbackEvaluator | None,
    ) -> None:
        self.cfg = cfg
        self.topology = topology
        self.program = program
        self.numeric = numeric
        self.max_steps = max_steps  # run limits (tpusim.limits), checked at taken jumps and at the end
        self.max_cycles = max_cycles
        self.max_record_ints = max_steps * 8  # max_steps as a length of ``records``
        self.fallback_evaluator = fallback_evaluator
        self.env = make_env()
        self.network = FlowNetwork(self.env)
        self.records: list[int] = []  # trace records, 8 ints each (see trace.Record), flat
        self.units: list[str] = []
        self._unit_ids: dict[str, int] = {}
        self.barriers: dict[Any, BarrierState] = {}
        self.expected: dict[Any, int] = {}
        self.chips = [ChipState(self, c) for c in range(topology.chips)]
        self.cores: list[Core] = []
        self._resources: dict[tuple[str, int, int, float], Resource] = {}
        self._routes: dict[tuple[int, int, tuple[int, ...] | None, int], _Route] = {}

    def resource(self, kind: str, chip: int, core: int, capacity: float) -> Resource:
        """A transfer side's flow resource: ``hbm`` of ``chip``, or the ``local`` DMA port of its ``core``."""
        key = (kind, chip, core, capacity)
        r = self._resources.get(key)
        if r is None:
            if kind == "hbm":
                r = resource(("hbm", chip), f"chip{chip}.hbm", capacity)
            else:
                r = resource(("local", chip, core), f"chip{chip}.core{core}.dma_port", capacity)
            self._resources[key] = r
        return r

    def route_uses(self, src: int, dst: int, order: tuple[int, ...] | None, tie: int, index: int, core: Core) -> _Route:
        """The flow resources of the route from chip ``src`` to ``dst`` (axes corrected in ``order``, None: the
        topology's; round a ring the ``tie`` way where both are as short), each with weight 1: an ICI link of
        ``ici.link_bandwidth_bytes_per_s`` per hop, a chip's DCN egress or ingress of
        ``dcn.bandwidth_bytes_per_s`` between slices; its latency in cycles; the least capacity of its links
        and their ids (a flow's part of :meth:`Flow.shape_of`).

        Raises:
            ExecutionError: ``order`` (of instruction ``index`` of ``core``) is not an order of the axes.
        """
        known = self._routes.get((src, dst, order, tie))
        if known is None:
            topo, cfg = self.topology, self.cfg
            try:
                hops = topo.route(src, dst, order, tie)
            except ValueError as e:
                raise core.error(index, f"{e} of the system's topology {topo}") from None
            links = []
            for link in hops:
                capacity = cfg.dcn_bytes_per_cycle if topo.is_dcn(link) else cfg.link_bytes_per_cycle
                links.append((resource(("link", *link), topo.link_name(link), capacity), 1.0))
            network = cfg.network_cycles(*topo.crossings(src, dst))
            known = self._routes[(src, dst, order, tie)] = (links, network, *Flow.shape_of(links, float("inf")))
        return known

    def unit_id(self, name: str) -> int:
        i = self._unit_ids.get(name)
        if i is None:
            i = self._unit_ids[name] = len(self.units)
            self.units.append(name)
        return i

    def start(self) -> None:
        """Create a core per stream (decoding and checking every instruction), then their processes."""
        program = self.program
        for stream in program.streams:
            if stream.core >= self.cfg.core.count:
                raise _load_error(f"{stream.where}: the chip has only {self.cfg.core.count} cores")
            if stream.chip is not None and stream.chip >= len(self.chips):
                raise _load_error(f"{stream.where}: the system has only {len(self.chips)} chips")
        for chip in self.chips:
            mains: dict[int, Core] = {}
            # main sequencers first: an async sequencer shares its core's DMA engines and vector unit
            for stream in sorted(program.streams, key=lambda s: s.sequencer):
                if stream.chip is None or stream.chip == chip.index:
                    main = mains.get(stream.core)
                    if stream.sequencer and main is None:
                        raise _load_error(f"{stream.where}: core {stream.core} of chip {chip.index} has no main stream")
                    core = Core(chip, stream.core, stream, len(self.cores), main if stream.sequencer else None)
                    if not stream.sequencer:
                        mains[stream.core] = core
                    chip.cores.append(core)
                    self.cores.append(core)
        # barriers are for main sequencers (an async sequencer issues none)
        for chip in self.chips:
            self.expected[("chip", chip.index)] = sum(1 for c in chip.cores if not c.stream.sequencer)
        self.expected[("system", None)] = sum(1 for c in self.cores if not c.stream.sequencer)
        for core in self.cores:
            self.env.process(core.run())

    def barrier(self, key: tuple[str, int, int | None]) -> BarrierState:
        state = self.barriers.get(key)
        if state is None:
            scope, _, chip = key
            state = self.barriers[key] = BarrierState(self.env, self.expected[(scope, chip)])
        return state

    def drop_scratch(self) -> None:
        """Forget what only the run itself needed: decoded operand values kept with the memories and the
        MXUs' numeric state (result buffers, latched weights). The memories stay, for ``RunResult.memory``.

        NOTE: memory. A matmul's scratch is larger than its operands (49 MiB for a 2048^3 bf16 matmul whose
        memories hold 42 MiB); a result held after the run (a sweep's, a notebook's) would otherwise keep it,
        and the next run could not reuse the freed pages."""
        for chip in self.chips:
            for store in (chip.hbm, *chip.vmem, *chip.smem):
                store.values = None
        for core in self.cores:
            for mxu in core.units.mxus:
                mxu.drop_numerics()

    def release_barrier(self, key: Any, state: BarrierState) -> None:
        """All cores arrived: wake them at the last arrival's cycle and open the next round."""
        del self.barriers[key]
        ev, latest = state.event, state.latest
        delay = latest - self.env.now
        if delay <= 0:
            ev.succeed(latest)
        else:
            self.env.timeout(delay).callbacks.append(lambda _e: ev.succeed(latest))


def _load_error(message: str) -> Exception:
    from tpusim.devices.units import ExecutionError

    return ExecutionError(message)
