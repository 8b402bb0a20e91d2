"""Collective timing against the standard cost model of rings and tori, on the shipped chip configs.

Model (docs/multichip.md): a bidirectional ring of ``n`` chips whose links carry ``W`` bytes/s in both
directions together (twice ``ici.link_bandwidth_bytes_per_s``) all-gathers or reduce-scatters ``V`` bytes (the
whole array) in ``(n-1)/n * V/W`` plus ``n - 1`` steps of latency, and all-reduces (one of each) in twice
that. A line (no wraparound) carries each step's data over one link per direction instead of two: twice
the bandwidth term. A torus runs one ring per axis, each on the data the previous axes left.

The latency of one step is what the model's transfers cost beyond their bytes: an all-gather step is one
push (``dma.setup_cycles`` + ``ici.hop_latency_ns`` per hop + ``hbm.latency_ns``, as it lands in HBM); a
reduce-scatter step also loads the received block into VMEM first (another setup and HBM latency). A ring
walked in zigzag along a line takes two hops per step. One more hop goes to the entry handshake.
"""

from __future__ import annotations

from math import prod

import pytest

import tpusim
from tpusim.config import ChipConfig, load_config

SUM = "sum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n"
MIB = 2**20


def _program(kind: str, nbytes: int, chips: int) -> str:
    cols = 1024
    while cols > 128 and nbytes // (4 * cols) < 8 * chips:  # f32[rows, cols]: whole (8,128) tiles per chip
        cols //= 2
    rows = nbytes // (4 * cols)
    head = f"HloModule {kind}, replica_count={chips}\n"
    if kind == "all-reduce":
        body = (f"x = f32[{rows},{cols}] parameter(0)\n  ROOT r = f32[{rows},{cols}] all-reduce(x), "
                "replica_groups={}, to_apply=sum")  # fmt: skip
    elif kind == "all-gather":
        body = (f"x = f32[{rows // chips},{cols}] parameter(0)\n  ROOT r = f32[{rows},{cols}] all-gather(x), "
                "replica_groups={}, dimensions={0}")  # fmt: skip
    else:
        body = (f"x = f32[{rows},{cols}] parameter(0)\n  ROOT r = f32[{rows // chips},{cols}] reduce-scatter(x), "
                "replica_groups={}, dimensions={0}, to_apply=sum")  # fmt: skip
    return head + SUM + f"ENTRY main {{\n  {body}\n}}\n"


def _seconds(kind: str, nbytes: int, config: ChipConfig, shape: tuple[int, ...]) -> float:
    result = tpusim.simulate(
        _program(kind, nbytes, prod(shape)), chips=prod(shape), topology=shape, config=config, timing_only=True
    )
    return result.seconds


def model_seconds(kind: str, nbytes: int, config: ChipConfig, shape: tuple[int, ...]) -> float:
    """The cost model of the module docstring for a collective over every chip of ``shape``."""
    wraps = config.ici.wraps(shape)
    clock = config.clock_hz
    setup = config.dma.setup_cycles / clock
    hop, hbm = config.ici.hop_latency_ns * 1e-9, config.hbm.latency_ns * 1e-9
    w = 2 * config.ici.link_bandwidth_bytes_per_s
    total, data = 0.0, float(nbytes)
    for n, ring in zip(shape, wraps):
        if n == 1:
            continue
        hops = 1 if ring or n <= 3 else 2
        bandwidth = (n - 1) / n * data / (w if ring else w / 2)
        gather = setup + hops * hop + hbm
        scatter = gather + setup + hbm
        if kind == "all-gather":
            total += bandwidth + (n - 1) * gather
        elif kind == "reduce-scatter":
            total += bandwidth + (n - 1) * scatter
        else:
            total += 2 * bandwidth + (n - 1) * (gather + scatter)
        data /= n
    return total + hop


@pytest.mark.parametrize(
    ("chip", "kind", "shape"),
    [
        ("tpu_v5e", "all-gather", (16,)),
        ("tpu_v5e", "reduce-scatter", (16,)),
        ("tpu_v5e", "all-reduce", (16,)),
        ("tpu_v6e", "all-reduce", (16,)),
        ("tpu_v4", "all-reduce", (8,)),
        ("tpu_v4", "all-reduce", (4, 4)),
        ("tpu_v5p", "all-gather", (4, 2)),
    ],
)
def test_bandwidth_bound_collectives_follow_the_ring_model(chip: str, kind: str, shape: tuple[int, ...]) -> None:
    """64 MiB: the bandwidth term dominates; the simulated time is within 10% of the model."""
    cfg = load_config(chip)
    got, want = _seconds(kind, 64 * MIB, cfg, shape), model_seconds(kind, 64 * MIB, cfg, shape)
    assert got == pytest.approx(want, rel=0.10), f"{chip} {kind} {shape}: {got * 1e6:.1f} us, model {want * 1e6:.1f}"


def test_all_reduce_takes_twice_an_all_gather() -> None:
    cfg = load_config("tpu_v5e")
    ag, ar = _seconds("all-gather", 64 * MIB, cfg, (16,)), _seconds("all-reduce", 64 * MIB, cfg, (16,))
    assert ar / ag == pytest.approx(2.0, rel=0.10)


def test_an_axis_without_wraparound_takes_twice_as_long() -> None:
    """The same 16 v5e chips with and without the wraparound links of their axis (chips.md: v5e wraps only
    16-chip axes)."""
    ring = load_config("tpu_v5e")
    line = load_config("tpu_v5e", ["ici.shape=[16]", "ici.wraparound=[false]"])
    assert ring.ici.wraps((16,)) == (True,) and line.ici.wraps((16,)) == (False,)
    for kind in ("all-gather", "all-reduce"):
        t_ring, t_line = _seconds(kind, 64 * MIB, ring, (16,)), _seconds(kind, 64 * MIB, line, (16,))
        assert t_line / t_ring == pytest.approx(2.0, rel=0.10), kind
        assert t_line == pytest.approx(model_seconds(kind, 64 * MIB, line, (16,)), rel=0.10), kind


def test_small_shards_are_latency_bound() -> None:
    """8 KiB to 32 KiB over 16 chips: the time hardly depends on the size and is the model's steps times
    their latency (the bandwidth term is under 3% of it)."""
    cfg = load_config("tpu_v5e")
    for kind in ("all-gather", "reduce-scatter", "all-reduce"):
        times = [_seconds(kind, kib * 1024, cfg, (16,)) for kib in (8, 16, 32)]
        assert max(times) / min(times) < 1.05, (kind, times)
        model = model_seconds(kind, 16 * 1024, cfg, (16,))
        assert times[1] == pytest.approx(model, rel=0.10), (kind, times[1], model)
