"""Collectives on several simulated chips give the reference interpreter's N-device answer (and JAX's).

Every case runs the same per-device module on every chip (device d on chip d) and compares each chip's
outputs with ``evaluate_spmd``. Integer and data-movement results must be bit-exact; float reductions may
differ by the summation order (the ring adds in ring order, the reference in group order): f32 within
1e-6 (the inputs are O(1)); bf16 sums are held to the rounding-error bound of any summation order.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import tpusim
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import evaluate_spmd
from tpusim.compiler.hlo.reference.io import random_inputs
from tpusim.compiler.lowering import collective_landing
from tpusim.config import ChipConfig, load_config
from tpusim.isa import SemSignal

SUM = "sum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n"
MAX_S32 = "mx {\n  a = s32[] parameter(0)\n  b = s32[] parameter(1)\n  ROOT s = s32[] maximum(a, b)\n}\n"
SUM_BF16 = "bs {\n  a = bf16[] parameter(0)\n  b = bf16[] parameter(1)\n  ROOT s = bf16[] add(b, a)\n}\n"


def _module(name: str, header: str, comps: str, body: str) -> str:
    return f"HloModule {name}, {header}\n{comps}ENTRY main {{\n{textwrap.indent(body.strip(), '  ')}\n}}\n"


CASES = {
    "all_reduce_all": _module(
        "ar",
        "replica_count=8",
        SUM,
        """
        x = f32[16,256] parameter(0)
        ROOT r = f32[16,256] all-reduce(x), replica_groups={}, to_apply=sum""",
    ),
    "all_reduce_iota_groups": _module(
        "ar",
        "num_partitions=8",
        SUM,
        """
        x = f32[16,256] parameter(0)
        ROOT r = f32[16,256] all-reduce(x), channel_id=1, replica_groups=[2,4]<=[4,2]T(1,0),
            use_global_device_ids=true, to_apply=sum""",
    ),
    "all_reduce_irregular_groups": _module(
        "ar",
        "replica_count=8",
        SUM,
        """
        x = f32[5,100] parameter(0)
        ROOT r = f32[5,100] all-reduce(x), replica_groups={{0,3,5,6},{1,2,4,7}}, to_apply=sum""",
    ),
    "all_reduce_max_s32": _module(
        "ar",
        "replica_count=8",
        MAX_S32,
        """
        x = s32[8,128] parameter(0)
        ROOT r = s32[8,128] all-reduce(x), replica_groups={}, to_apply=mx""",
    ),
    "all_reduce_variadic": _module(
        "ar",
        "replica_count=8",
        SUM,
        """
        x = f32[8,128] parameter(0)
        y = f32[3] parameter(1)
        ROOT r = (f32[8,128], f32[3]) all-reduce(x, y), replica_groups={}, to_apply=sum""",
    ),
    "all_gather_minor_dim": _module(
        "ag",
        "replica_count=8",
        "",
        """
        x = f32[4,32] parameter(0)
        ROOT r = f32[4,256] all-gather(x), replica_groups={}, dimensions={1}""",
    ),
    "all_gather_one_row": _module(
        "ag",
        "replica_count=8",
        "",
        """
        x = f32[1,128] parameter(0)
        ROOT r = f32[8,128] all-gather(x), replica_groups={}, dimensions={0}""",
    ),
    "all_gather_partition_groups": _module(
        "ag",
        "num_partitions=8",
        "",
        """
        x = s32[2,64] parameter(0)
        ROOT r = s32[4,64] all-gather(x), channel_id=3, replica_groups={{0,4},{1,5},{2,6},{3,7}},
            dimensions={0}, use_global_device_ids=true""",
    ),
    "reduce_scatter_all": _module(
        "rs",
        "replica_count=8",
        SUM,
        """
        x = f32[64,128] parameter(0)
        ROOT r = f32[8,128] reduce-scatter(x), replica_groups={}, dimensions={0}, to_apply=sum""",
    ),
    "reduce_scatter_groups": _module(
        "rs",
        "replica_count=8",
        SUM,
        """
        x = f32[8,96] parameter(0)
        ROOT r = f32[8,24] reduce-scatter(x), replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={1},
            to_apply=sum""",
    ),
    "all_to_all_array": _module(
        "a2a",
        "replica_count=8",
        "",
        """
        x = f32[16,128] parameter(0)
        ROOT r = f32[16,128] all-to-all(x), replica_groups={}, dimensions={0}""",
    ),
    "all_to_all_tuple": _module(
        "a2a",
        "replica_count=8",
        "",
        """
        a = f32[2,64] parameter(0)
        b = f32[2,64] parameter(1)
        ROOT r = (f32[2,64], f32[2,64]) all-to-all(a, b), replica_groups={{0,1},{2,3},{4,5},{6,7}}""",
    ),
    "collective_permute_partial": _module(
        "cp",
        "replica_count=8",
        "",
        """
        x = f32[8,128] parameter(0)
        ROOT r = f32[8,128] collective-permute(x), source_target_pairs={{0,3},{3,1},{1,0},{5,5},{6,7}}""",
    ),
    "collective_broadcast": _module(
        "cb",
        "replica_count=8",
        "",
        """
        x = f32[8,128] parameter(0)
        ROOT r = f32[8,128] collective-broadcast(x), replica_groups={{3,0,1,2},{4,5,6,7}}""",
    ),
    "async_wrapped_short_form": _module(
        "aw",
        "replica_count=8",
        SUM,
        """
        x = f32[64,128] parameter(0)
        rs = ((f32[64,128]), f32[8,128]) reduce-scatter-start(x), replica_groups={}, dimensions={0},
            to_apply=sum
        ag = ((f32[64,128]), f32[512,128]) all-gather-start(x), replica_groups={}, dimensions={0}
        e = f32[64,128] exponential(x)
        rsd = f32[8,128] reduce-scatter-done(rs)
        agd = f32[512,128] all-gather-done(ag)
        ROOT t = (f32[8,128], f32[512,128], f32[64,128]) tuple(rsd, agd, e)""",
    ),
    "replica_and_partition_id": _module(
        "ids",
        "num_partitions=4, replica_count=2",
        "",
        """
        a = u32[] replica-id()
        b = u32[] partition-id()
        ROOT t = (u32[], u32[]) tuple(a, b)""",
    ),
    "async_pairs_around_compute": _module(
        "async",
        "replica_count=8",
        SUM,
        """
        x = f32[16,128] parameter(0)
        ars = f32[16,128] all-reduce-start(x), replica_groups={}, to_apply=sum
        ags = (f32[16,128], f32[128,128]) all-gather-start(x), replica_groups={}, dimensions={0}
        cps = (f32[16,128], f32[16,128], u32[], u32[]) collective-permute-start(x),
            source_target_pairs={{0,1},{1,2},{2,3},{3,4},{4,5},{5,6},{6,7},{7,0}}
        e = f32[16,128] exponential(x)
        ard = f32[16,128] all-reduce-done(ars)
        agd = f32[128,128] all-gather-done(ags)
        cpd = f32[16,128] collective-permute-done(cps)
        ROOT t = (f32[16,128], f32[128,128], f32[16,128], f32[16,128]) tuple(ard, agd, cpd, e)""",
    ),
}


def _compare(got: tuple[np.ndarray, ...], per_device: list[list[np.ndarray]], what: str) -> None:
    assert len(got) == len(per_device[0]), what
    for j, out in enumerate(got):
        want = np.stack([dev[j] for dev in per_device])
        assert out.shape == want.shape and out.dtype == want.dtype, f"{what} output {j}"
        if out.dtype.kind == "f":
            np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6, err_msg=f"{what} output {j}")
        else:
            np.testing.assert_array_equal(out, want, err_msg=f"{what} output {j}")


def _run(
    text: str, chips: int = 8, topology: str | None = None, config: str | ChipConfig = "tpu_v5e", seed: int = 0
) -> None:
    module = parse_module(text)
    per = random_inputs(module, seed, chips)
    want = evaluate_spmd(module, per, num_devices=chips)
    inputs = [np.stack([d[i] for d in per]) for i in range(len(per[0]))]
    result = tpusim.simulate(module, inputs, chips=chips, topology=topology, config=config)
    assert result.fallbacks == ()
    _compare(result.outputs, want, f"{module.name} on {chips} chips {topology or ''} {config}")


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("topology", [None, "2x4"])
def test_collective_matches_reference(name: str, topology: str | None) -> None:
    """On a line of 8 v5e chips (no wraparound: zigzag rings) and on a 2x4 grid (one ring per axis)."""
    _run(CASES[name], topology=topology)


def test_bf16_all_reduce_within_the_rounding_bound() -> None:
    """Each of the S - 1 bf16 additions rounds (unit roundoff u = 2**-8), so any order of summation is within
    (S - 1) * u * sum|x_i| of the exact sum; the ring's and the reference's orders both are."""
    module = parse_module(
        _module(
            "ar",
            "replica_count=8",
            SUM_BF16,
            """
        x = bf16[32,128] parameter(0)
        ROOT r = bf16[32,128] all-reduce(x), replica_groups={}, to_apply=bs""",
        )
    )
    per = random_inputs(module, 3, 8)
    x = np.stack([d[0] for d in per]).astype(np.float64)
    exact, bound = x.sum(axis=0), 7 * 2.0**-8 * np.abs(x).sum(axis=0)
    (got,) = tpusim.simulate(module, [x.astype(per[0][0].dtype)], chips=8).outputs
    want = np.stack([d[0] for d in evaluate_spmd(module, per)])
    for what, value in (("simulator", got), ("reference", want)):
        err = np.abs(value.astype(np.float64) - exact[None])
        assert np.all(err <= bound[None] + 1e-12), f"{what} beyond the bf16 rounding bound"
    assert np.all(got == got[:1]), "every chip holds the same sum"


@pytest.mark.parametrize(
    "groups",
    [
        "{{0,1,2,3},{4,5,6,7}}",
        "[2,4]<=[8]",
        "[4,2]<=[2,4]T(1,0)",
        "mesh[x=2,y=4] {y}",
        "mesh['a'=2,'b'=4] {'a'}",
    ],
)
def test_every_printed_form_of_replica_groups(groups: str) -> None:
    _run(
        _module(
            "forms",
            "num_partitions=8",
            SUM,
            f"""
        x = f32[8,64] parameter(0)
        ROOT r = f32[8,64] all-reduce(x), channel_id=1, replica_groups={groups}, use_global_device_ids=true,
            to_apply=sum""",
        ),
        topology="2x4",
    )


def test_rings_of_other_chips_and_shapes() -> None:
    """A wrapping ring with tiny VMEM blocks (teaching chip), a 3-D grid (v4, one ring per axis), and a
    group size that does not divide the buffer (6 chips: the all-reduce runs on a padded copy)."""
    _run(CASES["all_reduce_all"].replace("16,256", "128,256"), config="teaching")
    _run(CASES["reduce_scatter_all"], config="teaching")
    small_vmem = load_config("tpu_v5e", ["vmem.bytes=131072"])  # many blocks per stage, cycling buffer sets
    _run(CASES["all_reduce_all"].replace("16,256", "256,1024"), config=small_vmem)
    _run(CASES["all_reduce_all"], topology="2x2x2", config="tpu_v4")
    _run(CASES["all_gather_one_row"], topology="2x2x2", config="tpu_v4")
    text = _module(
        "ar6",
        "replica_count=6",
        SUM,
        """
        x = f32[8,128] parameter(0)
        ROOT r = f32[8,128] all-reduce(x), replica_groups={}, to_apply=sum""",
    )
    _run(text, chips=6)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6])
def test_three_axes_at_once(rows: int) -> None:
    """Gathers and scatters over every axis of a 3-D torus block run as three parts, one per axis order
    (fewer parts when a shard has fewer rows than three, uneven parts when three do not divide them); an
    all-reduce too. A 2x2x4 v4 block: the axis of four wraps."""
    ag = _module(
        "ag3",
        "replica_count=16",
        "",
        f"""
        x = f32[{rows},128] parameter(0)
        ROOT r = f32[{16 * rows},128] all-gather(x), replica_groups={{}}, dimensions={{0}}""",
    )
    rs = _module(
        "rs3",
        "replica_count=16",
        SUM,
        f"""
        x = f32[{16 * rows},128] parameter(0)
        ROOT r = f32[{rows},128] reduce-scatter(x), replica_groups={{}}, dimensions={{0}}, to_apply=sum""",
    )
    ar = _module(
        "ar3",
        "replica_count=16",
        SUM,
        f"""
        x = f32[{rows},384] parameter(0)
        ROOT r = f32[{rows},384] all-reduce(x), replica_groups={{}}, to_apply=sum""",
    )
    for text in (ag, rs, ar):
        _run(text, chips=16, topology="2x2x4", config="tpu_v4")


@pytest.mark.parametrize("rows", [8, 24, 40])
def test_a_ring_and_a_line_split_their_parts_unevenly(rows: int) -> None:
    """v5p 4x2: the part that crosses the line of two with the most data takes less of it (whole tiles
    each), and gathers, scatters and all-reduces still give the reference's answer."""
    for text in (
        _module(
            "ag",
            "replica_count=8",
            "",
            f"""
            x = f32[{rows},128] parameter(0)
            ROOT r = f32[{8 * rows},128] all-gather(x), replica_groups={{}}, dimensions={{0}}""",
        ),
        _module(
            "rs",
            "replica_count=8",
            SUM,
            f"""
            x = f32[{8 * rows},128] parameter(0)
            ROOT r = f32[{rows},128] reduce-scatter(x), replica_groups={{}}, dimensions={{0}}, to_apply=sum""",
        ),
        _module(
            "ar",
            "replica_count=8",
            SUM,
            f"""
            x = f32[{rows},256] parameter(0)
            ROOT r = f32[{rows},256] all-reduce(x), replica_groups={{}}, to_apply=sum""",
        ),
    ):
        _run(text, chips=8, topology="4x2", config="tpu_v5p")


