"""Tiling rule sets: which tiled layout an array gets when the HLO text leaves it untiled.

A rule set is a YAML file under ``configs/tiling/`` (see ``tpu_default.yaml`` for the format and the
sources of each rule). Rules are tried in order and the first whose conditions all hold gives the tiles
(and, optionally, ``E(n)``). ``extends: NAME`` puts another rule set's rules after this file's own.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tpusim.config import CONFIG_DIR
from tpusim.errors import ConfigError, LayoutError
from tpusim.memory import Layout, Shape, Tile
from tpusim.memory.shape_text import ShapeReader
from tpusim.yamlio import YamlMap, load_yaml, read_text, where

__all__ = ["TILING_DIR", "Range", "TilingRule", "TilingRules", "load_tiling_rules", "tiling_sources"]

TILING_DIR = CONFIG_DIR / "tiling"

_RANGE = re.compile(r"^\s*(?:(<=|>=|<|>|==)?\s*(\d+)|(\d+)\s*\.\.\s*(\d+))\s*$")
_CONDITIONS = ("element_type", "bits", "rank", "minor", "second_minor")
_RESULTS = ("tiles", "element_size_bits")


@dataclass(frozen=True, slots=True)
class Range:
    """An inclusive integer range ``lo..hi`` (``hi`` None: unbounded)."""

    lo: int
    hi: int | None

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and value >= self.lo and (self.hi is None or value <= self.hi)

    @staticmethod
    def parse(value: object, at: str, key: str) -> Range:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{at}: '{key}' must be a number or a string like '<=4', '>=2', '1..8', not {value!r}")
        if isinstance(value, int):
            return Range(value, value)
        m = _RANGE.match(value)
        if not m:
            raise ConfigError(f"{at}: '{key}: {value}' is not a number or a range like '<=4', '>=2', '1..8'")
        if m.group(3) is not None:
            return Range(int(m.group(3)), int(m.group(4)))
        op, n = m.group(1) or "==", int(m.group(2))
        return {
            "==": Range(n, n),
            "<=": Range(0, n),
            "<": Range(0, n - 1),
            ">=": Range(n, None),
            ">": Range(n + 1, None),
        }[op]


@dataclass(frozen=True, slots=True)
class TilingRule:
    element_types: frozenset[str] | None
    bits: Range | None
    rank: Range | None
    minor: Range | None
    second_minor: Range | None
    tiles: tuple[Tile, ...]
    element_size_bits: int
    where: str

    def matches(self, shape: Shape, physical_dims: tuple[int, ...]) -> bool:
        et = shape.element_type
        minor = physical_dims[-1] if physical_dims else None
        second = physical_dims[-2] if len(physical_dims) >= 2 else None
        return (
            (self.element_types is None or et.name in self.element_types)
            and (self.bits is None or et.bits in self.bits)
            and (self.rank is None or shape.rank in self.rank)
            and (self.minor is None or minor in self.minor)
            and (self.second_minor is None or second in self.second_minor)
        )


@dataclass(frozen=True, slots=True)
class TilingRules:
    """An ordered rule set. ``layout_for`` gives the layout of one array shape."""

    name: str
    rules: tuple[TilingRule, ...]

    def layout_for(self, shape: Shape, minor_to_major: tuple[int, ...] | None = None) -> Layout:
        """The layout for ``shape``: its ``minor_to_major`` (or the given one, or the default) with the
        tiles of the first matching rule. Tokens and arrays no rule matches stay untiled.

        Raises:
            ConfigError: the matching rule's ``element_size_bits`` is narrower than the array's element type
                (naming the rule's file and line, and the array)."""
        base = shape.layout or Layout.default(shape.rank)
        if minor_to_major is not None:
            base = replace(base, minor_to_major=minor_to_major)
        if shape.element_type.kind == "token":
            return base
        physical = tuple(shape.dimensions[d] for d in reversed(base.minor_to_major))
        for rule in self.rules:
            if rule.matches(shape, physical):
                if 0 < rule.element_size_bits < shape.element_type.bits:
                    raise ConfigError(
                        f"{rule.where}: element_size_bits {rule.element_size_bits} is narrower than the "
                        f"{shape.element_type.bits} bits of {shape.element_type} ({shape}, which this rule matches); "
                        "add an element_type or bits condition"
                    )
                return replace(base, tiles=rule.tiles, element_size_bits=rule.element_size_bits)
        return base


_FACTOR = re.compile(r"^(\d*)([SL]?)$")


def _substitute(text: str, at: str, sublanes: int, lanes: int) -> str:
    """Replace the symbols S (sublanes) and L (lanes) in a tiles string by the chip's numbers."""

    def entry(m: re.Match[str]) -> str:
        value = 1
        for factor in m.group(0).split("*"):
            f = _FACTOR.match(factor.strip())
            if f is None or not (f.group(1) or f.group(2)):
                raise ConfigError(f"{at}: tile entry {m.group(0)!r} is not a number, S, L or a product like 2L, S*L")
            value *= int(f.group(1) or 1) * {"S": sublanes, "L": lanes, "": 1}[f.group(2)]
        return str(value)

    return re.sub(r"[^(),\s]+", lambda m: m.group(0) if m.group(0) == "*" else entry(m), text)


def _symbols(value: object, at: str, sublanes: int, lanes: int) -> object:
    """Numbers in a condition may be written with S and L too (``minor: "<=L"``)."""
    if not isinstance(value, str):
        return value
    return re.sub(r"\d*[SL](?:\*\d*[SL])*", lambda m: _substitute(f"({m.group(0)})", at, sublanes, lanes)[1:-1], value)


def _parse_tiles(text: object, at: str, sublanes: int, lanes: int) -> tuple[Tile, ...]:
    if not isinstance(text, str) or not text.strip().startswith("("):
        raise ConfigError(f'{at}: \'tiles\' must be a string such as "(S,L)(2,1)" or "(8,128)", not {text!r}')
    text = _substitute(text, at, sublanes, lanes)
    rank = max(len(part.split(",")) for part in text.split(")") if part.strip())
    reader = ShapeReader("{" + ",".join(str(i) for i in range(rank - 1, -1, -1)) + ":T" + text.strip() + "}")
    try:
        layout = reader.read_layout(rank)
    except LayoutError as err:
        raise ConfigError(f"{at}: bad tiles {text!r}: {err.message}") from None
    if not layout.tiles or any(not t.dimensions for t in layout.tiles):
        raise ConfigError(f"{at}: bad tiles {text!r}: a tile needs at least one dimension")
    return layout.tiles


def _parse_rule(entry: object, at: str, sublanes: int, lanes: int) -> TilingRule:
    if not isinstance(entry, YamlMap):
        raise ConfigError(f"{at}: a rule must be a mapping of conditions and results, not {entry!r}")
    unknown = set(entry) - set(_CONDITIONS) - set(_RESULTS)
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(
            f"{where(entry, key)}: unknown key '{key}' in a tiling rule "
            f"(conditions: {', '.join(_CONDITIONS)}; results: {', '.join(_RESULTS)})"
        )
    if "tiles" not in entry:
        raise ConfigError(f"{where(entry)}: a tiling rule needs 'tiles'")
    types = entry.get("element_type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"{where(entry, 'element_type')}: 'element_type' must be a name or a list of names")
        from tpusim.memory import ELEMENT_TYPES

        for n in names:
            if n not in ELEMENT_TYPES:
                raise ConfigError(f"{where(entry, 'element_type')}: unknown element type '{n}'")
        types = frozenset(names)
    ranges = {
        k: Range.parse(_symbols(entry[k], where(entry, k), sublanes, lanes), where(entry, k), k) if k in entry else None
        for k in _CONDITIONS[1:]
    }
    size = entry.get("element_size_bits", 0)
    if isinstance(size, bool) or not isinstance(size, int) or size not in _ELEMENT_SIZES:
        raise ConfigError(
            f"{where(entry, 'element_size_bits')}: 'element_size_bits' must be 0 (the type's own) or one of "
            f"{', '.join(map(str, _ELEMENT_SIZES[1:]))}, not {size!r}"
        )
    return TilingRule(
        element_types=types,
        tiles=_parse_tiles(entry["tiles"], where(entry, "tiles"), sublanes, lanes),
        element_size_bits=size,
        where=where(entry),
        **ranges,  # type: ignore[arg-type]
    )


_ELEMENT_SIZES = (0, 1, 2, 4, 8, 16, 32, 64)
"""Element sizes a layout's ``E(n)`` may give (0: the element type's own)."""


def load_tiling_rules(
    name_or_path: str | Path, *, sublanes: int = 8, lanes: int = 128, _seen: tuple[Path, ...] = ()
) -> TilingRules:
    """Load a rule set by name (a file in ``configs/tiling/``) or by path, for a chip whose vector registers
    have ``sublanes`` x ``lanes`` 32-bit words (the values of the symbols S and L in tile sizes). ``extends``
    names another rule set, or a path relative to the file that names it.

    A rule set is parsed once per process while its files' texts stay the same (a sweep compiles every point
    with the same rules; an edited file is read again)."""
    rules, _ = _load(name_or_path, sublanes, lanes, _seen)
    return rules


def tiling_sources(name_or_path: str | Path) -> tuple[tuple[Path, str], ...]:
    """The (path, text) of every file the rule set is read from, itself first, then its ``extends`` chain.

    Raises:
        ConfigError: as :func:`load_tiling_rules`.
    """
    _, files = _load(name_or_path, 8, 128, ())
    return files


_LOADED: dict[tuple[Any, ...], tuple[TilingRules, tuple[tuple[Path, str], ...]]] = {}
"""Rule sets by (path, sublanes, lanes, extends chain): each with the texts of the files it was read from."""


def _unchanged(files: tuple[tuple[Path, str], ...]) -> bool:
    try:
        return all(read_text(path) == text for path, text in files)
    except (OSError, ConfigError):
        return False


def _load(
    name_or_path: str | Path, sublanes: int, lanes: int, _seen: tuple[Path, ...]
) -> tuple[TilingRules, tuple[tuple[Path, str], ...]]:
    """The rule set and the (path, text) of every file it was read from."""
    path, text = Path(name_or_path), str(name_or_path)
    shipped = TILING_DIR / f"{text}.yaml"
    # A name without a suffix or a folder is a shipped rule set's, unless only a file of that name exists.
    if not path.suffix and "/" not in text and os.sep not in text and (shipped.exists() or not path.is_file()):
        path = shipped
        if not path.exists():
            known = ", ".join(sorted(p.stem for p in TILING_DIR.glob("*.yaml")))
            raise ConfigError(f"unknown tiling rule set '{name_or_path}' (known: {known}, or give a path)")
    key = (path.resolve(), sublanes, lanes, _seen)
    hit = _LOADED.get(key)
    if hit is not None and _unchanged(hit[1]):
        return hit
    source = read_text(path)
    files: tuple[tuple[Path, str], ...] = ((path, source),)
    doc = load_yaml(path, source)
    if not isinstance(doc, YamlMap):
        raise ConfigError(f"{path}: a tiling rule set is a mapping with 'name' and 'rules'")
    unknown = set(doc) - {"name", "extends", "rules"}
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"{where(doc, key)}: unknown key '{key}' (expected name, extends, rules)")
    rules_list = doc.get("rules")
    if not isinstance(rules_list, list) or not rules_list:
        raise ConfigError(f"{where(doc, 'rules')}: 'rules' must be a non-empty list")
    rules = [_parse_rule(r, f"{where(doc, 'rules')} (rule {i + 1})", sublanes, lanes) for i, r in enumerate(rules_list)]
    name = str(doc.get("name", path.stem))
    parent = doc.get("extends")
    if parent is not None:
        named = Path(str(parent))
        if not named.suffix:  # a shipped rule set's name
            target = TILING_DIR / f"{parent}.yaml"
        elif named.is_absolute() or not (path.parent / named).exists():
            target = named  # (absolute, or relative to the working folder)
        else:
            target = path.parent / named  # relative to the file that names it
        chain = (*_seen, path.resolve())
        if target.resolve() in chain:
            raise ConfigError(f"{where(doc, 'extends')}: rule set '{name}' extends itself through '{parent}'")
        try:
            inherited, more = _load(str(target) if named.suffix else str(parent), sublanes, lanes, chain)
        except ConfigError as err:
            raise ConfigError(f"{where(doc, 'extends')}: extends '{parent}': {err}") from None
        rules += list(inherited.rules)
        files += more
    if len(_LOADED) >= 32:
        _LOADED.clear()
    _LOADED[key] = (TilingRules(name, tuple(rules)), files)
    return _LOADED[key]
