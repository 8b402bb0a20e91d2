"""The chips of a system on their ICI grid: coordinates, wraparound links, dimension-order routes; several
slices of that grid joined by the data-center network (DCN).

Shared by the compiler (collectives are planned onto rings of the grid) and the devices (a remote DMA
crosses the links of its route), so it imports neither.

Chip ids are row-major positions in ``shape`` (``chip = ravel(coords)``). Axis ``a`` has wraparound links
when ``wrap[a]`` (a ring); otherwise it is a line. A transfer follows dimension-order routing: it corrects
the axes in ``order``, each in the shorter direction around a ring (forward on a tie) or straight along a
line. Each directed link ``(chip it leaves, axis, +1 or -1)`` is one flow resource in the device model.

A *switched* axis (the slices of a multi-slice system, joined by DCN) has no links between neighbours: a
chip reaches the chip at its own place in any other slice in one crossing of the network, leaving through
its egress ``(chip, axis, +1)`` and arriving through the other chip's ingress ``(other, axis, -1)``.

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
    from tpusim.config import ChipConfig

__all__ = ["Link", "Topology", "parse_topology", "system_topology"]

Link = tuple[int, int, int]
"""A directed link: (chip it leaves, axis, +1 or -1)."""


class Topology:
    """Chips on a ``shape`` grid; ``wrap`` per axis (or one flag for all); routes in axis ``order``;
    ``switched`` axes (at most the first: the slices) joined by the data-center network."""

    __slots__ = ("_crossings", "_routes", "order", "shape", "strides", "switched", "wrap")

    def __init__(
        self,
        shape: tuple[int, ...],
        wrap: bool | tuple[bool, ...],
        order: tuple[int, ...] | None = None,
        switched: tuple[bool, ...] | None = None,
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
        self.switched = tuple(switched) if switched is not None else (False,) * len(self.shape)
        if len(self.switched) != len(self.shape) or any(self.switched[1:]):
            raise ConfigError(f"only the first axis of {list(self.shape)} may be the slices joined by DCN")
        self.strides = tuple(prod(self.shape[a + 1 :]) for a in range(len(self.shape)))
        self._routes: dict[tuple[int, int, tuple[int, ...] | None, int], tuple[Link, ...]] = {}  # (asked often)
        self._crossings: dict[tuple[int, int], tuple[int, int]] = {}

    @property
    def chips(self) -> int:
        return prod(self.shape)

    @property
    def slices(self) -> int:
        """Slices joined by DCN (1: a single slice)."""
        return self.shape[0] if self.switched[0] else 1

    @property
    def slice_shape(self) -> tuple[int, ...]:
        """The ICI grid of one slice."""
        return self.shape[1:] if self.switched[0] else self.shape

    def __str__(self) -> str:
        text = "x".join(map(str, self.slice_shape))
        lead = 1 if self.switched[0] else 0  # (axes numbered within a slice)
        rings = [str(a - lead) for a, w in enumerate(self.wrap) if w and not self.switched[a]]
        if rings:
            text += f" (axis {', '.join(rings)} wrap{'s' if len(rings) == 1 else ''})"
        if self.slices > 1:
            text = f"{self.slices} slices of {text} joined by DCN"
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

    def route(self, src: int, dst: int, order: tuple[int, ...] | None = None, tie: int = 1) -> list[Link]:
        """The directed links a transfer from ``src`` to ``dst`` crosses, in order, correcting the axes in
        ``order`` (default: the topology's routing order), going round a ring the ``tie`` way (+1 forward, -1
        backward) where both ways are as short.

        Raises:
            ValueError: ``order`` is not a permutation of the axes.
        """
        known = self._routes.get((src, dst, order, tie))
        if known is None:
            if order is not None and sorted(order) != list(range(len(self.shape))):
                raise ValueError(f"route order {list(order)} is not an order of the {len(self.shape)} axes")
            known = self._routes[(src, dst, order, tie)] = tuple(self._route(src, dst, order or self.order, tie))
        return list(known)

    def _route(self, src: int, dst: int, order: tuple[int, ...], tie: int) -> list[Link]:
        here = list(self.coords(src))
        goal = self.coords(dst)
        links: list[Link] = []
        for axis in order:
            n = self.shape[axis]
            if self.switched[axis]:  # one crossing of the network: out of this chip, into the other slice's
                if goal[axis] != here[axis]:
                    links.append((self.chip(tuple(here)), axis, 1))
                    here[axis] = goal[axis]
                    links.append((self.chip(tuple(here)), axis, -1))
                continue
            if self.wrap[axis]:
                fwd = (goal[axis] - here[axis]) % n
                forward = fwd < n - fwd or (fwd == n - fwd and tie > 0)
                step, count = (1, fwd) if forward else (-1, n - fwd)
            else:
                delta = goal[axis] - here[axis]
                step, count = (1 if delta >= 0 else -1), abs(delta)
            for _ in range(count):
                links.append((self.chip(tuple(here)), axis, step))
                here[axis] = (here[axis] + step) % n
        return links

    def crossings(self, src: int, dst: int) -> tuple[int, int]:
        """``(ICI hops, DCN crossings)`` of a transfer from ``src`` to ``dst``."""
        known = self._crossings.get((src, dst))
        if known is None:
            route = self.route(src, dst) if src != dst else []
            dcn = sum(1 for _, axis, step in route if self.switched[axis] and step > 0)
            known = self._crossings[(src, dst)] = (len(route) - 2 * dcn, dcn)
        return known

    def is_dcn(self, link: Link) -> bool:
        """Whether ``link`` is a chip's DCN egress (+1) or ingress (-1) rather than an ICI link."""
        return self.switched[link[1]]

    def link_name(self, link: Link) -> str:
        """``chip3.ici1+`` (an ICI link: chip it leaves, axis within the slice, direction) or ``chip3.dcn_out`` /
        ``chip3.dcn_in`` (the chip's DCN egress and ingress)."""
        chip, axis, step = link
        if self.switched[axis]:
            return f"chip{chip}.dcn_{'out' if step > 0 else 'in'}"
        axis -= 1 if self.switched[0] else 0  # (axes numbered within a slice)
        return f"chip{chip}.ici{axis}{'+' if step > 0 else '-'}"

    def links(self) -> list[Link]:
        """Every directed link of the grid, by chip, axis and direction (a switched axis: each chip's DCN
        egress and ingress)."""
        out: list[Link] = []
        for chip in range(self.chips):
            for axis in range(len(self.shape)):
                for step in (1, -1):
                    if self.shape[axis] > 1 and (self.switched[axis] or self.neighbor(chip, axis, step) is not None):
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