LOOP = """HloModule loop, replica_count=4
sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
cond {
  p = (s32[], f32[8,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT c = pred[] compare(i, n), direction=LT
}
body {
  p = (s32[], f32[8,128]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[8,128] get-tuple-element(p), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  r = f32[8,128] all-reduce(x), replica_groups={}, to_apply=sum
  quarter = f32[] constant(0.25)
  q = f32[8,128] broadcast(quarter), dimensions={}
  y = f32[8,128] multiply(r, q)
  ROOT t = (s32[], f32[8,128]) tuple(j, y)
}
ENTRY main {
  x = f32[8,128] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[8,128]) tuple(zero, x)
  w = (s32[], f32[8,128]) while(init), condition=cond, body=body
  ROOT o = f32[8,128] get-tuple-element(w), index=1
}
"""
POR = "por {\n  a = pred[] parameter(0)\n  b = pred[] parameter(1)\n  ROOT s = pred[] or(a, b)\n}\n"


def test_async_start_calling_a_collective() -> None:
    """``async-start(..), calls=`` a computation holding only the collective, with an ``async-update``."""
    wrapped = """a2a_body {
  p = f32[16,128] parameter(0)
  ROOT a = f32[16,128] all-to-all(p), replica_groups={}, dimensions={0}
}
"""
    _run(
        _module(
            "calls",
            "replica_count=8",
            wrapped,
            """
        x = f32[16,128] parameter(0)
        s = ((f32[16,128]), f32[16,128], u32[]) async-start(x), calls=a2a_body
        u = ((f32[16,128]), f32[16,128], u32[]) async-update(s)
        ROOT d = f32[16,128] async-done(u)""",
        ),
        topology="2x4",
    )


