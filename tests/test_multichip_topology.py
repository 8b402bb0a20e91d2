"""ICI topologies: the config's slice shape, per-axis wraparound and routing; dimension-order routes; how
collective groups are placed on the grid."""

from __future__ import annotations

import pytest

import tpusim
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.lowering.collective_plan import Participants, plan_groups
from tpusim.config import load_config
from tpusim.errors import ConfigError
from tpusim.topology import Topology, parse_topology, system_topology


def test_routes_follow_dimension_order_the_short_way_round() -> None:
    ring = Topology((8,), wrap=True)
    assert ring.route(0, 7) == [(0, 0, -1)]
    assert ring.route(0, 4) == [(0, 0, 1), (1, 0, 1), (2, 0, 1), (3, 0, 1)]  # a tie goes forward
    line = Topology((8,), wrap=False)
    assert line.crossings(0, 7) == (7, 0) and line.neighbor(7, 0, 1) is None
    grid = Topology((2, 4), wrap=(False, True))
    assert grid.route(0, 7) == [(0, 0, 1), (4, 1, -1)]  # axis 0 first, then axis 1 the short way
    assert Topology((2, 4), wrap=(False, True), order=(1, 0)).route(0, 7) == [(0, 1, -1), (3, 0, 1)]
    assert len(Topology((2, 4), wrap=False).links()) == 8 + 12
    assert len(Topology((4, 4), wrap=True).links()) == 16 * 4
    assert str(grid) == "2x4 (axis 1 wraps)" and parse_topology("4x4x4") == (4, 4, 4)


@pytest.mark.parametrize(
    ("chip", "shape", "wraps"),
    [
        ("tpu_v5e", (16, 16), (True, True)),
        ("tpu_v5e", (8, 16), (False, True)),  # an 8x16 wraps its long axis only (https://cloud.google.com/tpu/docs/v5e)
        ("tpu_v5e", (2, 4), (False, False)),
        ("tpu_v6e", (16,), (True,)),
        ("tpu_v4", (4, 4, 4), (True, True, True)),  # whole 4x4x4 cubes
        ("tpu_v4", (2, 4, 8), (False, True, True)),
        ("tpu_v5p", (4, 4, 12), (True, True, True)),
        ("teaching", (3,), (True,)),
        ("teaching", (2,), (False,)),  # two chips are one pair of links
    ],
)
def test_wraparound_rules_of_the_shipped_chips(chip: str, shape: tuple[int, ...], wraps: tuple[bool, ...]) -> None:
    assert load_config(chip).ici.wraps(shape) == wraps


def test_config_keys_for_the_slice() -> None:
    cfg = load_config("tpu_v5e", ["ici.shape=[16,16]", "ici.wraparound=[true,false]", "ici.routing=[1,0]"])
    topo = system_topology(cfg, 256)
    assert (topo.shape, topo.wrap, topo.order) == ((16, 16), (True, False), (1, 0))
    v5e = load_config("tpu_v5e").ici
    assert (v5e.default_shape(8), v5e.default_shape(32), v5e.default_shape(256)) == ((8,), (8, 4), (16, 16))
    with pytest.raises(ConfigError, match=r"max_shape: 512 chips do not fit a slice of at most \[16, 16\]"):
        v5e.default_shape(512)
    # (a prime count of a billion chips tried every factorization by trial division: minutes; a bad-input
    # campaign found it)
    with pytest.raises(ConfigError, match=r"max_shape: 1000000007 chips do not fit"):
        v5e.default_shape(1_000_000_007)
    with pytest.raises(ConfigError, match=r"ici\.wraparound: must have one entry per axis of ici\.shape \[16\]"):
        load_config("tpu_v5e", ["ici.shape=[16]", "ici.wraparound=[true,true]"])
    with pytest.raises(ConfigError, match=r"ici\.wraparound: a mesh has no wraparound links"):
        load_config("tpu_v5e", ["ici.topology=mesh", "ici.shape=[16]", "ici.wraparound=[true]"])
    with pytest.raises(ConfigError, match=r"ici\.routing: must list each of the 2 axes once"):
        load_config("tpu_v5e", ["ici.routing=[0,0]"])
    with pytest.raises(ConfigError, match=r"ici\.wraparound\[0\]: expected true or false, not 1"):
        load_config("tpu_v5e", ["ici.shape=[16]", "ici.wraparound=[1]"])
    assert load_config("tpu_v5e", ["ici.topology=mesh"]).ici.wraps((16,)) == (False,)


def _permute_0_to_7(config: object) -> int:
    text = (
        "HloModule cp, replica_count=8\nENTRY main {\n  x = f32[8,8] parameter(0)\n"
        "  ROOT r = f32[8,8] collective-permute(x), source_target_pairs={{0,7}}\n}\n"
    )
    return tpusim.simulate(text, chips=8, config=config, timing_only=True).cycles


def test_transfers_cross_the_hops_of_their_route() -> None:
    """On the teaching chip (10 cycles per hop), chip 0 reaches chip 7 in one hop around the ring and in 7
    along a line: the handshake signal (7 -> 0) and the data (0 -> 7) each take 6 hops more."""
    ring = load_config("teaching")
    line = load_config("teaching", ["ici.shape=[8]", "ici.wraparound=[false]"])
    assert _permute_0_to_7(line) - _permute_0_to_7(ring) == 2 * 6 * 10


def _groups(text: str, shape: tuple[int, ...]) -> object:
    module = parse_module(
        "HloModule g, num_partitions=8\nsum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
        "  ROOT s = f32[] add(a, b)\n}\nENTRY main {\n  x = f32[8] parameter(0)\n"
        f"  ROOT r = f32[8] all-reduce(x), channel_id=1, replica_groups={text}, use_global_device_ids=true,"
        " to_apply=sum\n}\n"
    )
    instr = module.entry_computation.root_instruction
    return plan_groups(module, instr, Participants(1, 8), Topology(shape, wrap=True))


def test_groups_become_rings_of_the_grid() -> None:
    rows = _groups("[2,4]<=[8]", (2, 4))
    assert [(a.axis, a.length) for a in rows.axes] == [(1, 4)]
    cols = _groups("[4,2]<=[2,4]T(1,0)", (2, 4))
    assert [(a.axis, a.length) for a in cols.axes] == [(0, 2)]
    everything = _groups("{}", (2, 4))
    assert [(a.axis, a.length, a.wraps) for a in everything.axes] == [(0, 2, True), (1, 4, True)]
    column_major = _groups("[1,8]<=[2,4]T(1,0)", (2, 4))  # ranks run down the columns first
    assert [a.axis for a in column_major.axes] == [1, 0]
    halves = _groups("{{0,1,2,3},{4,5,6,7}}", (8,))  # aligned segments of a ring: lines of 4
    assert [(a.axis, a.length, a.wraps) for a in halves.axes] == [(0, 4, False)]
    assert _groups("{{0,2,4,6},{1,3,5,7}}", (8,)).axes is None  # strided: one logical ring, facts from a table
