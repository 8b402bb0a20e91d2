"""Chip configurations: YAML files loaded with a safe loader into frozen, validated dataclasses.

Every key carries its unit in its name (``clock_hz``, ``bandwidth_bytes_per_s``, ``latency_ns``,
``weight_load_cycles``). ``configs/README.md`` documents every key; this module is the schema. Errors name
the file, the line and the key (or the ``--set`` override that caused them):

    >>> cfg = load_config("teaching")
    >>> cfg.mxu.rows, cfg.peak_bf16_flops_per_s
    (8, 128000000000.0)
    >>> load_config("teaching", overrides=["mxu.rows=16"]).mxu.rows
    16

A shipped config states published figures (``published``); loading it recomputes peak FLOP/s from the
clock and the MXU counts, and HBM bandwidth, and rejects the file when they disagree by more than the
stated tolerance. Overridden configs describe hypothetical chips and skip that check.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
from dataclasses import dataclass, field
from math import ceil
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from tpusim.errors import ConfigError
from tpusim.paths import regular_file_problem
from tpusim.yamlio import SafeLoader, YamlError, compose_yaml, scalar_value, shorten, show_value

__all__ = [
    "PRESETS",
    "ChipConfig",
    "ConfigValueError",
    "CoreConfig",
    "DcnConfig",
    "DmaConfig",
    "HbmConfig",
    "IciConfig",
    "MxuConfig",
    "PublishedFigures",
    "SmemConfig",
    "VmemConfig",
    "VpuConfig",
    "VpuOpClass",
    "XluConfig",
    "add_config_arguments",
    "check_overrides",
    "config_dir",
    "config_from_args",
    "load_config",
    "override_values",
    "parse_override",
    "with_overrides",
]


def config_dir(package: Path) -> Path:
    """The copy of ``configs/`` an installed wheel carries inside the package folder ``package`` (pyproject.toml
    maps the package ``tpusim.configs`` to ``configs/``), else ``configs/`` beside it, as in a source checkout."""
    installed = package / "configs"
    return installed if (installed / "tpu_v5e.yaml").is_file() else package.parent / "configs"


CONFIG_DIR = config_dir(Path(__file__).resolve().parent)
"""The shipped chip configs, tiling rule sets (``tiling/``) and sweep specs (``sweeps/``)."""

PRESETS: dict[str, Path] = {
    name: CONFIG_DIR / f"{name}.yaml" for name in ("tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e", "teaching")
}
"""Named chip configs shipped with tpusim: name -> YAML file."""


class ConfigValueError(ConfigError):
    """An impossible value; ``key`` names the field (dotted, relative to the object that rejected it)."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.reason = message
        super().__init__(f"{key}: {message}")


