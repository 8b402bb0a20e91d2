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
import re
import types
from dataclasses import dataclass, field
from math import ceil
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from tpusim.errors import ConfigError

__all__ = [
    "PRESETS",
    "ChipConfig",
    "ConfigValueError",
    "CoreConfig",
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
    "config_dir",
    "config_from_args",
    "load_config",
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


def _positive(obj: Any, *keys: str) -> None:
    for k in keys:
        _need(getattr(obj, k) > 0, k, f"must be positive, not {getattr(obj, k)}")


def _non_negative(obj: Any, *keys: str) -> None:
    for k in keys:
        _need(getattr(obj, k) >= 0, k, f"must not be negative, not {getattr(obj, k)}")


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
        _positive(self, "count", "instruction_queue_depth", "scalar_registers", "semaphores")
        _non_negative(self, "branch_cycles")


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
        _positive(self, "count", "rows", "cols", "result_buffer_rows", "pop_rows_per_cycle", "int8_speedup")
        _need(self.weight_load_cycles is None or self.weight_load_cycles > 0, "weight_load_cycles", "must be positive")

    @property
    def load_cycles(self) -> int:
        return self.rows if self.weight_load_cycles is None else self.weight_load_cycles


@dataclass(frozen=True, kw_only=True, slots=True)
class VpuOpClass:
    """Throughput and latency of one class of vector operations."""

    issue_vregs_per_cycle: float  # vector registers processed per cycle
    latency_cycles: int  # cycles from the last issue to the result

    def __post_init__(self) -> None:
        _positive(self, "issue_vregs_per_cycle")
        _non_negative(self, "latency_cycles")


@dataclass(frozen=True, kw_only=True, slots=True)
class VpuConfig:
    """The vector unit of one TensorCore: registers of sublanes x lanes 32-bit words."""

    sublanes: int = 8
    lanes: int = 128
    alu: VpuOpClass = field(default_factory=lambda: VpuOpClass(issue_vregs_per_cycle=2, latency_cycles=2))
    transcendental: VpuOpClass = field(default_factory=lambda: VpuOpClass(issue_vregs_per_cycle=1, latency_cycles=8))

    def __post_init__(self) -> None:
        _positive(self, "sublanes", "lanes")

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
        _positive(
            self, "count", "transpose_cycles_per_vreg", "lane_reduce_cycles_per_vreg", "lane_broadcast_cycles_per_vreg"
        )
        _non_negative(self, "latency_cycles")


@dataclass(frozen=True, kw_only=True, slots=True)
class VmemConfig:
    """Vector memory of one TensorCore."""

    bytes: int  # capacity
    load_vregs_per_cycle: int = 3  # vector registers read from VMEM per cycle
    store_vregs_per_cycle: int = 1  # vector registers written to VMEM per cycle
    scalar_latency_cycles: int = 8  # s.load from VMEM stalls the sequencer this long

    def __post_init__(self) -> None:
        _positive(self, "bytes", "load_vregs_per_cycle", "store_vregs_per_cycle")
        _non_negative(self, "scalar_latency_cycles")


@dataclass(frozen=True, kw_only=True, slots=True)
class SmemConfig:
    """Scalar memory of one TensorCore."""

    bytes: int
    latency_cycles: int = 2  # s.load from SMEM stalls the sequencer this long

    def __post_init__(self) -> None:
        _positive(self, "bytes")
        _non_negative(self, "latency_cycles")


@dataclass(frozen=True, kw_only=True, slots=True)
class HbmConfig:
    """High-bandwidth memory of one chip, shared by its cores."""

    bytes: int
    bandwidth_bytes_per_s: float
    latency_ns: float  # from a transfer's last byte leaving the channel to its completion
    channels: int = 16  # independent channels; addresses interleave across them
    interleave_bytes: int = 256  # consecutive bytes mapped to one channel

    def __post_init__(self) -> None:
        _positive(self, "bytes", "bandwidth_bytes_per_s", "channels", "interleave_bytes")
        _non_negative(self, "latency_ns")


@dataclass(frozen=True, kw_only=True, slots=True)
class DmaConfig:
    """The DMA engines of one TensorCore."""

    engines: int = 4  # transfers in flight at once per core
    queue_depth: int = 16  # issued transfers waiting for an engine before the sequencer stalls
    setup_cycles: int = 32  # per-transfer descriptor work before the first byte moves
    burst_bytes: int = 32  # HBM access granule: each contiguous run is charged whole bursts
    runs_per_cycle: float = 1.0  # contiguous runs an engine can start per cycle
    local_bytes_per_cycle: int = 1024  # bandwidth of a core's VMEM/SMEM side of DMA transfers

    def __post_init__(self) -> None:
        _positive(self, "engines", "queue_depth", "burst_bytes", "runs_per_cycle", "local_bytes_per_cycle")
        _non_negative(self, "setup_cycles")


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
    link_bandwidth_bytes_per_s: float = 4.5e10  # per link, per direction
    hop_latency_ns: float = 1000.0  # per chip-to-chip hop
    shape: tuple[int, ...] | None = None  # the slice a run uses (chips per axis); None: chosen from the chip count
    wraparound: tuple[bool, ...] | None = None  # per axis of `shape`; None: from topology and wraparound_multiple
    wraparound_multiple: int = 1  # an axis of a torus wraps only when its length is a multiple of this
    routing: tuple[int, ...] | None = None  # dimension order of routes (axes corrected first to last); None: 0, 1, ..

    def __post_init__(self) -> None:
        _positive(self, "dims", "links_per_chip", "link_bandwidth_bytes_per_s", "wraparound_multiple")
        _non_negative(self, "hop_latency_ns")
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
        _positive(self, "peak_bf16_flops_per_s", "hbm_bandwidth_bytes_per_s")
        _non_negative(self, "tolerance")


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
    published: PublishedFigures | None = None
    source: str | None = None
    overrides: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _positive(self, "clock_hz")
        _need(self.vmem.bytes % 4 == 0 and self.smem.bytes % 4 == 0, "vmem.bytes", "memories hold whole 32-bit words")

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
class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``1.5e9`` as a float as YAML 1.2 does (YAML 1.1 needs ``1.5e+9``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
        r"|[0-9][0-9_]*[eE][-+]?[0-9]+|\.(?:inf|Inf|INF)|[-+]\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


class _Context:
    def __init__(self, source: str) -> None:
        self.source = source
        self.origin: dict[int, str] = {}  # id(node) -> override text, for nodes that came from --set
        self.constructor = _Loader("")

    def where(self, node: yaml.Node) -> str:
        if id(node) in self.origin:
            return f"override {self.origin[id(node)]!r}"
        return f"{self.source}:{node.start_mark.line + 1}"

    def fail(self, node: yaml.Node, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.where(node)}: {key}: {message}")

    def scalar(self, node: yaml.Node) -> Any:
        return self.constructor.construct_object(node, deep=True)


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
    value = ctx.scalar(node)
    if origin is Literal:
        if value not in get_args(tp):
            raise ctx.fail(node, key, f"expected {_type_name(tp)}, not {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ctx.fail(node, key, f"expected true or false, not {value!r}")
        return value
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ctx.fail(node, key, f"expected an integer, not {value!r}")
        return value
    if tp is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ctx.fail(node, key, f"expected a number, not {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ctx.fail(node, key, f"expected a string, not {value!r}")
        return value
    raise TypeError(f"config schema uses unsupported type {tp}")  # a bug in this module, not user input


_INTERNAL = {"source", "overrides"}


def _build(cls: Any, node: yaml.Node, path: str, ctx: _Context) -> Any:
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, path or "(top level)", "expected a mapping of keys to values")
    hints = get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls) if f.name not in _INTERNAL]
    values: dict[str, Any] = {}
    key_nodes: dict[str, yaml.Node] = {}
    for key_node, value_node in node.value:
        key = ctx.scalar(key_node)
        full = f"{path}.{key}" if path else str(key)
        if not isinstance(key, str):
            raise ctx.fail(key_node, full, "keys must be strings")
        if key in key_nodes:
            raise ctx.fail(key_node, full, f"key given twice (first at line {key_nodes[key].start_mark.line + 1})")
        if key not in known:
            raise ctx.fail(key_node, full, f"unknown key; {cls.__name__} keys are: {', '.join(known)}")
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
        first = e.key.split(".")[0]
        at = key_nodes.get(first, node)
        full = f"{path}.{e.key}" if path else e.key
        raise ctx.fail(at, full, e.reason) from None


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """``"mxu.rows=256"`` -> ``(("mxu", "rows"), 256)``; the value is typed as a YAML scalar would be."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip() or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", key.strip()):
        raise ConfigError(f"override {text!r} must look like section.key=value, e.g. mxu.rows=256")
    return tuple(key.strip().split(".")), value.strip()


def _apply_override(root: yaml.MappingNode, text: str, ctx: _Context) -> None:
    path, value = parse_override(text)
    try:
        new = yaml.compose(value if value else "null", Loader=_Loader)
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: the value is not valid YAML: {e}") from None
    if new is None:
        new = yaml.compose("null", Loader=_Loader)
    _mark_origin(new, text, ctx)
    node = root
    for i, part in enumerate(path):
        if not isinstance(node, yaml.MappingNode):
            raise ConfigError(f"override {text!r}: {'.'.join(path[:i])} is not a section")
        for k, v in node.value:
            if ctx.scalar(k) == part:
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
    ctx.origin[id(node)] = text
    for child in getattr(node, "value", []) if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) else []:
        for n in child if isinstance(child, tuple) else (child,):
            _mark_origin(n, text, ctx)


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
    p = PRESETS.get(str(path), Path(path))
    try:
        text = p.read_text()
    except OSError as e:
        known = ", ".join(PRESETS)
        raise ConfigError(f"cannot read config {str(path)!r} ({e.strerror}); presets are: {known}") from None
    ctx = _Context(str(p))
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if root is None:
        raise ConfigError(f"{p}: the file is empty")
    items = [f"{k}={v}" for k, v in overrides.items()] if isinstance(overrides, dict) else list(overrides)
    for o in items:
        _apply_override(root, o, ctx)
    cfg = _build(ChipConfig, root, "", ctx)
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


def with_overrides(cfg: ChipConfig, overrides: dict[str, Any]) -> ChipConfig:
    """A copy of ``cfg`` with dotted keys replaced by Python values (validated like the file).

    >>> with_overrides(load_config("teaching"), {"mxu.double_buffered": False}).mxu.double_buffered
    False
    """
    for key, value in overrides.items():
        parts = key.split(".")
        try:
            cfg = _replace_path(cfg, parts, value)
        except ConfigValueError as e:
            raise ConfigError(
                f"override {key}={value!r}: {'.'.join([*parts[:-1], e.key]) if len(parts) > 1 else e.key}: {e.reason}"
            ) from None
    return dataclasses.replace(cfg, overrides=cfg.overrides + tuple(f"{k}={v}" for k, v in overrides.items()))


def _check_python_type(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in get_args(tp):
            return None
        return _check_python_type(next(a for a in get_args(tp) if a is not type(None)), value, key)
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }.get(tp)
    if origin is Literal:
        ok = value in get_args(tp)
    elif origin is tuple:
        item = get_args(tp)[0]
        ok = isinstance(value, (tuple, list)) and all(
            isinstance(v, bool) if item is bool else isinstance(v, int) and not isinstance(v, bool) for v in value
        )
        value = tuple(value) if ok else value
    if ok is None:
        ok = isinstance(value, tp)
    if not ok:
        raise ConfigValueError(key, f"expected {_type_name(tp)}, not {value!r}")
    return float(value) if tp is float else value


def _replace_path(obj: Any, parts: list[str], value: Any) -> Any:
    names = {f.name for f in dataclasses.fields(obj)} - _INTERNAL
    if parts[0] not in names:
        raise ConfigError(
            f"unknown config key {parts[0]!r} in {type(obj).__name__}; keys are: {', '.join(sorted(names))}"
        )
    if len(parts) == 1:
        value = _check_python_type(get_type_hints(type(obj))[parts[0]], value, parts[0])
        return dataclasses.replace(obj, **{parts[0]: value})
    return dataclasses.replace(obj, **{parts[0]: _replace_path(getattr(obj, parts[0]), parts[1:], value)})


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