def test_scalars_predicates_and_loops() -> None:
    """A scalar sum (padded to whole chunks), a pred ``or`` in 32-bit slots, and an all-reduce in every
    iteration of a while loop (the handshake and semaphores are per execution)."""
    _run(
        _module(
            "scalar",
            "replica_count=8",
            SUM,
            """
        x = f32[] parameter(0)
        ROOT r = f32[] all-reduce(x), replica_groups={}, to_apply=sum""",
        )
    )
    _run(
        _module(
            "pred",
            "replica_count=8",
            POR,
            """
        x = pred[4,8] parameter(0)
        ROOT r = pred[4,8] all-reduce(x), replica_groups={}, to_apply=por""",
        )
    )
    _run(LOOP, chips=4)


def test_async_pairs_in_a_loop_and_through_an_update() -> None:
    """An async all-reduce in a loop body (its ring steps stay on the main sequencer: the async sequencer's
    stream runs once) and an all-gather through an ``async-update``, which reads the result and so waits for
    the async sequencer's steps."""
    body = "r = f32[8,128] all-reduce(x), replica_groups={}, to_apply=sum"
    split = ("s = f32[8,128] all-reduce-start(x), replica_groups={}, to_apply=sum\n"
             "  e = f32[8,128] exponential(x)\n  r = f32[8,128] all-reduce-done(s)")  # fmt: skip
    assert body in LOOP
    _run(LOOP.replace(body, split), chips=4)
    wrapped = """ag_body {
  p = f32[16,128] parameter(0)
  ROOT a = f32[128,128] all-gather(p), replica_groups={}, dimensions={0}
}
"""
    _run(
        _module(
            "calls",
            "replica_count=8",
            wrapped,
            """
        x = f32[16,128] parameter(0)
        s = ((f32[16,128]), f32[128,128], u32[]) async-start(x), calls=ag_body
        e = f32[16,128] exponential(x)
        u = ((f32[16,128]), f32[128,128], u32[]) async-update(s)
        d = f32[128,128] async-done(u)
        ROOT t = (f32[128,128], f32[16,128]) tuple(d, e)""",
        ),
        topology="2x4",
    )
    # an all-reduce wrapped in async-start: its reduce-scatter at the start, the rest on the async sequencer
    wrapped_ar = (
        SUM
        + """ar_body {
  p = f32[16,128] parameter(0)
  ROOT a = f32[16,128] all-reduce(p), replica_groups={}, to_apply=sum
}
"""
    )
    _run(
        _module(
            "calls",
            "replica_count=8",
            wrapped_ar,
            """
        x = f32[16,128] parameter(0)
        s = ((f32[16,128]), f32[16,128], u32[]) async-start(x), calls=ar_body
        e = f32[16,128] exponential(x)
        d = f32[16,128] async-done(s)
        ROOT t = (f32[16,128], f32[16,128]) tuple(d, e)""",
        ),
        topology="2x4",
    )


