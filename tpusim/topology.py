"""The chips of a system on their ICI grid: coordinates, wraparound links, dimension-order routes.

Shared by the compiler (collectives are planned onto rings of the grid) and the devices (a remote DMA
crosses the links of its route), so it imports neither.

Chip ids are row-major positions in ``shape`` (``chip = ravel(coords)``). Axis ``a`` has wraparound links
when ``wrap[a]`` (a ring); otherwise it is a line. A transfer follows dimension-order routing: it corrects
the axes in ``order``, each in the shorter direction around a ring (forward on a tie) or straight along a
line. Each directed link ``(chip it leaves, axis, +1 or -1)`` is one flow resource in the device model.

    >>> t = Topology((2, 4), wrap=(False, True))
    >>> t.coords(6), t.route(0, 7)
    ((1, 2), [(0, 0, 1), (4, 1, -1)])
    >>> parse_topology("2x4"), str(t)
    ((2, 4), '2x4 (axis 1 wraps)')
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING

from tpusim.errors import ConfigError

if TYPE_CHECKING:
    from tpusim.config import IciConfig

__all__ = ["Link", "Topology", "parse_topology", "system_topology"]

Link = tuple[int, int, int]
"""A directed link: (chip it leaves, axis, +1 or -1)."""


class Topology:
    """Chips on a ``shape`` grid; ``wrap`` per axis (or one flag for all); routes in axis ``order``."""

    __slots__ = ("_routes", "order", "shape", "strides", "wrap")

    def __init__(
        self, shape: tuple[int, ...], wrap: bool | tuple[bool, ...], order: tuple[int, ...] | None = None
    ) -> None:
        if not shape or any(n < 1 for n in shape):
            raise ConfigError(f"a system shape needs positive sizes, not {list(shape)}")
        self.shape = tuple(int(n) for n in shape)
        wraps = (wrap,) * len(self.shape) if isinstance(wrap, bool) else tuple(wrap)
        if len(wraps) != len(self.shape):
            raise ConfigError(f"wraparound {list(wraps)} does not give one flag per axis of {list(self.shape)}")
        self.wrap = wraps
        self.order = tuple(order) if order is not None else tuple(range(len(self.shape)))
        if sorted(self.order) != list(range(len(self.shape))):
            raise ConfigError(f"routing order {list(self.order)} is not a permutation of the axes of {self.shape}")
        self.strides = tuple(prod(self.shape[a + 1 :]) for a in range(len(self.shape)))
        self._routes: dict[tuple[int, int], tuple[Link, ...]] = {}  # (a 256-chip collective asks each often)

    @property
    def chips(self) -> int:
        return prod(self.shape)

    def __str__(self) -> str:
        text = "x".join(map(str, self.shape))
        rings = [str(a) for a, w in enumerate(self.wrap) if w]
        if rings:
            text += f" (axis {', '.join(rings)} wrap{'s' if len(rings) == 1 else ''})"
        return text

    def coords(self, chip: int) -> tuple[int, ...]:
        return tuple((chip // s) % n for s, n in zip(self.strides, self.shape))

    def chip(self, coords: tuple[int, ...]) -> int:
        return sum(c * s for c, s in zip(coords, self.strides))

    def neighbor(self, chip: int, axis: int, step: int) -> int | None:
        """The chip one link away along ``axis`` in direction ``step`` (None past the end of a line)."""
        c = list(self.coords(chip))
        n = self.shape[axis]
        x = c[axis] + step
        if not 0 <= x < n:
            if not self.wrap[axis]:
                return None
            x %= n
        c[axis] = x
        return self.chip(tuple(c))

    def route(self, src: int, dst: int) -> list[Link]:
        """The directed links a transfer from ``src`` to ``dst`` crosses, in order."""
        known = self._routes.get((src, dst))
        if known is None:
            known = self._routes[(src, dst)] = tuple(self._route(src, dst))
        return list(known)

    def _route(self, src: int, dst: int) -> list[Link]:
        here = list(self.coords(src))
        goal = self.coords(dst)
        links: list[Link] = []
        for axis in self.order:
            n = self.shape[axis]
            if self.wrap[axis]:
                fwd = (goal[axis] - here[axis]) % n
                step, count = (1, fwd) if fwd <= n - fwd else (-1, n - fwd)
            else:
                delta = goal[axis] - here[axis]
                step, count = (1 if delta >= 0 else -1), abs(delta)
            for _ in range(count):
                links.append((self.chip(tuple(here)), axis, step))
                here[axis] = (here[axis] + step) % n
        return links

    def hops(self, src: int, dst: int) -> int:
        return len(self.route(src, dst))

    def links(self) -> list[Link]:
        """Every directed link of the grid, by chip, axis and direction."""
        out: list[Link] = []
        for chip in range(self.chips):
            for axis in range(len(self.shape)):
                for step in (1, -1):
                    if self.shape[axis] > 1 and self.neighbor(chip, axis, step) is not None:
                        out.append((chip, axis, step))
        return out


def parse_topology(text: str) -> tuple[int, ...]:
    """``"2x4"`` (or ``"2,4"``, ``"8"``) -> ``(2, 4)``."""
    parts = text.replace(",", "x").lower().split("x")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"topology {text!r} must look like 8, 2x4 or 4x4x4 (chips per axis)") from None
    if any(n < 1 for n in shape):
        raise ConfigError(f"topology {text!r} needs positive chips per axis")
    return shape


def system_topology(ici: IciConfig, chips: int | None = None, shape: tuple[int, ...] | None = None) -> Topology:
    """The topology of a run: ``shape`` (or the config's ``ici.shape``, or one chosen for ``chips``), with
    the config's wraparound rule and routing order.

    Raises:
        ConfigError: the shape does not hold ``chips`` chips, or is not a slice the chip builds.
    """
    if shape is None:
        shape = ici.shape
    if shape is None:
        if chips is None:
            raise ConfigError("a system needs a chip count or a shape")
        shape = ici.default_shape(chips)
    shape = tuple(shape)
    if chips is not None and prod(shape) != chips:
        raise ConfigError(
            f"topology {'x'.join(map(str, shape))} holds {prod(shape)} chips, not the {chips} chips of the run"
        )
    problem = ici.shape_problem(shape)
    if problem is not None:
        raise ConfigError(f"topology {'x'.join(map(str, shape))}: {problem}")
    return Topology(shape, ici.wraps(shape), ici.routing_order(len(shape)))
