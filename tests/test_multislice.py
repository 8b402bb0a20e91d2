"""Several slices joined by the data-center network (issue 16): ``dcn.slices`` copies of the ICI grid along a
leading axis whose hops are each chip's DCN egress and ingress.

Checked here: routes and link names between slices; collectives over slices give the reference
interpreter's answers (integer sums bit for bit on 32 chips); they are hierarchical (the network carries one
slice's share of the data); and their time is the ring bound over each chip's published DCN bandwidth
(``configs/tpu_v5e.yaml``: 2 x 100 Gbit/s NICs per 8-chip host) plus the ICI phases.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_collectives_numerics import CASES, _run

import tpusim
from tpusim.compiler.hlo import parse_module
from tpusim.config import load_config
from tpusim.errors import ConfigError
from tpusim.report.links import link_usage
from tpusim.topology import system_topology

ADD_S32 = "add {\n  a = s32[] parameter(0)\n  b = s32[] parameter(1)\n  ROOT s = s32[] add(a, b)\n}\n"
SUM = "sum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n"
MIB = 2**20


def _slices(n: int, chip: str = "tpu_v5e"):
    return load_config(chip, [f"dcn.slices={n}"])


def test_routes_between_slices_cross_one_egress_and_one_ingress():
    topo = system_topology(_slices(2), 32, (16,))
    assert topo.shape == (2, 16) and topo.slices == 2 and topo.slice_shape == (16,)
    assert str(topo) == "2 slices of 16 (axis 0 wraps) joined by DCN"
    # chip 3 of slice 0 to chip 5 of slice 1: out of chip 3, into chip 19 (its place in slice 1), two ICI hops
    assert topo.route(3, 21) == [(3, 0, 1), (19, 0, -1), (19, 1, 1), (20, 1, 1)]
    assert topo.crossings(3, 21) == (2, 1) and topo.crossings(3, 5) == (2, 0)
    assert [topo.link_name(link) for link in topo.route(3, 19)] == ["chip3.dcn_out", "chip19.dcn_in"]
    dcn = [link for link in topo.links() if topo.is_dcn(link)]
    assert len(dcn) == 2 * 32  # an egress and an ingress per chip
    single = system_topology(load_config("tpu_v5e"), 16, (16,))
    assert single.slices == 1 and single.shape == (16,) and str(single) == "16 (axis 0 wraps)"


def test_slices_that_do_not_hold_the_run_are_refused():
    with pytest.raises(ConfigError, match=r"do not split into dcn\.slices = 2 equal slices"):
        system_topology(_slices(2), 7)
    with pytest.raises(ConfigError, match="2 slices of 2x2 hold 8 chips, not the 16 chips of the run"):
        system_topology(_slices(2), 16, (2, 2))
    with pytest.raises(ConfigError, match=r"dcn\.slices: must be positive"):
        _slices(0)


@pytest.mark.parametrize(
    "name",
    ["all_reduce_all", "all_reduce_iota_groups", "all_gather_one_row", "all_gather_partition_groups",
     "reduce_scatter_all", "reduce_scatter_groups", "all_to_all_array", "collective_permute_partial",
     "async_pairs_around_compute"],
)  # fmt: skip
@pytest.mark.parametrize(("slices", "topology"), [(2, "2x2"), (4, "2")])
def test_collectives_over_slices_match_the_reference(name: str, slices: int, topology: str) -> None:
    """Eight chips as two slices of 2x2 (a pair of slices: a line) or four slices of two (a ring over DCN)."""
    _run(CASES[name], chips=8, topology=topology, config=_slices(slices))


def _exact(kind: str, chips: int, topology: str, cfg) -> None:
    """An integer sum (chip d contributes bit d) or gather, bit for bit on every chip."""
    rows = 2 * chips
    if kind == "all-reduce":
        body = f"x = s32[{rows},256] parameter(0)\n  ROOT r = s32[{rows},256] all-reduce(x), replica_groups={{}}, "
        body += "to_apply=add"
    elif kind == "reduce-scatter":
        body = f"x = s32[{rows},256] parameter(0)\n  ROOT r = s32[2,256] reduce-scatter(x), replica_groups={{}}, "
        body += "dimensions={0}, to_apply=add"
    else:
        body = f"x = s32[2,256] parameter(0)\n  ROOT r = s32[{rows},256] all-gather(x), replica_groups={{}}, "
        body += "dimensions={0}"
    module = parse_module(f"HloModule m, replica_count={chips}\n{ADD_S32}ENTRY main {{\n  {body}\n}}\n")
    shape = (rows, 256) if kind != "all-gather" else (2, 256)
    bits = [np.full(shape, 1 << d, np.uint32).view(np.int32) for d in range(chips)]
    if kind == "all-gather":
        bits = [b + np.arange(2 * 256, dtype=np.int32).reshape(2, 256) for b in bits]
    (got,) = tpusim.simulate(module, [np.stack(bits)], chips=chips, topology=topology, config=cfg).outputs
    if kind == "all-reduce":
        want = np.broadcast_to(np.stack(bits).sum(axis=0, dtype=np.int32), got.shape)
    elif kind == "reduce-scatter":
        total = np.stack(bits).sum(axis=0, dtype=np.int32)
        want = np.stack([total[2 * d : 2 * d + 2] for d in range(chips)])
    else:
        want = np.broadcast_to(np.concatenate(bits), got.shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", ["all-reduce", "reduce-scatter", "all-gather"])
@pytest.mark.parametrize(
    ("chip", "slices", "topology"), [("tpu_v5e", 2, "4x4"), ("tpu_v5e", 3, "2x2"), ("tpu_v4", 2, "2x2x2")]
)
def test_large_groups_over_slices_are_exact(kind: str, chip: str, slices: int, topology: str) -> None:
    """32 chips over two slices of a 4x4 grid (two ICI parts, then the network), three slices of 2x2 (a ring
    over the network), and a 3-D torus slice's three rings plus the network's."""
    chips = slices * int(np.prod([int(n) for n in topology.split("x")]))
    _exact(kind, chips, topology, _slices(slices, chip))


def _program(rows: int, groups: str, chips: int) -> str:
    body = f"x = f32[{rows},1024] parameter(0)\n  ROOT r = f32[{rows},1024] all-reduce(x), replica_groups={groups}, "
    return f"HloModule ar, replica_count={chips}\n{SUM}ENTRY main {{\n  {body}to_apply=sum\n}}\n"


def test_an_all_reduce_across_slices_runs_at_each_chips_dcn_bandwidth():
    """Chip i of slice 0 with chip i of slice 1, 8 MiB each: each chip sends half its array out and receives
    the other half twice (reduce-scatter, all-gather) through its own NIC share: V / B (ring bound 2 (S-1)/S V
    / B) = 2.68 ms on v5e's 3.125e9 B/s, plus two crossings of the network."""
    cfg = _slices(2)
    v = 8 * MIB
    result = tpusim.simulate(
        _program(v // 4096, "[16,2]<=[2,16]T(1,0)", 32), chips=32, topology="16", config=cfg, timing_only=True
    )
    want = v / cfg.dcn.bandwidth_bytes_per_s
    assert result.seconds == pytest.approx(want, rel=0.05)
    uses, unknown = link_usage(result)
    assert unknown == 0
    out = {u.name: u.bytes for u in uses if u.name.endswith("dcn_out")}
    assert len(out) == 32 and set(out.values()) == {v}  # half in each phase
    assert not [u for u in uses if ".ici" in u.name and u.bytes]  # the pairs talk over the network only


def test_an_all_reduce_over_every_chip_is_hierarchical():
    """64 MiB over two slices of a 16-chip ring: the ICI ring reduces first, so the network carries each
    chip's 1/16 share (V / 16 out per chip, where a flat ring over all 32 chips would send V out of the
    chips at the slice edges), and the time is the ICI ring's 2 V / W plus the network's V / (16 B)."""
    cfg = _slices(2)
    v = 64 * MIB
    result = tpusim.simulate(_program(v // 4096, "{}", 32), chips=32, topology="16", config=cfg, timing_only=True)
    uses, _ = link_usage(result)
    out = {u.name: u.bytes for u in uses if u.name.endswith("dcn_out")}
    assert set(out.values()) == {v // 16}
    want = 2 * v / (2 * cfg.ici.link_bandwidth_bytes_per_s) + v / 16 / cfg.dcn.bandwidth_bytes_per_s
    assert result.seconds == pytest.approx(want, rel=0.05)


@pytest.mark.parametrize(
    ("topology", "chips", "groups"), [("16", 32, "[16,2]<=[2,16]T(1,0)"), ("2x2", 8, "{}")]
)  # fmt: skip
def test_the_network_latency_is_paid_per_crossing(topology: str, chips: int, groups: str):
    """A small all-reduce across two slices is three crossings of the network one after the other (the entry
    handshake, a reduce-scatter stage, an all-gather stage): at least 3 x dcn.latency_ns, and 3 x more when
    the latency doubles. Over every chip of two 2x2 slices the data goes in two parts (one per ICI axis),
    which take the network at once: still three crossings, not six."""
    times = []
    for ns in (10_000, 20_000):
        cfg = load_config("tpu_v5e", ["dcn.slices=2", f"dcn.latency_ns={ns}"])
        result = tpusim.simulate(
            _program(8, groups, chips), chips=chips, topology=topology, config=cfg, timing_only=True
        )
        times.append(result.seconds)
        assert result.seconds >= 3 * ns * 1e-9
    assert times[1] - times[0] == pytest.approx(3 * 10_000e-9, rel=0.02)


def test_xla_compiles_for_one_slice_and_says_so(tmp_path, capsys):
    """``--compiler xla`` with several slices is refused before XLA is asked (no libtpu needed)."""
    from tpusim.cli import main

    path = tmp_path / "ar.hlo"
    path.write_text(_program(8, "{}", 8))
    argv = ["run", str(path), "--topology", "2x2", "--set", "dcn.slices=2", "--compiler", "xla", "--timing-only"]
    assert main(argv) == 1
    assert "compiles for one slice, not dcn.slices = 2" in capsys.readouterr().err


def test_a_dma_route_must_order_the_systems_axes():
    """``route=`` names an order of the topology's axes: on two slices of a 2x2 grid (three axes, the slices
    first) the order (1, 0) is refused where the DMA runs, naming the instruction and the topology."""
    from tpusim.devices import ExecutionError, System
    from tpusim.isa import DmaStart, Halt, MemRef, Program, Space, Stream
    from tpusim.memory import parse_shape

    block = parse_shape("f32[8,128]{1,0:T(8,128)}")
    src, dst = MemRef(Space.VMEM, 0, block), MemRef(Space.VMEM, 0x1000, block)
    cfg = _slices(2)
    program = Program((Stream(0, (DmaStart(src, dst, chip=7, route=(1, 0)), Halt()), chip=0),))
    with pytest.raises(ExecutionError, match=r"route order \[1, 0\] is not an order of the 3 axes of the system's "
                       r"topology 2 slices of 2x2 joined by DCN"):  # fmt: skip
        System(cfg, 8, (2, 2)).run(program, timing_only=True)
    # in the order (2, 1, 0) it crosses this slice's two links first, then the network into chip 7
    good = Program((Stream(0, (DmaStart(src, dst, chip=7, route=(2, 1, 0)), Halt()), chip=0),))
    run = System(cfg, 8, (2, 2)).run(good, timing_only=True)
    assert run.cycles > cfg.cycles(cfg.dcn.latency_ns) + 2 * cfg.cycles(cfg.ici.hop_latency_ns)