MESH_SHAPE = (2, 4)


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:8]).reshape(MESH_SHAPE), ("x", "y"))


def _shard_map_program():  # type: ignore[no-untyped-def]
    mesh = _mesh()

    def body(a, b):  # type: ignore[no-untyped-def]
        s = jax.lax.psum(a, "y")
        g = jax.lax.all_gather(b, "x", tiled=True)
        p = jax.lax.ppermute(a, "y", [(i, (i + 1) % 4) for i in range(4)])
        rs = jax.lax.psum_scatter(a, "y", scatter_dimension=0, tiled=True)
        a2a = jax.lax.all_to_all(a, "y", 0, 0, tiled=True)
        return s * 2.0, g, p, rs, a2a

    spec = P("x", "y")
    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, spec), out_specs=(spec,) * 5))
    rng = np.random.default_rng(7)
    a = jax.device_put(rng.standard_normal((16, 256), np.float32), NamedSharding(mesh, spec))
    b = jax.device_put(rng.standard_normal((16, 256), np.float32), NamedSharding(mesh, spec))
    return mesh, fn, a, b


def _shards(arr, mesh: Mesh) -> np.ndarray:  # type: ignore[no-untyped-def]
    index = arr.sharding.devices_indices_map(arr.shape)
    return np.stack([np.asarray(arr)[index[d]] for d in mesh.devices.flat])


