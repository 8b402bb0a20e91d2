"""The inter-chip interconnect: chips on a ring, mesh or torus, and the links a remote DMA crosses.

Chip ids are row-major positions in the system's shape (``chip = ravel(coords)``). A transfer follows
dimension-order routing: it corrects the most major axis first, each axis in the shorter direction
around the ring (forward on a tie; a mesh has no wraparound). Each directed link is one flow resource of
``ici.link_bandwidth_bytes_per_s`` (per direction) shared fairly by the transfers crossing it; every hop adds
``ici.hop_latency_ns``. The multi-chip work builds collectives on these remote DMAs.
"""

from __future__ import annotations

from math import prod

from tpusim.errors import ConfigError

__all__ = ["Link", "Topology"]

Link = tuple[int, int, int]  # (chip the link leaves, axis, +1 or -1)


class Topology:
    """Chips on a ``shape`` grid with (``wrap``) or without wraparound links."""

    __slots__ = ("shape", "wrap")

    def __init__(self, shape: tuple[int, ...], wrap: bool) -> None:
        if not shape or any(n < 1 for n in shape):
            raise ConfigError(f"a system shape needs positive sizes, not {shape}")
        self.shape = tuple(shape)
        self.wrap = wrap

    @property
    def chips(self) -> int:
        return prod(self.shape)

    def coords(self, chip: int) -> tuple[int, ...]:
        out = []
        for n in reversed(self.shape):
            out.append(chip % n)
            chip //= n
        return tuple(reversed(out))

    def chip(self, coords: tuple[int, ...]) -> int:
        c = 0
        for x, n in zip(coords, self.shape):
            c = c * n + x
        return c

    def route(self, src: int, dst: int) -> list[Link]:
        """The directed links a transfer from ``src`` to ``dst`` crosses, in order."""
        here = list(self.coords(src))
        goal = self.coords(dst)
        links: list[Link] = []
        for axis, n in enumerate(self.shape):
            fwd = (goal[axis] - here[axis]) % n
            if self.wrap:
                step, count = (1, fwd) if fwd <= n - fwd else (-1, n - fwd)
            else:
                delta = goal[axis] - here[axis]
                step, count = (1 if delta >= 0 else -1), abs(delta)
            for _ in range(count):
                links.append((self.chip(tuple(here)), axis, step))
                here[axis] = (here[axis] + step) % n
        return links