def _need(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigValueError(key, message)


# ---------------------------------------------------------------------------------------------------------
# Limits: one rule per kind of key, the kind read from the unit in the key's name (configs/README.md, Limits)
# ---------------------------------------------------------------------------------------------------------
# Simulated time is a float64 count of cycles. Integers are exact in a float64 only below 2^53 (9.0e15);
# past it t + 1 == t, so a run whose events land there stops advancing and spins (dma.setup_cycles=1e15
# did). Each bound below keeps one key within about 2^20 (a million) of what real chips have, slower or
# larger; a run of 2^22 cycles on a real chip's config (the longest shipped run, a blocked 1024 matmul,
# takes under 3 million) then stays below 2^42 cycles with any one key at its bound, far below 2^53 and
# the run limit's default of 2^48 (tpusim/limits.py), and a run of a billion cycles (hours of simulation)
# stays below 2^50.
MAX_COUNT = 2**16
"""Largest count of a thing (units, registers, rows, lanes, queue slots, chips per axis): 65,536, 64 x the
largest real one (1,024 result buffer rows); the simulator holds some of them in lists and arrays."""
MAX_CORES = 64
"""TensorCores per chip (``core.count``): room for what-if studies well beyond the two of v4 and v5p."""

MAX_BYTES = 2**48
"""Largest memory (``bytes`` keys): 256 TiB, 2,700 x the largest real one (v5p's 95 GiB HBM); byte addresses,
offsets and strides then stay far from int64's and float64's exact limits."""

MAX_GRANULE_BYTES = 2**16
"""Largest granule (``_bytes`` keys: ``dma.burst_bytes``, ``hbm.interleave_bytes``): 64 KiB, 256 x the largest
real one. A granule is work per unit: every contiguous run of a transfer is charged whole bursts, so
``dma.burst_bytes`` 2^48 made the transformer block example take 1.2e15 cycles (63,587 on a v5e)."""

MAX_LATENCY_CYCLES = 2**20
"""Longest fixed cost of one event (``_cycles`` keys; ``_ns`` keys at the clock): 1,048,576 cycles (0.7 ms at
1.5 GHz), 2^20 x the 1-cycle latencies and 500 x the 2,000-cycle ICI hop of real chips."""

MAX_CYCLES_PER_UNIT = 2**10
"""Slowest rate: one unit of work (a register, a run, a row, a byte) per 1,024 cycles; ``_per_cycle`` keys
and ``_bytes_per_s`` keys at the clock are at least 1/1,024 per cycle, and ``_cycles_per_vreg`` keys at most
1,024. The slowest real rates are 1 per cycle (DMA runs, VMEM ports); HBM moves 546 bytes per cycle on a
v5e, so its floor is 2^19 x slower."""

MAX_PER_CYCLE = 2**30
"""Fastest rate: 2^30 units per cycle (a million x the fastest real one), so rates stay exact floats."""

CLOCK_RANGE_HZ = (1e6, 1e12)
"""``clock_hz`` from 1 MHz to 1 THz (real TPUs run at 0.9-1.75 GHz); the clock converts ``_ns`` and ``_per_s``
keys to cycles, which have their own limits."""

MAX_RESULT_BUFFER_WORDS = 2**26
"""Largest MXU result buffer (``mxu.result_buffer_rows x mxu.cols`` 32-bit words, 256 MiB; a v6e's holds
2^18): the simulator holds every MXU's buffer in memory."""


def _kind(name: str) -> str:
    """The kind of a numeric key, from the unit in its name."""
    if name.endswith("_hz"):
        return "frequency"
    if name == "tolerance":
        return "fraction"
    if name.endswith("_per_s"):
        return "per_second"
    if name.endswith("_cycles_per_vreg"):
        return "cycles_per_unit"
    if name.endswith("_per_cycle"):
        return "rate"
    if name.endswith("_cycles"):
        return "latency"
    if name.endswith("_ns"):
        return "time"
    if name == "bytes":
        return "size"
    if name.endswith("_bytes"):
        return "granule"
    return "count"


def _check_number(key: str, kind: str, v: float) -> None:
    shown = show_value(v)
    if isinstance(v, float) and not math.isfinite(v):
        raise ConfigValueError(key, f"must be a finite number, not {shown}")
    if kind in ("count", "size", "granule", "cycles_per_unit", "rate", "per_second", "frequency"):
        _need(v > 0, key, f"must be positive, not {shown}")
    else:
        _need(v >= 0, key, f"must not be negative, not {shown}")
    limit = "see Limits in configs/README.md"
    if kind == "count":
        _need(v <= MAX_COUNT, key, f"must be at most {MAX_COUNT:,} (2^16; {limit}), not {shown}")
    elif kind == "size":
        _need(v <= MAX_BYTES, key, f"must be at most 2^48 = {MAX_BYTES:,} bytes ({limit}), not {shown}")
    elif kind == "granule":
        _need(v <= MAX_GRANULE_BYTES, key, f"must be at most 2^16 = {MAX_GRANULE_BYTES:,} bytes ({limit}), not {shown}")
    elif kind == "latency":
        _need(v <= MAX_LATENCY_CYCLES, key, f"must be at most 2^20 = {MAX_LATENCY_CYCLES:,} cycles ({limit}), "
              f"not {shown}")  # fmt: skip
    elif kind == "cycles_per_unit":
        _need(v <= MAX_CYCLES_PER_UNIT, key, f"must be at most {MAX_CYCLES_PER_UNIT:,} cycles ({limit}), not {shown}")
    elif kind == "rate":
        _need(v * MAX_CYCLES_PER_UNIT >= 1, key, f"must be at least 1/{MAX_CYCLES_PER_UNIT:,} per cycle ({limit}), "
              f"not {shown}")  # fmt: skip
        _need(v <= MAX_PER_CYCLE, key, f"must be at most 2^30 per cycle ({limit}), not {shown}")
    elif kind == "frequency":
        lo, hi = CLOCK_RANGE_HZ
        _need(lo <= v <= hi, key, f"must be from {lo:g} to {hi:g} Hz ({limit}), not {shown}")
    elif kind == "fraction":
        _need(v <= 1, key, f"must be a fraction from 0 to 1, not {shown}")


def _check_fields(obj: Any) -> None:
    """Apply the limit of its kind to every number of ``obj`` (a config section); lists are checked per entry."""
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if f.name == "routing":  # axis numbers, checked as a permutation
            continue
        values = v if isinstance(v, tuple) else (v,)
        for x in values:
            if isinstance(x, (int, float)) and not isinstance(x, bool):
                _check_number(f.name, _kind(f.name), x)


# ---------------------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class CoreConfig:
    """The TensorCores of a chip and their scalar unit / sequencer."""

    count: int = 1  # TensorCores per chip
    instruction_queue_depth: int = 8  # instructions waiting per unit FIFO before issue stalls
    scalar_registers: int = 32  # 32-bit scalar registers s0..
    semaphores: int = 32  # semaphores per core
    branch_cycles: int = 1  # extra sequencer cycles for a taken branch or jump

    def __post_init__(self) -> None:
        _check_fields(self)
        # (TPUs have one or two; megacore compares every pair of cores' accesses at each instruction, so a
        # few thousand cores took minutes on a 5 us program)
        _need(self.count <= MAX_CORES, "count", f"must be at most {MAX_CORES} TensorCores per chip, not {self.count}")


@dataclass(frozen=True, kw_only=True, slots=True)
class MxuConfig:
    """The matrix units of one TensorCore (weight-stationary systolic arrays)."""

    count: int = 1  # MXUs per core
    rows: int = 128  # R: weight rows = contraction depth per pass
    cols: int = 128  # C: weight columns = output width per pass
    weight_load_cycles: int | None = None  # cycles to latch one weight tile; None means `rows`
    double_buffered: bool = True  # a staging buffer lets the next tile load while the current one streams
    result_buffer_rows: int = 1024  # rows (each `cols` 32-bit values) of the result buffer
    pop_rows_per_cycle: int = 8  # result rows moved to VMEM per cycle by mxu.pop
    int8_speedup: int = 1  # 8-bit operands stream this many times faster than bf16

    def __post_init__(self) -> None:
        _check_fields(self)
        _need(self.weight_load_cycles != 0, "weight_load_cycles", "must be positive, not 0")

    @property
    def load_cycles(self) -> int:
        return self.rows if self.weight_load_cycles is None else self.weight_load_cycles


@dataclass(frozen=True, kw_only=True, slots=True)
class VpuOpClass:
    """Throughput and latency of one class of vector operations."""

    issue_vregs_per_cycle: float  # vector registers processed per cycle
    latency_cycles: int  # cycles from the last issue to the result

    def __post_init__(self) -> None:
        _check_fields(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class VpuConfig:
    """The vector unit of one TensorCore: registers of sublanes x lanes 32-bit words."""

    sublanes: int = 8
    lanes: int = 128
    alu: VpuOpClass = field(default_factory=lambda: VpuOpClass(issue_vregs_per_cycle=2, latency_cycles=2))
    transcendental: VpuOpClass = field(default_factory=lambda: VpuOpClass(issue_vregs_per_cycle=1, latency_cycles=8))

    def __post_init__(self) -> None:
        _check_fields(self)

    @property
    def vreg_bytes(self) -> int:
        return self.sublanes * self.lanes * 4

    def op_class(self, name: str) -> VpuOpClass:
        return self.alu if name == "alu" else self.transcendental


@dataclass(frozen=True, kw_only=True, slots=True)
class XluConfig:
    """The cross-lane units of one TensorCore (transposes, lane reductions and broadcasts)."""

    count: int = 1
    transpose_cycles_per_vreg: int = 8
    lane_reduce_cycles_per_vreg: int = 4
    lane_broadcast_cycles_per_vreg: int = 2
    latency_cycles: int = 16

    def __post_init__(self) -> None:
        _check_fields(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class VmemConfig:
    """Vector memory of one TensorCore."""

    bytes: int  # capacity
    load_vregs_per_cycle: int = 3  # vector registers read from VMEM per cycle
    store_vregs_per_cycle: int = 1  # vector registers written to VMEM per cycle
    scalar_latency_cycles: int = 8  # s.load from VMEM stalls the sequencer this long

    def __post_init__(self) -> None:
        _check_fields(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class SmemConfig:
    """Scalar memory of one TensorCore."""

    bytes: int
    latency_cycles: int = 2  # s.load from SMEM stalls the sequencer this long

    def __post_init__(self) -> None:
        _check_fields(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class HbmConfig:
    """High-bandwidth memory of one chip, shared by its cores."""

    bytes: int
    bandwidth_bytes_per_s: float
    latency_ns: float  # from a transfer's last byte leaving the channel to its completion
    channels: int = 16  # independent channels; addresses interleave across them
    interleave_bytes: int = 256  # consecutive bytes mapped to one channel

    def __post_init__(self) -> None:
        _check_fields(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class DmaConfig:
    """The DMA engines of one TensorCore."""

    engines: int = 4  # transfers within the chip in flight at once per core (pushes: ici.pushes_per_link)
    queue_depth: int = 16  # issued transfers waiting for an engine before the sequencer stalls
    setup_cycles: int = 32  # per-transfer descriptor work before the first byte moves
    burst_bytes: int = 32  # HBM access granule: each contiguous run is charged whole bursts
    runs_per_cycle: float = 1.0  # contiguous runs an engine can start per cycle
    local_bytes_per_cycle: int = 1024  # bandwidth of a core's VMEM/SMEM side of DMA transfers

    def __post_init__(self) -> None:
        _check_fields(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class IciConfig:
    """Inter-chip interconnect: the links of one chip and the topology its slices form.

    A system is chips on a grid of ``shape`` (at most ``dims`` axes; chip ids are row-major positions). An
    axis has wraparound links (a ring) when the topology is a torus and its length is a multiple of
    ``wraparound_multiple`` (and at least 3), unless ``wraparound`` lists it explicitly. Transfers follow
    dimension-order routing: the axes in ``routing`` order, each the shorter way around a ring.
    """

    topology: Literal["torus", "mesh"] = "torus"  # wraparound links (torus) or not (mesh)
    dims: int = 2  # dimensions of the topology (1 = ring or line)
    max_shape: tuple[int, ...] = (16, 16)  # largest slice the chip family builds
    links_per_chip: int = 4  # ICI ports per chip
    pushes_per_link: int = 2  # pushes to other chips moving at once per first link (later ones wait, in order)
    link_bandwidth_bytes_per_s: float = 4.5e10  # per link, per direction
    hop_latency_ns: float = 1000.0  # per chip-to-chip hop
    shape: tuple[int, ...] | None = None  # the slice a run uses (chips per axis); None: chosen from the chip count
    wraparound: tuple[bool, ...] | None = None  # per axis of `shape`; None: from topology and wraparound_multiple
    wraparound_multiple: int = 1  # an axis of a torus wraps only when its length is a multiple of this
    routing: tuple[int, ...] | None = None  # dimension order of routes (axes corrected first to last); None: 0, 1, ..

    def __post_init__(self) -> None:
        _check_fields(self)
        _need(len(self.max_shape) == self.dims, "max_shape", f"must have {self.dims} entries (dims)")
        _need(all(n > 0 for n in self.max_shape), "max_shape", "entries must be positive")
        _need(
            self.links_per_chip >= 2 * self.dims or self.dims == 1,
            "links_per_chip",
            f"a {self.dims}-D {self.topology} needs {2 * self.dims} links per chip",
        )
        if self.shape is not None:
            problem = self.shape_problem(self.shape)
            _need(problem is None, "shape", problem or "")
        if self.wraparound is not None:
            _need(self.shape is not None, "wraparound", "lists axes of ici.shape, which is not set")
            assert self.shape is not None
            _need(
                len(self.wraparound) == len(self.shape),
                "wraparound",
                f"must have one entry per axis of ici.shape {list(self.shape)}",
            )
            _need(
                self.topology == "torus" or not any(self.wraparound),
                "wraparound",
                "a mesh has no wraparound links (set ici.topology: torus)",
            )
        if self.routing is not None:
            _need(
                sorted(self.routing) == list(range(self.dims)),
                "routing",
                f"must list each of the {self.dims} axes once (a permutation of 0..{self.dims - 1})",
            )

    def shape_problem(self, shape: tuple[int, ...]) -> str | None:
        """Why ``shape`` is not a slice this chip builds (None if it is)."""
        if not shape or any(n < 1 for n in shape):
            return f"a slice needs positive chips per axis, not {list(shape)}"
        if len(shape) > self.dims:
            return f"{list(shape)} has {len(shape)} axes but the chips connect in {self.dims} dimensions"
        limits = sorted(self.max_shape, reverse=True)
        if any(n > m for n, m in zip(sorted(shape, reverse=True), limits)):
            return f"{list(shape)} does not fit the largest slice {list(self.max_shape)} (ici.max_shape)"
        return None

    def default_shape(self, chips: int) -> tuple[int, ...]:
        """The slice ``chips`` chips form when no shape is given: one axis if it fits, else the most balanced
        grid of at most ``dims`` axes within ``max_shape`` (largest axis first)."""
        if self.shape_problem((chips,)) is None:
            return (chips,)
        best: tuple[int, ...] | None = None
        # (no grid holds them: said at once, not after trying every factorization)
        if chips > math.prod(sorted(self.max_shape, reverse=True)[: self.dims]):
            raise ConfigValueError(
                "max_shape", f"{chips} chips do not fit a slice of at most {list(self.max_shape)} chips per axis"
            )
        for k in range(2, self.dims + 1):
            for cand in _factorizations(chips, k):
                if self.shape_problem(cand) is None and (best is None or max(cand) < max(best)):
                    best = cand
            if best is not None:
                return best
        raise ConfigValueError(
            "max_shape", f"{chips} chips do not fit a slice of at most {list(self.max_shape)} chips per axis"
        )

    def wraps(self, shape: tuple[int, ...]) -> tuple[bool, ...]:
        """Per axis of ``shape``: whether it has wraparound links."""
        if self.wraparound is not None and self.shape is not None and tuple(shape) == self.shape:
            return self.wraparound
        return tuple(self.topology == "torus" and n >= 3 and n % self.wraparound_multiple == 0 for n in shape)

    def routing_order(self, axes: int) -> tuple[int, ...]:
        """The order routes correct the axes of a ``axes``-axis slice in."""
        order = self.routing if self.routing is not None else tuple(range(self.dims))
        return tuple(a for a in order if a < axes)


@dataclass(frozen=True, kw_only=True, slots=True)
class DcnConfig:
    """Data-center network: ``slices`` slices of the ICI topology joined through their hosts' NICs.

    A multi-slice system is the slice grid (``ici.shape``) repeated ``slices`` times along a leading axis.
    Along that axis every chip reaches the chip at its own place in any other slice in one crossing of the
    switched network, through its share of its host's NICs: one egress and one ingress of
    ``bandwidth_bytes_per_s`` per chip, shared by all of its DCN traffic."""

    slices: int = 1  # slices joined by DCN (1: a single slice, no DCN)
    bandwidth_bytes_per_s: float = 6.25e9  # per chip and direction: its share of its host's NICs
    latency_ns: float = 10000.0  # per crossing of the network (an estimate)

    def __post_init__(self) -> None:
        _check_fields(self)


def _factorizations(n: int, k: int) -> list[tuple[int, ...]]:
    """Every way to write ``n`` as a product of ``k`` factors > 1, largest first (non-increasing)."""
    if k == 1:
        return [(n,)] if n > 1 else []
    out = []
    for f in range(n, 1, -1):
        if n % f == 0:
            out += [(f, *rest) for rest in _factorizations(n // f, k - 1) if rest[0] <= f]
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishedFigures:
    """Published figures a config is checked against (sources in the YAML comments)."""

    peak_bf16_flops_per_s: float
    hbm_bandwidth_bytes_per_s: float
    peak_int8_ops_per_s: float | None = None
    tolerance: float = 0.01  # relative difference allowed between derived and published values

    def __post_init__(self) -> None:
        _check_fields(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class ChipConfig:
    """One chip: clock, cores, units, memories, interconnect.

    Attributes:
        name: a label for reports.
        clock_hz: the one clock all cycle counts refer to.
        published: figures the file states, checked at load; None for hypothetical chips.
        source: the file it was loaded from (None when built in Python).
        overrides: the ``key=value`` overrides applied on top of the file.
    """

    name: str
    clock_hz: float
    core: CoreConfig = field(default_factory=CoreConfig)
    mxu: MxuConfig = field(default_factory=MxuConfig)
    vpu: VpuConfig = field(default_factory=VpuConfig)
    xlu: XluConfig = field(default_factory=XluConfig)
    vmem: VmemConfig
    smem: SmemConfig
    hbm: HbmConfig
    dma: DmaConfig = field(default_factory=DmaConfig)
    ici: IciConfig = field(default_factory=IciConfig)
    dcn: DcnConfig = field(default_factory=DcnConfig)
    published: PublishedFigures | None = None
    source: str | None = None
    overrides: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_fields(self)
        # the name is a label and part of the default report folder: no path in it (`../x` wrote outside)
        _need(
            bool(self.name) and self.name not in (".", "..") and not any(c in self.name for c in "/\\\0"),
            "name",
            f"{self.name!r} names the chip in reports and their folders: give a plain name, no path",
        )
        for key, size in (("vmem.bytes", self.vmem.bytes), ("smem.bytes", self.smem.bytes)):
            _need(size % 4 == 0, key, f"memories hold whole 32-bit words: {size} is not a multiple of 4")
        limit = "see Limits in configs/README.md"
        for key, ns in (
            ("hbm.latency_ns", self.hbm.latency_ns),
            ("ici.hop_latency_ns", self.ici.hop_latency_ns),
            ("dcn.latency_ns", self.dcn.latency_ns),
        ):
            cycles = ns * self.clock_hz / 1e9
            _need(
                cycles <= MAX_LATENCY_CYCLES,
                key,
                f"{ns:g} ns is {cycles:.4g} cycles at clock_hz {self.clock_hz:g}, more than 2^20 = "
                f"{MAX_LATENCY_CYCLES:,} ({limit})",
            )
        for key, per_s in (
            ("hbm.bandwidth_bytes_per_s", self.hbm.bandwidth_bytes_per_s),
            ("ici.link_bandwidth_bytes_per_s", self.ici.link_bandwidth_bytes_per_s),
            ("dcn.bandwidth_bytes_per_s", self.dcn.bandwidth_bytes_per_s),
        ):
            per_cycle = per_s / self.clock_hz
            _need(
                per_cycle * MAX_CYCLES_PER_UNIT >= 1 and per_cycle <= MAX_PER_CYCLE,
                key,
                f"{per_s:g} bytes/s is {per_cycle:.4g} bytes per cycle at clock_hz {self.clock_hz:g}; it must be "
                f"from 1/{MAX_CYCLES_PER_UNIT:,} to 2^30 ({limit})",
            )
        # The result buffer is used in halves (one accumulates while mxu.pop drains the other), and blocks of
        # rows come in whole vector registers of vpu.sublanes rows: with a half that is not a multiple of
        # sublanes, a block overran its half; with result_buffer_rows 1 a half had no rows at all.
        rows, unit = self.mxu.result_buffer_rows, 2 * self.vpu.sublanes
        _need(
            rows % unit == 0,
            "mxu.result_buffer_rows",
            f"must be a multiple of 2 x vpu.sublanes = {unit} (two halves of whole vector registers), not {rows}",
        )
        _need(
            rows * self.mxu.cols <= MAX_RESULT_BUFFER_WORDS,
            "mxu.result_buffer_rows",
            f"{rows} rows x mxu.cols {self.mxu.cols} is more than 2^26 words ({limit})",
        )

    # -- derived figures
    @property
    def peak_bf16_flops_per_s(self) -> float:
        """cores x MXUs x rows x cols x 2 flops per MAC x clock."""
        return self.core.count * self.mxu.count * self.mxu.rows * self.mxu.cols * 2 * self.clock_hz

    @property
    def peak_int8_ops_per_s(self) -> float:
        return self.peak_bf16_flops_per_s * self.mxu.int8_speedup

    @property
    def hbm_bytes_per_cycle(self) -> float:
        return self.hbm.bandwidth_bytes_per_s / self.clock_hz

    @property
    def link_bytes_per_cycle(self) -> float:
        return self.ici.link_bandwidth_bytes_per_s / self.clock_hz

    @property
    def dcn_bytes_per_cycle(self) -> float:
        return self.dcn.bandwidth_bytes_per_s / self.clock_hz

    def network_cycles(self, hops: int, crossings: int = 0) -> int:
        """Latency of ``hops`` ICI hops and ``crossings`` of the data-center network, in cycles."""
        return hops * self.cycles(self.ici.hop_latency_ns) + crossings * self.cycles(self.dcn.latency_ns)

    def cycles(self, ns: float) -> int:
        """Nanoseconds as whole cycles of this chip's clock (rounded up)."""
        return ceil(ns * self.clock_hz / 1e9 - 1e-9)

    def seconds(self, cycles: float) -> float:
        return cycles / self.clock_hz

    def check_published(self) -> list[tuple[str, float, float]]:
        """``(key, derived, published)`` for every published figure the config misses by more than the tolerance."""
        p = self.published
        if p is None:
            return []
        pairs = [
            ("peak_bf16_flops_per_s", self.peak_bf16_flops_per_s, p.peak_bf16_flops_per_s),
            ("hbm_bandwidth_bytes_per_s", self.hbm.bandwidth_bytes_per_s, p.hbm_bandwidth_bytes_per_s),
        ]
        if p.peak_int8_ops_per_s is not None:
            pairs.append(("peak_int8_ops_per_s", self.peak_int8_ops_per_s, p.peak_int8_ops_per_s))
        return [(k, d, v) for k, d, v in pairs if abs(d - v) > p.tolerance * v]


# ---------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------
class _Context:
    def __init__(self, source: str) -> None:
        self.source = source
        self.origin: dict[int, str] = {}  # id(node) -> override text, for nodes that came from --set
        self.constructor = SafeLoader("", source)

    def where(self, node: yaml.Node, column: bool = False) -> str:
        if id(node) in self.origin:
            return f"override {shorten(self.origin[id(node)])!r}"
        mark = node.start_mark
        return f"{self.source}:{mark.line + 1}" + (f":{mark.column + 1}" if column else "")

    def fail(self, node: yaml.Node, key: str, message: str, column: bool = False) -> ConfigError:
        return ConfigError(f"{self.where(node, column)}: {key}: {message}")

    def scalar(self, node: yaml.Node, key: str) -> Any:
        try:
            return scalar_value(self.constructor, node)
        except YamlError as e:
            raise self.fail(node, key, e.problem, column=True) from None


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " or ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) is tuple:
        return "a list of true/false values" if get_args(tp)[0] is bool else "a list of integers"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def _convert(tp: Any, node: yaml.Node, key: str, ctx: _Context) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
            return None
        return _convert(args[0], node, key, ctx)
    if dataclasses.is_dataclass(tp):
        return _build(tp, node, key, ctx)
    if origin is tuple:
        if not isinstance(node, yaml.SequenceNode):
            raise ctx.fail(node, key, f"expected {_type_name(tp)}")
        item = get_args(tp)[0]
        return tuple(_convert(item, n, f"{key}[{i}]", ctx) for i, n in enumerate(node.value))
    if not isinstance(node, yaml.ScalarNode):
        raise ctx.fail(
            node,
            key,
            f"expected {_type_name(tp)}, not a {'list' if isinstance(node, yaml.SequenceNode) else 'mapping'}",
        )
    value = ctx.scalar(node, key)
    try:
        return _typed(tp, value)
    except ConfigValueError as e:
        raise ctx.fail(node, key, e.reason) from None


def _typed(tp: Any, value: Any) -> Any:
    """``value`` (as YAML read it) as the schema type ``tp``, or a ConfigValueError saying what was expected."""
    if get_origin(tp) is Literal:
        if value not in get_args(tp):
            raise ConfigValueError("", f"expected {_type_name(tp)}, not {show_value(value)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigValueError("", f"expected true or false, not {show_value(value)}")
        return value
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigValueError("", f"expected an integer, not {show_value(value)}")
        return value
    if tp is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigValueError("", f"expected a number, not {show_value(value)}")
        try:
            return float(value)
        except OverflowError:  # an integer beyond float range: over 10^308
            raise ConfigValueError("", f"must be a finite number, not {show_value(value)}") from None
    if tp is str:
        if not isinstance(value, str):
            raise ConfigValueError("", f"expected a string, not {show_value(value)}")
        return value
    raise TypeError(f"config schema uses unsupported type {tp}")  # a bug in this module, not user input


_INTERNAL = {"source", "overrides"}


def _node_at(node: yaml.Node, parts: list[str], ctx: _Context) -> yaml.Node:
    """Where dotted key ``parts`` under mapping ``node`` was set: its value's node if an override set it, else
    its key's node (the line it is written on), else the deepest enclosing section's key, else ``node``."""
    at = node
    for part in parts:
        if not isinstance(node, yaml.MappingNode):
            break
        pair = next((kv for kv in node.value if isinstance(kv[0], yaml.ScalarNode) and kv[0].value == part), None)
        if pair is None:
            break
        at = pair[1] if id(pair[1]) in ctx.origin else pair[0]
        node = pair[1]
    return at


def _build(cls: Any, node: yaml.Node, path: str, ctx: _Context) -> Any:
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, path or "(top level)", "expected a mapping of keys to values")
    hints = get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls) if f.name not in _INTERNAL]
    values: dict[str, Any] = {}
    key_nodes: dict[str, yaml.Node] = {}
    for key_node, value_node in node.value:
        key = ctx.scalar(key_node, path or "(top level)")
        full = f"{path}.{key}" if path else str(key)
        if not isinstance(key, str):
            raise ctx.fail(key_node, shorten(full), "keys must be strings")
        if key in key_nodes:
            raise ctx.fail(key_node, full, f"key given twice (first at line {key_nodes[key].start_mark.line + 1})")
        if key not in known:
            raise ctx.fail(key_node, shorten(full), f"unknown key; {cls.__name__} keys are: {', '.join(known)}")
        key_nodes[key] = key_node
        values[key] = _convert(hints[key], value_node, full, ctx)
    for f in dataclasses.fields(cls):
        if (
            f.name not in values
            and f.name not in _INTERNAL
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ):
            raise ctx.fail(node, f"{path}.{f.name}" if path else f.name, "required key is missing")
    try:
        return cls(**values)
    except ConfigValueError as e:
        at = _node_at(node, e.key.split("."), ctx)
        full = f"{path}.{e.key}" if path else e.key
        raise ctx.fail(at, full, e.reason) from None


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """``"mxu.rows=256"`` -> ``(("mxu", "rows"), "256")``: the dotted key and the value's text."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip() or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", key.strip()):
        raise ConfigError(f"override {shorten(text)!r} must look like section.key=value, e.g. mxu.rows=256")
    return tuple(key.strip().split(".")), value.strip()


def _compose_override(text: str) -> tuple[tuple[str, ...], yaml.Node, SafeLoader]:
    """The key of override ``text`` and its value as a YAML node (typed as a YAML scalar, 1.5e9 a number)."""
    path, value = parse_override(text)
    quoted = f"override {shorten(text)!r}"
    try:
        node, loader = compose_yaml(value if value else "null", quoted)
    except YamlError as e:
        if e.problem.startswith("not valid YAML"):
            raise ConfigError(f"{quoted}: the value is {e.problem}") from None
        raise ConfigError(f"{quoted}: {'.'.join(path)}: {e.problem}") from None
    if node is None:
        node, loader = compose_yaml("null", quoted)
    assert node is not None
    return path, node, loader


def override_values(overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["mxu.rows=256", ...]`` as ``{"mxu.rows": 256, ...}`` for :func:`with_overrides`, each value typed as
    a YAML scalar as ``--set`` types it; a value YAML cannot read is a ConfigError naming the override."""
    out: dict[str, Any] = {}
    for text in overrides:
        path, node, loader = _compose_override(text)
        try:
            out[".".join(path)] = loader.construct_document(node)
        except YamlError as e:
            raise ConfigError(f"override {shorten(text)!r}: {'.'.join(path)}: {e.problem}") from None
    return out


def _apply_override(root: yaml.MappingNode, text: str, ctx: _Context) -> None:
    path, new, _ = _compose_override(text)
    _mark_origin(new, text, ctx)
    node = root
    for i, part in enumerate(path):
        if not isinstance(node, yaml.MappingNode):
            raise ConfigError(f"override {shorten(text)!r}: {'.'.join(path[:i])} is not a section")
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == part:
                if i == len(path) - 1:
                    node.value[node.value.index((k, v))] = (k, new)
                    _mark_origin(k, text, ctx)
                node = v
                break
        else:
            key = yaml.ScalarNode("tag:yaml.org,2002:str", part)
            _mark_origin(key, text, ctx)
            child = new if i == len(path) - 1 else yaml.MappingNode("tag:yaml.org,2002:map", [])
            _mark_origin(child, text, ctx)
            node.value.append((key, child))
            node = child


def _mark_origin(node: yaml.Node, text: str, ctx: _Context) -> None:
    stack = [node]
    while stack:
        n = stack.pop()
        ctx.origin[id(n)] = text
        if isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, yaml.MappingNode):
            stack.extend(x for pair in n.value for x in pair)


def check_overrides(overrides: Any) -> None:
    """Overrides are ``"section.key=value"`` texts (a list or tuple of them) or a ``{"section.key": value}``
    dict (a string alone was read one character at a time).

    Raises:
        ConfigError: anything else, naming the first wrong item.
    """
    if isinstance(overrides, dict):
        bad = [k for k in overrides if not isinstance(k, str)]
    elif isinstance(overrides, (list, tuple)):
        bad = [o for o in overrides if not isinstance(o, str)]
    else:
        raise ConfigError(
            "overrides must be a list of 'section.key=value' texts or a {'section.key': value} dict, "
            f"not {show_value(overrides)}"
        )
    if bad:
        raise ConfigError(f"an override must be a 'section.key=value' text (or a dict's key), not {show_value(bad[0])}")


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] | dict[str, Any] = ()) -> ChipConfig:
    """Load a chip config.

    Args:
        path: a YAML file, or the name of a preset in :data:`PRESETS` (``tpu_v5e``, ``teaching`` ...).
        overrides: ``"section.key=value"`` strings (as ``--set`` takes them) or a ``{"section.key": value}``
            dict, applied in order on top of the file.

    Returns:
        The validated config.

    Raises:
        ConfigError: naming the file and line (or the override) and the key.
    """
    if not isinstance(path, (str, Path)):
        raise ConfigError(f"a chip config is a preset name or a YAML path, not {show_value(path)}")
    check_overrides(overrides)
    p = PRESETS.get(str(path), Path(path))
    problem = regular_file_problem(p)
    if problem:
        raise ConfigError(f"cannot read config {shorten(str(path))!r}: it {problem}")
    try:
        data = p.read_bytes()
    except OSError as e:
        known = ", ".join(PRESETS)
        raise ConfigError(f"cannot read config {shorten(str(path))!r} ({e.strerror}); presets are: {known}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{p}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x})") from None
    ctx = _Context(str(p))
    root = _composed(text, str(p))
    if root is None:
        raise ConfigError(f"{p}: the file is empty")
    items = _override_texts(overrides) if isinstance(overrides, dict) else list(overrides)
    for o in items:
        _apply_override(root, o, ctx)
    try:
        cfg = _build(ChipConfig, root, "", ctx)
    except ConfigError as e:
        # a rule between keys that an override broke: the file's line is where the other key is written,
        # so say which overrides were applied
        if items and not str(e).startswith("override "):
            raise ConfigError(f"{e} (with the overrides {', '.join(map(str, items))})") from None
        raise
    cfg = dataclasses.replace(cfg, source=str(p), overrides=tuple(items))
    if not items:
        misses = cfg.check_published()
        if misses:
            k, derived, published = misses[0]
            assert cfg.published is not None
            raise ConfigError(
                f"{p}: published.{k}: the config gives {derived:.4g} but the published figure is {published:.4g} "
                f"(more than {cfg.published.tolerance:.1%} apart); fix the clock, unit counts or bandwidth"
            )
    return cfg


_COMPOSED: dict[tuple[str, str], Any] = {}


def _composed(text: str, source: str) -> Any:
    """The node tree of a config file's ``text``, a fresh copy each call (overrides edit it in place); the
    parse is kept per text, so a sweep's points, each loading the same file with other overrides, parse it
    once."""
    key = (source, text)
    if key not in _COMPOSED:
        if len(_COMPOSED) >= 16:
            _COMPOSED.clear()
        _COMPOSED[key] = compose_yaml(text, source)[0]
    return _copy_node(_COMPOSED[key])


def _copy_node(node: Any) -> Any:
    """A copy of a node tree whose nodes and lists are new (overrides replace values and add keys) and whose
    scalars and marks are shared (never changed): ``copy.deepcopy`` was 8% of a compile-bound sweep."""
    if isinstance(node, yaml.MappingNode):
        pairs = [(_copy_node(k), _copy_node(v)) for k, v in node.value]
        return yaml.MappingNode(node.tag, pairs, node.start_mark, node.end_mark, node.flow_style)
    if isinstance(node, yaml.SequenceNode):
        items = [_copy_node(v) for v in node.value]
        return yaml.SequenceNode(node.tag, items, node.start_mark, node.end_mark, node.flow_style)
    if isinstance(node, yaml.ScalarNode):
        return yaml.ScalarNode(node.tag, node.value, node.start_mark, node.end_mark, node.style)
    return node


def _override_texts(overrides: dict[str, Any]) -> list[str]:
    out = []
    for k, v in overrides.items():
        try:
            out.append(f"{k}={_yaml_text(v)}")
        except ValueError:  # an integer longer than Python writes out (4,300 digits)
            raise ConfigError(f"override {shorten(str(k))}: {show_value(v)} is too long to be a value") from None
    return out


def _yaml_text(value: Any) -> str:
    """A Python value as the YAML text of an override: numbers as written (``inf`` as ``.inf``), text quoted,
    lists and mappings in flow style; a numpy scalar as the Python number it holds."""
    if hasattr(value, "item") and type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        value = value.item()  # (np.int64(64) was text, then refused as "not an integer")
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_yaml_text(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value))  # a JSON string is a YAML double-quoted scalar


def with_overrides(cfg: ChipConfig, overrides: dict[str, Any]) -> ChipConfig:
    """A copy of ``cfg`` with dotted keys replaced by Python values (validated like the file).

    >>> with_overrides(load_config("teaching"), {"mxu.double_buffered": False}).mxu.double_buffered
    False
    """
    for key, value in overrides.items():
        try:
            cfg = _replace_path(cfg, key.split("."), value, ())
        except ConfigValueError as e:
            raise ConfigError(f"override {shorten(f'{key}={show_value(value)}')}: {e.key}: {e.reason}") from None
    return dataclasses.replace(
        cfg, overrides=cfg.overrides + tuple(shorten(f"{k}={show_value(v)}", 200) for k, v in overrides.items())
    )


def _check_python_type(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in get_args(tp):
            return None
        return _check_python_type(next(a for a in get_args(tp) if a is not type(None)), value, key)
    if origin is tuple:
        item = get_args(tp)[0]
        ok = isinstance(value, (tuple, list)) and all(
            isinstance(v, bool) if item is bool else isinstance(v, int) and not isinstance(v, bool) for v in value
        )
        if not ok:
            raise ConfigValueError(key, f"expected {_type_name(tp)}, not {show_value(value)}")
        return tuple(value)
    if tp in (bool, int, float, str) or origin is Literal:
        try:
            return _typed(tp, value)
        except ConfigValueError as e:
            raise ConfigValueError(key, e.reason) from None
    if not isinstance(value, tp):
        raise ConfigValueError(key, f"expected a {getattr(tp, '__name__', tp)} section, not {show_value(value)}")
    return value


class _Qualified(ConfigValueError):
    """A ConfigValueError whose key is already the full dotted key."""


def _replace_path(obj: Any, parts: list[str], value: Any, done: tuple[str, ...]) -> Any:
    names = {f.name for f in dataclasses.fields(obj)} - _INTERNAL
    if parts[0] not in names:
        raise ConfigError(
            f"unknown config key {shorten(parts[0])!r} in {type(obj).__name__}; keys are: {', '.join(sorted(names))}"
        )
    here = (*done, parts[0])
    if len(parts) == 1:
        try:
            value = _check_python_type(get_type_hints(type(obj))[parts[0]], value, parts[0])
        except ConfigValueError as e:
            raise _Qualified(".".join(here), e.reason) from None
    else:
        value = _replace_path(getattr(obj, parts[0]), parts[1:], value, here)
    try:
        return dataclasses.replace(obj, **{parts[0]: value})
    except _Qualified:
        raise
    except ConfigValueError as e:  # the key relative to obj: qualify it with the sections above
        raise _Qualified(".".join([*done, e.key]), e.reason) from None


def add_config_arguments(parser: Any) -> None:
    """Add ``--config NAME|PATH`` and repeatable ``--set key=value`` to an ``argparse`` parser."""
    parser.add_argument("--config", default="tpu_v5e", help=f"chip config: a YAML path or one of {', '.join(PRESETS)}")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set mxu.rows=256 (repeatable; values are typed as YAML scalars)",
    )


def config_from_args(args: Any) -> ChipConfig:
    """The config named by :func:`add_config_arguments`' options."""
    return load_config(args.config, list(args.overrides))