def test_jax_shard_map_program_matches_jax() -> None:
    """XLA's per-device module of a shard_map program (psum, all_gather, ppermute, psum_scatter,
    all_to_all over a 2x4 mesh), run on 8 chips as a 2x4 grid: each chip's outputs are JAX's shards."""
    mesh, fn, a, b = _shard_map_program()
    text = fn.lower(a, b).compile().as_text()
    module = parse_module(text)
    assert module.num_partitions == 8
    result = tpusim.simulate(module, [_shards(a, mesh), _shards(b, mesh)], chips=8, topology="2x4")
    outs = jax.tree_util.tree_leaves(fn(a, b))
    for i, (got, want) in enumerate(zip(result.outputs, outs)):
        np.testing.assert_allclose(got, _shards(want, mesh), rtol=1e-6, atol=1e-6, err_msg=f"output {i}")


def test_spmd_partitioner_dump_runs(tmp_path: Path) -> None:
    """The module XLA's SPMD partitioner writes with --xla_dump_to / --xla_dump_hlo_pass_re=spmd-partitioning
    (produced in a fresh process, since the flags are read when JAX starts) runs on 8 chips."""
    script = textwrap.dedent(f"""
        import os
        os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=8 --xla_dump_to={tmp_path} "
                                   "--xla_dump_hlo_pass_re=spmd-partitioning")
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, PartitionSpec as P
        mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("x", "y"))
        def body(a):
            return jax.lax.psum(a, "y") + jax.lax.all_gather(a, "x", tiled=True)[:8]
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y")))
        f.lower(jnp.ones((16, 256), jnp.float32)).compile()
    """)
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=120)
    dumps = sorted(tmp_path.glob("*after_spmd-partitioning*.txt"))
    assert dumps, "XLA wrote no module after spmd-partitioning"
    module = parse_module(dumps[0].read_text())
    per = random_inputs(module, 1, 8)
    want = evaluate_spmd(module, per)
    result = tpusim.simulate(module, [np.stack([d[0] for d in per])], chips=8, topology="2x4")
    _compare(result.outputs, want, "spmd-partitioning dump")


