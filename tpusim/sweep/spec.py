"""Sweep specs: a YAML file naming programs, a base chip and compile options, and the parameters to vary.

    name: mxu_vs_hbm                      # default: the file name
    programs: {block: programs/block.hlo} # name -> HLO file (relative to the spec), or a list of files
    config: tpu_v5e                       # the base chip: a preset or a YAML path
    set: {dma.engines: 8}                 # base config overrides
    options: {tiling: tpu_default}        # base compile options (tiling, matmul_precision, fuse, vmem_fraction)
    timing_only: true                     # default true: skip numeric work where timing does not need it
    seed: 0                               # random inputs (or `inputs: file.npz`)
    grid:                                 # every combination ...
      hbm.bandwidth_bytes_per_s: [4.1e11, 8.19e11, 1.64e12]
    zip:                                  # ... of these lists, moved together (one axis; a list of groups for more)
      mxu.rows: [64, 128, 256]
      mxu.cols: [64, 128, 256]
    objective: seconds                    # the best point minimises it ({maximise: metric} to maximise)
    cost: mxu_macs                        # the Pareto front: objective against this column
    metrics: [seconds, flops_fraction_of_peak]   # what the plots show (default: a headline set)

A parameter is a compile option, ``program``, ``config`` (a whole chip), ``seed``, ``inputs``, ``timing_only``,
or else a config key (``mxu.rows``, ``clock_hz``). Every point's config is built and checked when the spec is
loaded, so a bad key or value is reported with the spec's file and line before anything runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpusim.compiler.hlo import load_module
from tpusim.compiler.options import CompileOptions
from tpusim.compiler.tiling_rules import load_tiling_rules, tiling_sources
from tpusim.config import PRESETS, ChipConfig, load_config
from tpusim.errors import TpusimError
from tpusim.yamlio import YamlMap, load_yaml, read_text, shorten, show_value, where

__all__ = ["COST_COLUMNS", "DEFAULT_METRICS", "METRIC_COLUMNS", "Point", "SweepError", "SweepSpec", "load_spec"]

OPTION_KEYS = tuple(f.name for f in dataclasses.fields(CompileOptions))
RUN_KEYS = ("program", "config", "seed", "inputs", "timing_only")
METRIC_COLUMNS = (
    "cycles", "seconds", "instructions", "flops", "flops_per_s", "flops_fraction_of_peak", "hbm_bytes",
    "hbm_bytes_per_s", "hbm_bandwidth_fraction", "mxu_busy_fraction", "vpu_busy_fraction", "dma_busy_fraction",
    "peak_hbm_bytes", "peak_vmem_bytes", "fallbacks", "relayouts",
)  # fmt: skip
"""Headline metrics of a point, in table order (units in the names; fractions between 0 and 1)."""

COST_COLUMNS = ("mxu_macs", "hbm_bandwidth_bytes_per_s", "vmem_bytes", "peak_flops_per_s")
"""Costs of a point's chip, for Pareto fronts: multiply-add cells of all MXUs of a chip (a proxy for MXU area),
HBM bandwidth, VMEM capacity per core, peak bf16 FLOP/s."""

DEFAULT_METRICS = ("seconds", "flops_fraction_of_peak", "hbm_bandwidth_fraction", "mxu_busy_fraction")
_TOP_KEYS = ("name", "description", "programs", "config", "set", "options", "timing_only", "seed", "inputs", "grid",
             "zip", "objective", "cost", "metrics")  # fmt: skip
_FLOAT = re.compile(r"^[-+]?(\d[\d_]*(\.[\d_]*)?|\.\d[\d_]*)([eE][-+]?\d+)?$")  # linear: one way to match

MAX_POINTS = 100_000
"""Most points a spec may expand to: at a fraction of a second to minutes per point, more is days of work, and
every point's config is built when the spec is read (a grid of three 1,000-value axes would hang there)."""

MAX_SEED = 2**64 - 1


class SweepError(TpusimError):
    """A sweep spec that cannot run, or a sweep folder that cannot be resumed."""


@dataclass(frozen=True, slots=True)
class Point:
    """One run of a sweep.

    Attributes:
        index: position in the spec's expansion order (the order of the results table).
        id: a digest of what the point runs (program and parameters); a resumed sweep matches rows by it.
        program: the program's name in the spec.
        params: the varied parameters and their values, in spec order.
        config: the chip, with the base overrides and this point's config parameters applied.
        options: compile options.
        seed: seed of the random inputs.
        inputs: an ``.npz`` of inputs instead of random ones.
        timing_only: skip numeric work where timing does not need it.
    """

    index: int
    id: str
    program: str
    params: tuple[tuple[str, Any], ...]
    config: ChipConfig
    options: CompileOptions
    seed: int
    inputs: str | None
    timing_only: bool


