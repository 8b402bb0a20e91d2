"""Which keys of a chip config a compilation read: what a compiled program may be reused for.

Two configs that agree on every key a compilation of a program read compile it to the same program: the
compiler is a function of the module, the options and the values it reads. :func:`recorded_reads` records
those keys while a compilation runs, by watching attribute reads on the config's sections (every instance
of their classes is watched, and a read counts for the section objects of the config being recorded).
Properties and methods count through the fields they read. A sweep then compiles once per distinct set of
those values (:mod:`tpusim.sweep.point`): points that change only ``hbm.latency_ns`` reuse the program.

``tests/test_config_reads.py`` checks the record against the compiler itself: changing any key outside it
leaves the compiled program identical.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tpusim.config import ChipConfig

__all__ = ["Path", "read_values", "recorded_reads"]

Path = tuple[str, ...]
"""A key of a config as attribute names from the chip, ``("hbm", "bandwidth_bytes_per_s")``."""


def _sections(config: ChipConfig) -> dict[int, tuple[Path, Any]]:
    """Every dataclass object of the config tree by id: its path and the object."""
    out: dict[int, tuple[Path, Any]] = {}

    def walk(obj: Any, path: Path) -> None:
        out[id(obj)] = (path, obj)
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                walk(value, (*path, f.name))

    walk(config, ())
    return out


@contextmanager
def recorded_reads(config: ChipConfig) -> Iterator[set[Path]]:
    """Inside the block, every data field of ``config`` (a leaf: not a section, not a method) read through
    attribute access is added to the yielded set. Not thread-safe: the watch is on the section classes."""
    sections = _sections(config)
    classes = {type(obj) for _, obj in sections.values()}
    leaves = {  # per section object: its fields that are data, not sections
        key: frozenset(f.name for f in dataclasses.fields(obj) if id(getattr(obj, f.name)) not in sections)
        for key, (_, obj) in sections.items()
    }
    reads: set[Path] = set()
    get = object.__getattribute__

    def watched(self: Any, name: str) -> Any:
        value = get(self, name)
        at = sections.get(id(self))
        if at is not None and at[1] is self and name in leaves[id(self)]:
            reads.add((*at[0], name))
        return value

    saved = {cls: cls.__dict__.get("__getattribute__") for cls in classes}
    for cls in classes:
        cls.__getattribute__ = watched  # type: ignore[method-assign,assignment]
    try:
        yield reads
    finally:
        for cls, before in saved.items():
            if before is None:
                delattr(cls, "__getattribute__")
            else:
                cls.__getattribute__ = before  # type: ignore[method-assign]


def read_values(config: ChipConfig, paths: frozenset[Path]) -> tuple[tuple[Path, Any], ...]:
    """The values of ``paths`` in ``config``, in a canonical order: what a compilation that read them
    depends on."""
    out = []
    for path in sorted(paths):
        value: Any = config
        for name in path:
            value = getattr(value, name)
        out.append((path, value))
    return tuple(out)