def test_all_to_all_half_way_round_a_ring_goes_both_ways() -> None:
    """On a ring of four v4 chips (wraparound) the partner two away is as far either way: its chunk goes
    half forward and half backward (two pushes, tie=1 and tie=-1), and every chip still gets JAX's answer;
    a chunk too short to cut on a tile boundary goes whole."""
    for rows in (64, 8):
        text = _module(
            "a2a",
            "replica_count=4",
            "",
            f"""
            x = f32[{rows},128] parameter(0)
            ROOT r = f32[{rows},128] all-to-all(x), replica_groups={{}}, dimensions={{0}}""",
        )
        compiled = tpusim.compile_program(text, config=load_config("tpu_v4", ["ici.shape=[4]"]))
        ties = {getattr(i, "tie", 1) for s in compiled.program.streams for i in s.instructions}
        assert ties == ({1, -1} if rows == 64 else {1})
        _run(text, chips=4, topology="4", config="tpu_v4")


@pytest.mark.parametrize(
    ("chips", "topology", "groups"),
    [(4, "4", "{}"), (16, "4x4", "{}"), (16, "4x4", "{{0,1,2,3},{4,5,6,7},{8,9,10,11},{12,13,14,15}}"),
     (16, "4x4", "{{0,4,8,12},{1,5,9,13},{2,6,10,14},{3,7,11,15}}"), (8, "2x4", "{}")],
)  # fmt: skip
def test_a_latency_bound_all_gather_pushed_straight_to_every_partner(chips: int, topology: str, groups: str) -> None:
    """Shards of 64 bytes (in the rows and in the lanes) go straight to every member of their group: a whole
    line or ring, a 2-D block, one axis of a 4x4 torus or the other (``replica_groups``)."""
    n = chips if groups == "{}" else 4
    for x, dim, y in (("f32[4,4]", 0, f"f32[{4 * n},4]"), ("f32[2,8]", 1, f"f32[2,{8 * n}]")):
        text = (f"HloModule ag, replica_count={chips}\nENTRY main {{\n  x = {x} parameter(0)\n"
                f"  ROOT r = {y} all-gather(x), replica_groups={groups}, dimensions={{{dim}}}\n}}\n")  # fmt: skip
        _run(text, chips=chips, topology=topology)


