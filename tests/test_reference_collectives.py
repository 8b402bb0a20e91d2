"""Collectives in the reference: SPMD-partitioned per-device modules from jax.shard_map on 8 host CPU
devices run with evaluate_spmd and compared shard by shard with JAX; hand-written replicated and async
modules checked against the operation semantics; deadlocks and bad groups reported, never hung."""

from __future__ import annotations

import time
from functools import partial

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jax_oracle import check_spmd_against_jax

from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import CollectiveError, InputError, evaluate, evaluate_spmd

MESH = jax.make_mesh((8,), ("x",))
MESH2 = jax.make_mesh((2, 4), ("a", "b"))


def _put(x: np.ndarray, mesh: jax.sharding.Mesh, spec: P) -> jax.Array:
    return jax.device_put(jnp.asarray(x), NamedSharding(mesh, spec))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int32])
def test_shard_map_collectives_1d(dtype: object) -> None:
    @jax.jit
    @partial(jax.shard_map, mesh=MESH, in_specs=P("x"), out_specs=P("x"))
    def f(x):  # type: ignore[no-untyped-def]
        ring = [(i, (i + 1) % 8) for i in range(8)]
        return (
            jax.lax.psum(x, "x"),
            jax.lax.pmax(x, "x"),
            jax.lax.ppermute(x, "x", ring),
            jax.lax.ppermute(x, "x", [(0, 3), (5, 1)]),  # devices nobody sends to receive zeros
            jax.lax.all_to_all(x, "x", 0, 0, tiled=True),
            jax.lax.all_gather(x, "x", tiled=True)[3:11],
            jax.lax.psum_scatter(jnp.tile(x, 8), "x", tiled=True),
            x * jax.lax.axis_index("x").astype(x.dtype),
        )

    rng = np.random.default_rng(2)
    values = rng.integers(-1000, 1000, 64) if np.dtype(dtype) == np.int32 else rng.standard_normal(64)
    x = _put(values.astype(dtype), MESH, P("x"))
    # exact: the reference sums in group order, ((v0 + v1) + v2) ..., as XLA CPU does (bit for bit on random data)
    check_spmd_against_jax(f, MESH, x)


def test_shard_map_collectives_2d_mesh_subgroups() -> None:
    @jax.jit
    @partial(jax.shard_map, mesh=MESH2, in_specs=P("a", "b"), out_specs=P("a", "b"))
    def f(x):  # type: ignore[no-untyped-def]
        return (
            jax.lax.psum(x, "b") * 2 + jax.lax.pmin(x, "a"),
            jax.lax.ppermute(x, "a", [(0, 1)]),
            jax.lax.all_gather(x, "b", axis=1, tiled=True)[:, :2],
            jax.lax.psum(x, ("a", "b")),
        )

    x = _put(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32), MESH2, P("a", "b"))
    check_spmd_against_jax(f, MESH2, x)


def test_data_parallel_mlp_step() -> None:
    """A realistic SPMD program: per-device MLP forward on its batch shard, gradients averaged with psum."""

    @jax.jit
    @partial(jax.shard_map, mesh=MESH, in_specs=(P("x"), P()), out_specs=(P(), P()))
    def step(x, w):  # type: ignore[no-untyped-def]
        def loss(w):  # type: ignore[no-untyped-def]
            return jnp.mean(jnp.tanh(x @ w) ** 2)

        value, grad = jax.value_and_grad(loss)(w)
        return jax.lax.pmean(value, "x"), jax.lax.pmean(grad, "x")

    rng = np.random.default_rng(1)
    x = _put(rng.standard_normal((16, 4)).astype(np.float32), MESH, P("x"))
    w = _put(rng.standard_normal((4, 3)).astype(np.float32), MESH, P())
    check_spmd_against_jax(step, MESH, x, w, tol="composite")


REPLICATED = """
HloModule replicated, replica_count=4
sum { a = f32[] parameter(0)
      b = f32[] parameter(1)
      ROOT s = f32[] add(a, b) }
ENTRY main {
  x = f32[2] parameter(0)
  r = u32[] replica-id()
  all = f32[2] all-reduce(x), replica_groups={}, to_apply=sum
  pairs = f32[2] all-reduce(x), replica_groups={{0,2},{1,3}}, to_apply=sum
  g = f32[8] all-gather(x), replica_groups={{3,2,1,0}}, dimensions={0}
  p = f32[2] collective-permute(x), source_target_pairs={{0,1},{1,2},{2,3}}
  b = f32[2] collective-broadcast(x), replica_groups={{2,0,1,3}}
  ROOT out = (u32[], f32[2], f32[2], f32[8], f32[2], f32[2]) tuple(r, all, pairs, g, p, b)
}
"""