@dataclass(frozen=True)
class SweepSpec:
    """A loaded sweep spec (see the module docstring).

    Attributes:
        name: the sweep's name.
        source: the spec file.
        text: the spec's text (copied into the output folder).
        description: free text.
        programs: name -> HLO file.
        parameters: the varied parameter names, in spec order (``program`` first when several programs run).
        axes: the parameter names of each axis (a zip group is one axis of several parameters).
        points: every point, in expansion order.
        objective: the metric the best point optimises, and whether to maximise it.
        cost: the column the Pareto front puts against the objective.
        metrics: the metrics the plots show.
    """

    name: str
    source: Path
    text: str
    description: str
    programs: dict[str, Path]
    parameters: tuple[str, ...]
    axes: tuple[tuple[str, ...], ...]
    points: tuple[Point, ...]
    objective: tuple[str, bool]
    cost: str
    metrics: tuple[str, ...]


def _number(v: Any) -> Any:
    """YAML 1.1 reads ``1.5e9`` as text; take it as the number YAML 1.2 means."""
    if isinstance(v, str) and _FLOAT.match(v) and any(c.isdigit() for c in v):
        return float(v.replace("_", ""))
    return v


def _need_map(value: Any, where_: str, what: str) -> YamlMap:
    if not isinstance(value, dict):
        raise SweepError(f"{where_}: {what} must be a mapping")
    return value  # type: ignore[return-value]


def _axes(doc: YamlMap, lines: dict[str, str]) -> tuple[list[tuple[str, ...]], list[list[tuple[tuple[str, Any], ...]]]]:
    """The axes of the sweep in the order the spec writes them: each a tuple of parameter names (one for a grid
    parameter, several for a zip group) and its settings (tuples of (name, value)). ``lines`` receives where
    each parameter is written."""
    names: list[str] = []
    axis_names: list[tuple[str, ...]] = []
    axes: list[list[tuple[tuple[str, Any], ...]]] = []

    def add_name(name: Any, at: str) -> None:
        if not isinstance(name, str) or not name:
            raise SweepError(f"{at}: parameter names are text, not {name!r}")
        if name in names:
            raise SweepError(f"{at}: parameter {name!r} is varied twice")
        names.append(name)
        lines[name] = at

    for key in [k for k in doc if k in ("grid", "zip")]:
        if key == "grid":
            grid = _need_map(doc["grid"] or {}, where(doc, "grid"), "grid")
            for name, values in grid.items():
                add_name(name, where(grid, name))
                if not isinstance(values, list) or not values:
                    raise SweepError(f"{where(grid, name)}: grid.{name} must be a non-empty list of values")
                axis_names.append((name,))
                axes.append([((name, _number(v)),) for v in values])
            continue
        groups = doc["zip"] or []
        for g in groups if isinstance(groups, list) else [groups]:
            g = _need_map(g, where(doc, "zip"), "each zip group")
            lengths = {len(v) if isinstance(v, list) else -1 for v in g.values()}
            if -1 in lengths or len(lengths) != 1 or 0 in lengths:
                raise SweepError(f"{where(doc, 'zip')}: a zip group needs non-empty lists of one length, one per "
                                 "parameter")  # fmt: skip
            for name in g:
                add_name(name, where(g, name))
            n = lengths.pop()
            axis_names.append(tuple(g))
            axes.append([tuple((name, _number(g[name][i])) for name in g) for i in range(n)])
    return axis_names, axes


def _programs(doc: YamlMap, base: Path) -> dict[str, Path]:
    raw = doc.get("programs")
    at = where(doc, "programs")
    if isinstance(raw, str):
        raw = [raw]
    if isinstance(raw, list):
        raw = {Path(str(p)).stem: p for p in raw}
    if not isinstance(raw, dict) or not raw:
        raise SweepError(f"{at}: programs must name one or more HLO files (a mapping name: path, or a list)")
    out = {}
    for name, path in raw.items():
        p = Path(str(path))
        p = p if p.is_absolute() else base / p
        here = where(raw, name) if isinstance(raw, YamlMap) else at
        if not p.is_file():
            raise SweepError(f"{here}: program {name!r}: no file {p}")
        try:  # (read now: an HLO error is the spec's, with the file's line and column, not every point's)
            load_module(p)
        except TpusimError as e:
            raise SweepError(f"{here}: program {name!r}: {e}") from None
        out[str(name)] = p
    return out