@pytest.mark.parametrize("topology", ["4x4", "2x2x4"])
def test_partial_sums_landing_in_vmem_reuse_their_buffers(topology: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rings on a system of several ICI axes land their partial sums in the receivers' VMEM and reuse the
    landing buffers on credits (``collective_landing``): with 4 KiB blocks a phase pushes many more blocks
    than it has buffers, and every chip's result still equals the reference, for a reduce-scatter op and an
    all-reduce over every axis at once, and an all-reduce over one axis (groups of four along the last)."""
    monkeypatch.setattr(collective_landing, "TARGET_BLOCK_BYTES", 4096)
    rs = _module(
        "rsl",
        "replica_count=16",
        SUM,
        """
        x = f32[1024,128] parameter(0)
        ROOT r = f32[64,128] reduce-scatter(x), replica_groups={}, dimensions={0}, to_apply=sum""",
    )
    ar = _module(
        "arl",
        "replica_count=16",
        SUM,
        """
        x = f32[512,256] parameter(0)
        ROOT r = f32[512,256] all-reduce(x), replica_groups={}, to_apply=sum""",
    )
    rows = "{{0,1,2,3},{4,5,6,7},{8,9,10,11},{12,13,14,15}}"
    ar1 = _module(
        "arl1",
        "replica_count=16",
        SUM,
        f"""
        x = f32[512,256] parameter(0)
        ROOT r = f32[512,256] all-reduce(x), replica_groups={rows}, to_apply=sum""",
    )
    for text in (rs, ar, ar1):
        module = parse_module(text)
        # small integers: every partial sum is exact in f32, so any summation order gives the reference's bits
        shape = module.entry_computation.instructions[0].shape.dimensions
        per = [[np.random.default_rng(c).integers(-8, 9, shape).astype(np.float32)] for c in range(16)]
        want = evaluate_spmd(module, per, num_devices=16)
        inputs = [np.stack([d[i] for d in per]) for i in range(len(per[0]))]
        result = tpusim.simulate(module, inputs, chips=16, topology=topology, config="tpu_v4")
        _compare(result.outputs, want, f"{module.name} on {topology}")
        stream = result.compiled.program.streams[0].instructions
        recycled = [i for i in stream if isinstance(i, SemSignal) and i.fence]
        assert recycled, "credits for reused landing buffers"


def _ring(n: int, step: int) -> str:
    return "{" + ",".join(f"{{{i},{(i + step) % n}}}" for i in range(n)) + "}"


def _opposite_permutes(n: int, chained: int) -> str:
    """``chained`` pairs of collective-permutes, one of each pair around the ring one way, one the other."""
    s = "f32[16,256]"
    lines, a, b = [], "a", "b"
    for j in range(chained):
        lines.append(f"fa{j} = {s} collective-permute({a}), channel_id={2 * j + 1}, source_target_pairs={_ring(n, 1)}")
        lines.append(f"fb{j} = {s} collective-permute({b}), channel_id={2 * j + 2}, source_target_pairs={_ring(n, -1)}")
        a, b = f"fa{j}", f"fb{j}"
    body = "\n  ".join(lines)
    return (
        f"HloModule m, num_partitions={n}\nENTRY main {{\n  a = {s} parameter(0)\n  b = {s} parameter(1)\n  {body}\n"
        f"  ROOT o = ({s}, {s}) tuple({a}, {b})\n}}\n"
    )


@pytest.mark.parametrize(("n", "topology"), [(8, (8,)), (8, (2, 4))])
def test_permutes_in_opposite_directions_each_take_their_own_data(n: int, topology: tuple[int, ...]) -> None:
    """On a line of 8 v5e chips (no wraparound: the closing pair crosses 7 hops) a chip that had sent its
    part of one permute went on to the next, the other way round, and signalled its new source, which took
    the signal for the first permute's and pushed into a buffer still in use: three chips of eight held
    another step's data (found by a fuzz campaign: a bidirectional ppermute ring in lax.scan, a
    bidirectional collective matmul). Every relation now has its own ready and arrival semaphores."""
    text = _opposite_permutes(n, 3)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, 16, 256)).astype(np.float32)
    b = rng.standard_normal((n, 16, 256)).astype(np.float32)
    want = evaluate_spmd(parse_module(text), [[a[d], b[d]] for d in range(n)])
    result = tpusim.simulate(text, [a, b], chips=n, topology=topology, config="tpu_v5e")
    for d in range(n):
        np.testing.assert_array_equal(result.outputs[0][d], want[d][0])
        np.testing.assert_array_equal(result.outputs[1][d], want[d][1])


def _packed(name: str, fn: str = "maximum", lane: str = "u8") -> str:
    """XLA:TPU's reduction of ``lane`` values packed in a u32 word (four u8 or s8, two f16): unpack each lane
    (a signed or float lane through a bitcast-convert of its unsigned bits), combine with ``fn``, repack."""
    bits = {"u8": 8, "s8": 8, "f16": 16}[lane]
    raw = f"u{bits}"
    lines = [f"{name} (a: u32[], b: u32[]) -> u32[] {{", "  a = u32[] parameter(0)", "  b = u32[] parameter(1)"]
    parts = []
    for k in range(0, 32, bits):
        lines.append(f"  c{k} = u32[] constant({k})")
        for x in "ab":
            lines += [f"  {x}s{k} = u32[] shift-right-logical({x}, c{k})", f"  {x}{k} = {raw}[] convert({x}s{k})"]
            if lane != raw:
                lines.append(f"  {x}l{k} = {lane}[] bitcast-convert({x}{k})")
        if lane != raw:
            lines += [f"  l{k} = {lane}[] {fn}(al{k}, bl{k})", f"  m{k} = {raw}[] bitcast-convert(l{k})"]
        else:
            lines.append(f"  m{k} = {raw}[] {fn}(a{k}, b{k})")
        lines += [f"  w{k} = u32[] convert(m{k})", f"  s{k} = u32[] shift-left(w{k}, c{k})"]
        parts.append(f"s{k}")
    while len(parts) > 1:
        lines.append(f"  o{len(lines)} = u32[] or({parts[0]}, {parts[1]})")
        parts = [*parts[2:], f"o{len(lines) - 1}"]
    lines[-1] = lines[-1].replace(f"  {parts[0]} =", "  ROOT r =")
    return "\n".join(lines) + "\n}\n"


def _assert_every_chip_gives(text: str, x: np.ndarray, want: np.ndarray) -> None:
    """The reference interpreter and the simulated 2x2 v5e chips each give ``want`` as output 0 on every chip
    (``x`` holds the four chips' inputs), with no fallback."""
    reference = evaluate_spmd(parse_module(text), [[x[d]] for d in range(4)])
    result = tpusim.simulate(text, [x], chips=4, topology=(2, 2), config="tpu_v5e")
    assert not result.fallbacks
    for d in range(4):
        np.testing.assert_array_equal(reference[d][0], want)
        np.testing.assert_array_equal(result.outputs[0][d], want)


@pytest.mark.parametrize("form", ["sync", "async"])
def test_a_packed_reduction_computation_reduces_each_byte(form: str) -> None:
    """XLA:TPU's modules reduce u8 (and f16) values four (two) to a u32 word, with a reduction computation
    that unpacks, combines and repacks them; tpusim refused any reduction but one elementwise op."""
    groups = "replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=packed"
    if form == "sync":
        body = f"ROOT r = u32[8,256] all-reduce(x), channel_id=1, {groups}"
    else:
        body = (
            f"s = u32[8,256] all-reduce-start(x), channel_id=1, {groups}\n"
            "  e = u32[8,256] multiply(x, x)\n  d = u32[8,256] all-reduce-done(s)\n"
            "  ROOT r = (u32[8,256], u32[8,256]) tuple(d, e)"
        )
    entry = f"ENTRY main {{\n  x = u32[8,256] parameter(0)\n  {body}\n}}\n"
    text = f"HloModule packed, num_partitions=4\n{_packed('packed')}{entry}"
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**32, (4, 8, 256), dtype=np.uint64).astype(np.uint32)
    want = np.maximum.reduce(x.view(np.uint8).reshape(4, 8, 256, 4), axis=0).reshape(8, 1024).view(np.uint32)
    _assert_every_chip_gives(text, x, want)