def test_replicated_module_cross_replica_semantics() -> None:
    xs = [np.array([d, 10 * d], np.float32) for d in range(4)]
    outs = evaluate_spmd(parse_module(REPLICATED), [[x] for x in xs])
    total = sum(xs)
    for d, (rid, everyone, pair, gathered, permuted, broadcast) in enumerate(outs):
        assert rid.dtype == np.uint32 and int(rid) == d
        np.testing.assert_array_equal(everyone, total)
        np.testing.assert_array_equal(pair, xs[d % 2] + xs[d % 2 + 2])
        np.testing.assert_array_equal(gathered, np.concatenate([xs[3], xs[2], xs[1], xs[0]]))  # group order
        np.testing.assert_array_equal(permuted, xs[d - 1] if d else np.zeros(2, np.float32))
        np.testing.assert_array_equal(broadcast, xs[2])  # the first id of the group is the root


ASYNC = """
HloModule async_collectives, num_partitions=4
sum { a = s32[] parameter(0)
      b = s32[] parameter(1)
      ROOT s = s32[] add(a, b) }
ENTRY main {
  x = s32[2] parameter(0)
  ars = s32[2] all-reduce-start(x), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=sum
  ard = s32[2] all-reduce-done(ars)
  ags = (s32[2], s32[8]) all-gather-start(x), channel_id=2, replica_groups=[1,4]<=[4], dimensions={0},
    use_global_device_ids=true
  agd = s32[8] all-gather-done(ags)
  cps = (s32[2], s32[2], u32[], u32[]) collective-permute-start(x), channel_id=3, source_target_pairs={{0,3},{3,0}}
  cpd = s32[2] collective-permute-done(cps)
  ROOT out = (s32[2], s32[8], s32[2]) tuple(ard, agd, cpd)
}
"""


def test_async_collective_start_done_pairs() -> None:
    xs = [np.array([d, d * d], np.int32) for d in range(4)]
    outs = evaluate_spmd(parse_module(ASYNC), [[x] for x in xs])
    for d, (reduced, gathered, permuted) in enumerate(outs):
        np.testing.assert_array_equal(reduced, sum(xs))
        np.testing.assert_array_equal(gathered, np.concatenate(xs))
        want = {0: xs[3], 3: xs[0]}.get(d, np.zeros(2, np.int32))
        np.testing.assert_array_equal(permuted, want)


def test_cross_replica_and_partition_groups() -> None:
    text = """
HloModule crp, replica_count=2, num_partitions=2
sum { a = f32[] parameter(0)
      b = f32[] parameter(1)
      ROOT s = f32[] add(a, b) }
ENTRY main {
  x = f32[] parameter(0)
  across = f32[] all-reduce(x), channel_id=1, replica_groups={{0},{1}}, to_apply=sum
  replicas = f32[] all-reduce(x), replica_groups={{0,1}}, to_apply=sum
  ROOT out = (f32[], f32[]) tuple(across, replicas)
}
"""
    xs = [np.float32(10**d) for d in range(4)]  # device d = replica d // 2, partition d % 2
    outs = evaluate_spmd(parse_module(text), [[x] for x in xs])
    for d, (across, replicas) in enumerate(outs):
        r, p = divmod(d, 2)
        assert across == xs[2 * r] + xs[2 * r + 1]  # replica r with all its partitions
        assert replicas == xs[p] + xs[2 + p]  # the same partition of both replicas


DEADLOCK = """
HloModule deadlock, replica_count=2
sum { a = f32[] parameter(0)
      b = f32[] parameter(1)
      ROOT s = f32[] add(a, b) }
reduce_it { v = f32[] parameter(0)
            ROOT r = f32[] all-reduce(v), replica_groups={}, to_apply=sum }
skip { v = f32[] parameter(0)
       ROOT r = f32[] negate(v) }
ENTRY main {
  x = f32[] parameter(0)
  id = u32[] replica-id()
  zero = u32[] constant(0)
  first = pred[] compare(id, zero), direction=EQ
  ROOT c = f32[] conditional(first, x, x), true_computation=reduce_it, false_computation=skip
}
"""


def test_collective_not_reached_by_every_device_is_a_deadlock_error() -> None:
    start = time.monotonic()
    with pytest.raises(
        CollectiveError,
        match=r"^%r \(all-reduce, line 7\): deadlock: the devices cannot all reach the same collective; "
        r"devices \[0\] wait at %r; devices \[1\] finished the program$",
    ):
        evaluate_spmd(parse_module(DEADLOCK), [[np.float32(1)], [np.float32(2)]])
    assert time.monotonic() - start < 5


def test_devices_at_different_collectives_are_reported() -> None:
    text = DEADLOCK.replace(
        "skip { v = f32[] parameter(0)\n       ROOT r = f32[] negate(v) }",
        "skip { v = f32[] parameter(0)\n       ROOT other = f32[] all-reduce(v), replica_groups={}, to_apply=sum }",
    )
    with pytest.raises(CollectiveError, match=r"deadlock: .*; devices \[0\] wait at %r; devices \[1\] wait at %other$"):
        evaluate_spmd(parse_module(text), [[np.float32(1)], [np.float32(2)]])