def _config_path(value: Any, base: Path) -> str:
    s = str(value)
    if s in PRESETS:
        return s
    p = Path(s)
    return str(p if p.is_absolute() else base / p)


def _digest(program: str, params: tuple[tuple[str, Any], ...], base: dict[str, Any]) -> str:
    text = json.dumps({"program": program, "params": [list(p) for p in params], "base": base}, sort_keys=True,
                      default=str)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def load_spec(path: str | Path) -> SweepSpec:
    """Read and check a sweep spec; every point's config is built here (errors name the spec's line)."""
    source = Path(path)
    text = read_text(source, "sweep spec")  # YAML it cannot read: a ConfigError naming file, line, column, key
    doc = load_yaml(source, text)
    doc = _need_map(doc, str(source), "a sweep spec")
    for key in doc:
        if key not in _TOP_KEYS:
            raise SweepError(f"{where(doc, key)}: unknown key {key!r}; a sweep spec has: {', '.join(_TOP_KEYS)}")
    base = source.resolve().parent
    programs = _programs(doc, base)
    lines: dict[str, str] = {}
    axis_names, axes = _axes(doc, lines)
    if len(programs) > 1 and not any("program" in a for a in axis_names):
        axis_names.insert(0, ("program",))
        axes.insert(0, [(("program", p),) for p in programs])
    set_map = _need_map(doc.get("set") or {}, where(doc, "set"), "set")
    base_set = {k: _number(v) for k, v in set_map.items()}
    for k in set_map:  # where a fixed setting is written, for errors about it
        lines.setdefault(str(k), where(set_map, k))
    for k in RUN_KEYS:
        if k in doc:
            lines.setdefault(k, where(doc, k))
    base_opts = dict(_need_map(doc.get("options") or {}, where(doc, "options"), "options"))
    for k in base_opts:
        if k not in OPTION_KEYS:
            raise SweepError(f"{where(doc.get('options'), k)}: unknown compile option {k!r}; options: "
                             f"{', '.join(OPTION_KEYS)}")  # fmt: skip
    try:  # (their values once, where they are written; a grid's are checked per point)
        CompileOptions(**base_opts)
    except TpusimError as e:
        raise SweepError(f"{where(doc, 'options')}: {e}") from None
    fixed = {
        "config": doc.get("config", "tpu_v5e"), "set": base_set, "options": base_opts,
        "timing_only": doc.get("timing_only", True), "seed": doc.get("seed", 0), "inputs": doc.get("inputs"),
    }  # fmt: skip
    count = 1
    for axis in axes:
        count *= len(axis)
    if count > MAX_POINTS:
        sizes = " x ".join(str(len(a)) for a in axes)
        raise SweepError(f"{source}: the spec expands to {count:,} points ({sizes}), more than {MAX_POINTS:,}; "
                         "split it into several sweeps")  # fmt: skip
    points = []
    # what the files hold, not only their names: a sweep resumed after its program, chip file or inputs were
    # edited must run the points again, not report the old rows (the digest also takes each point's config)
    contents = {name: _file_digest(path) for name, path in programs.items()}
    first: dict[str, Point] = {}
    for index, combo in enumerate(itertools.product(*axes)):
        params = tuple(kv for setting in combo for kv in setting)
        point = _point(index, params, programs, fixed, base, lines, contents)
        twin = first.setdefault(point.id, point)
        if twin is not point:  # (rows are matched to points by id: one of the two would never be reported)
            setting = shorten(", ".join(f"{k}={v}" for k, v in params), 200)
            raise SweepError(f"{source}: points {twin.index} and {index} are the same run ({setting}): a grid or "
                             "zip lists a value twice")  # fmt: skip
        points.append(point)
    for tiling in sorted({p.options.tiling for p in points}):  # each rule set read once, now, not per point
        try:
            load_tiling_rules(tiling)
        except TpusimError as e:
            raise SweepError(f"{lines.get('tiling', str(source))}: tiling {tiling!r}: {e}") from None
    objective = doc.get("objective", "seconds")
    maximise = False
    if isinstance(objective, dict):
        if len(objective) != 1 or next(iter(objective)) not in ("minimise", "maximise", "minimize", "maximize"):
            raise SweepError(f"{where(doc, 'objective')}: objective is a metric name, or {{minimise: m}} / "
                             "{maximise: m}")  # fmt: skip
        ((how, objective),) = objective.items()
        maximise = how.startswith("max")
    metrics = doc.get("metrics", list(DEFAULT_METRICS))
    if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
        raise SweepError(f"{where(doc, 'metrics')}: metrics must be a list of column names")
    # every column named must be one the results have: a metric, a cost, or a parameter of the grid
    columns = {*METRIC_COLUMNS, *COST_COLUMNS, *(n for a in axis_names for n in a)}
    cost = doc.get("cost", "mxu_macs")
    for key, names in (("objective", [objective]), ("cost", [cost]), ("metrics", metrics)):
        unknown = [str(n) for n in names if n not in columns]
        if unknown:
            raise SweepError(
                f"{where(doc, key)}: {', '.join(map(repr, unknown))} is not a column of the results; columns: "
                f"{', '.join(sorted(columns))}"
            )
    name = str(doc.get("name", source.stem))
    if not name or name in (".", "..") or Path(name).name != name or "\\" in name:
        raise SweepError(f"{where(doc, 'name')}: the name {name!r} names the output folder under reports/sweeps/: "
                         "give a plain name, no path")  # fmt: skip
    return SweepSpec(
        name=name, source=source, text=text, description=str(doc.get("description", "")),
        programs=programs, parameters=tuple(n for a in axis_names for n in a), axes=tuple(axis_names),
        points=tuple(points), objective=(str(objective), maximise),
        cost=str(cost), metrics=tuple(metrics),
    )  # fmt: skip