def system_topology(cfg: ChipConfig, chips: int | None = None, shape: tuple[int, ...] | None = None) -> Topology:
    """The topology of a run: ``dcn.slices`` slices (joined by DCN along a leading axis when more than one),
    each the ICI grid ``shape`` (or the config's ``ici.shape``, or the one chosen for its share of
    ``chips``), with the config's wraparound rule and routing order. ``chips`` counts all slices' chips.

    Raises:
        ConfigError: the slices do not hold ``chips`` chips, or a slice is not one the chip builds.
    """
    ici, slices = cfg.ici, cfg.dcn.slices
    if shape is None:
        shape = ici.shape
    if shape is None:
        if chips is None:
            raise ConfigError("a system needs a chip count or a shape")
        if chips % slices:
            raise ConfigError(f"{chips} chips do not split into dcn.slices = {slices} equal slices")
        shape = ici.default_shape(chips // slices)
    shape = tuple(shape)
    held = prod(shape) * slices
    if chips is not None and held != chips:
        grid = "x".join(map(str, shape))
        what = f"{slices} slices of {grid}" if slices > 1 else f"topology {grid}"
        raise ConfigError(f"{what} hold{'s' if slices == 1 else ''} {held} chips, not the {chips} chips of the run")
    problem = ici.shape_problem(shape)
    if problem is not None:
        raise ConfigError(f"topology {'x'.join(map(str, shape))}: {problem}")
    wraps, order = ici.wraps(shape), ici.routing_order(len(shape))
    if slices == 1:
        return Topology(shape, wraps, order)
    # the slices: a ring over the network from three on (every chip reaches every slice), a pair otherwise
    return Topology(
        (slices, *shape), (slices >= 3, *wraps), (0, *(a + 1 for a in order)), (True, *(False,) * len(shape))
    )