def test_failing_device_stops_the_others() -> None:
    text = """
HloModule fail, replica_count=2
sum { a = f32[] parameter(0)
      b = f32[] parameter(1)
      ROOT s = f32[] add(a, b) }
ENTRY main {
  x = f32[] parameter(0)
  t = token[] after-all()
  i = (f32[], token[]) infeed(t)
  v = f32[] get-tuple-element(i), index=0
  ROOT r = f32[] all-reduce(v), replica_groups={}, to_apply=sum
}
"""
    from tpusim.compiler.hlo.reference import EvaluationError, Host

    hosts = [Host(infeed=[np.float32(1)]), Host()]  # device 1 has no infeed data
    with pytest.raises(EvaluationError, match=r"^%i \(infeed, line 9\): the infeed queue of device 1 is empty"):
        evaluate_spmd(parse_module(text), [[np.float32(0)], [np.float32(0)]], host=hosts)


def test_bad_groups_and_device_counts() -> None:
    text = REPLICATED.replace("replica_groups={{0,2},{1,3}}", "replica_groups={{0,2},{1,5}}")
    with pytest.raises(CollectiveError, match=r"cross-replica group \[1, 5\] names id 5, but the run has only 4"):
        evaluate_spmd(parse_module(text, verify=False), [[np.zeros(2, np.float32)]] * 4)
    with pytest.raises(InputError, match=r"replicated is a program for 4 replicas x 1 partitions; run it with "
                       r"evaluate_spmd \(command line: --replicas 4\)"):  # fmt: skip
        evaluate(parse_module(REPLICATED), [np.zeros(2, np.float32)])
    with pytest.raises(InputError, match=r"3 devices but inputs for 4 devices"):
        evaluate_spmd(parse_module(REPLICATED), [[np.zeros(2, np.float32)]] * 4, num_devices=3)


def test_ragged_all_to_all_follows_the_jax_docstring_example() -> None:
    """XLA CPU cannot run ragged-all-to-all; this is the worked example of jax.lax.ragged_all_to_all's docs."""
    text = """
HloModule ragged, num_partitions=2
ENTRY main {
  operand = s32[3] parameter(0)
  output = s32[4] parameter(1)
  in_off = s32[2] parameter(2)
  send = s32[2] parameter(3)
  out_off = s32[2] parameter(4)
  recv = s32[2] parameter(5)
  ROOT r = s32[4] ragged-all-to-all(operand, output, in_off, send, out_off, recv), channel_id=1, replica_groups={{0,1}}
}
"""
    i32 = partial(np.array, dtype=np.int32)
    device0 = [i32([1, 2, 2]), i32([0, 0, 0, 0]), i32([0, 1]), i32([1, 2]), i32([0, 0]), i32([1, 1])]
    device1 = [i32([3, 4, 0]), i32([0, 0, 0, 0]), i32([0, 1]), i32([1, 1]), i32([1, 2]), i32([2, 1])]
    (r0,), (r1,) = evaluate_spmd(parse_module(text), [device0, device1])
    assert r0.tolist() == [1, 3, 0, 0] and r1.tolist() == [2, 2, 4, 0]


def test_wait_at_a_collective_can_be_bounded_by_a_timeout() -> None:
    text = """
HloModule slow, replica_count=2
sum { a = f32[] parameter(0)
      b = f32[] parameter(1)
      ROOT s = f32[] add(a, b) }
cond { s = (s32[], f32[]) parameter(0)
       i = s32[] get-tuple-element(s), index=0
       n = s32[] constant(5000)
       ROOT lt = pred[] compare(i, n), direction=LT }
body { s = (s32[], f32[]) parameter(0)
       i = s32[] get-tuple-element(s), index=0
       v = f32[] get-tuple-element(s), index=1
       one = s32[] constant(1)
       j = s32[] add(i, one)
       w = f32[] add(v, v)
       ROOT t = (s32[], f32[]) tuple(j, w) }
ENTRY main {
  x = f32[] parameter(0)
  id = u32[] replica-id()
  start = s32[] convert(id)
  big = s32[] constant(5000)
  init = s32[] subtract(big, start)
  first = s32[] multiply(init, start)
  s0 = (s32[], f32[]) tuple(first, x)
  loop = (s32[], f32[]) while(s0), condition=cond, body=body
  v = f32[] get-tuple-element(loop), index=1
  ROOT r = f32[] all-reduce(v), replica_groups={}, to_apply=sum
}
"""
    # replica 0 starts its loop at 0 (5000 iterations), replica 1 at 4999 (1 iteration): replica 1 waits
    with pytest.raises(CollectiveError, match=r"^%r \(all-reduce, line 27\): timed out after 0\.02 s: device 1 "
                       r"waits here; devices \[1\] wait at %r; devices \[0\] are still running$"):  # fmt: skip
        evaluate_spmd(parse_module(text), [[np.float32(1)], [np.float32(2)]], timeout=0.02)