def _file_digest(path: str | Path) -> str:
    """A digest of the bytes of file ``path`` ("" when it cannot be read: running the point says why)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def _inputs_digest(contents: dict[str, str], inputs: str | None) -> str | None:
    """The digest of an inputs file, read once per spec (``contents`` keeps it under ``inputs:<path>``)."""
    if inputs is None:
        return None
    key = f"inputs:{inputs}"
    if key not in contents:
        contents[key] = _file_digest(inputs)
    return contents[key]


def _tiling_digest(contents: dict[str, str], tiling: str) -> str:
    """The digest of the texts of a tiling rule set's files (its ``extends`` chain), read once per spec: a sweep
    resumed after a rule file was edited runs its points again. "" when the rules cannot be read (the spec
    then says why)."""
    key = f"tiling:{tiling}"
    if key not in contents:
        try:
            texts = [text for _, text in tiling_sources(tiling)]
        except TpusimError:
            texts = []
        contents[key] = hashlib.sha256("\0".join(texts).encode()).hexdigest() if texts else ""
    return contents[key]


def _point(
    index: int, params: tuple[tuple[str, Any], ...], programs: dict[str, Path], fixed: dict[str, Any], base: Path,
    lines: dict[str, str], contents: dict[str, str],
) -> Point:  # fmt: skip
    values = dict(params)
    setting = shorten(", ".join(f"{k}={show_value(v) if isinstance(v, int) else v}" for k, v in params), 200)

    def at(culprit: str | None = None) -> str:
        line = lines.get(culprit or "", lines.get(params[0][0], "") if params else "")
        return f"{line or 'the spec'}: point {index} ({setting})"

    program = str(values.get("program", next(iter(programs))))
    if program not in programs:
        known = ", ".join(programs)
        raise SweepError(f"{at('program')}: program {program!r} is not one of the spec's programs ({known})")
    overrides = dict(fixed["set"])
    overrides.update({k: v for k, v in params if k not in OPTION_KEYS and k not in RUN_KEYS})
    try:
        config = load_config(_config_path(values.get("config", fixed["config"]), base), overrides=overrides)
        options = CompileOptions(**{**fixed["options"], **{k: v for k, v in params if k in OPTION_KEYS}})
    except (TpusimError, TypeError) as e:
        culprit = re.search(r"override '([^=']+)=", str(e))
        raise SweepError(f"{at(culprit.group(1) if culprit else None)}: {e}") from None
    inputs = values.get("inputs", fixed["inputs"])
    if inputs is not None:
        p = Path(str(inputs))
        inputs = str(p if p.is_absolute() else base / p)
    seed, timing_only = values.get("seed", fixed["seed"]), values.get("timing_only", fixed["timing_only"])
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise SweepError(f"{at('seed')}: seed must be a whole number from 0 to 2^64 - 1, not {show_value(seed)}")
    if not isinstance(timing_only, bool):
        raise SweepError(f"{at('timing_only')}: timing_only must be true or false, not {show_value(timing_only)}")
    identity = {"config": str(values.get("config", fixed["config"])), "set": overrides,
                "options": dataclasses.asdict(options), "seed": seed, "inputs": values.get("inputs", fixed["inputs"]),
                "timing_only": timing_only, "program_bytes": contents[program], "chip": repr(config),
                "inputs_bytes": _inputs_digest(contents, inputs),
                "tiling_bytes": _tiling_digest(contents, options.tiling)}  # fmt: skip
    return Point(index, _digest(program, params, identity), program, params, config, options, seed, inputs, timing_only)