def _packed_all_reduce_entry() -> str:
    groups = "replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=packed"
    root = f"ROOT r = u32[8,256] all-reduce(x), channel_id=1, {groups}"
    return f"ENTRY main {{\n  x = u32[8,256] parameter(0)\n  {root}\n}}\n"


@pytest.mark.parametrize(("lane", "fn"), [("s8", "maximum"), ("s8", "minimum"), ("f16", "add"), ("f16", "maximum")])
def test_packed_signed_and_float_lanes_reduce_through_their_bitcasts(lane: str, fn: str) -> None:
    """XLA:TPU's ``pmax`` of int8 and ``psum`` of float16 over a mesh axis reduce u32 words whose lanes
    are bitcast to s8 / f16 (a bitcast-convert of the lane's unsigned bits): tpusim refused the
    reduction (``bitcast-convert`` was no step of a ``vpu.fused`` chain; found by a fuzz campaign of
    XLA:TPU's SPMD modules)."""
    entry = _packed_all_reduce_entry()
    text = f"HloModule packed, num_partitions=4\n{_packed('packed', fn, lane)}{entry}"
    rng = np.random.default_rng(1)
    if lane == "s8":
        x = rng.integers(0, 2**32, (4, 8, 256), dtype=np.uint64).astype(np.uint32)
        lanes = x.view(np.int8).reshape(4, 8, 256, 4)
    else:  # small integers: their sums are exact in f16, whatever order the ring adds them in
        lanes = rng.integers(-200, 200, (4, 8, 256, 2)).astype(np.float16)
        x = lanes.view(np.uint32).reshape(4, 8, 256)
    combine = {"maximum": np.maximum, "minimum": np.minimum, "add": np.add}[fn]
    want = combine.reduce(lanes, axis=0).view(np.uint32).reshape(8, 256)
    _assert_every_chip_gives(text, x, want)


def test_a_reduction_that_does_not_associate_on_packed_float_lanes_is_refused() -> None:
    """The chain check draws, for a chain with float steps on integer words, words of small integers in the
    float lanes (exact in any order), so ``max(a, b) + 1`` on each f16 lane still fails associativity."""
    comp = _packed("packed", "maximum", "f16")
    comp = comp.replace(
        "l0 = f16[] maximum(al0, bl0)",
        "x0 = f16[] maximum(al0, bl0)\n  one = f16[] constant(1)\n  l0 = f16[] add(x0, one)",
    )
    entry = _packed_all_reduce_entry()
    with pytest.raises(tpusim.TpusimError, match="commutes and associates"):
        tpusim.compile_program(f"HloModule packed, num_partitions=4\n{comp}{entry}", options=None)
