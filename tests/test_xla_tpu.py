"""XLA's own TPU compiler as a front end (tpusim/xla_tpu.py, ``compiler="xla"``) and XLA's estimates in the
reports. Compiling needs libtpu (``pip install 'jax[tpu]'``, Google's licence: optional); the tests that
compile are skipped without it. The corpus's compiled modules carry XLA's per-kernel estimates in their text,
so the reports' comparison is tested without libtpu."""

from __future__ import annotations

import builtins
import importlib.util

import pytest
from corpus import load

import tpusim
from tpusim.report.summary import format_summary
from tpusim.report.xla_compare import xla_kernels
from tpusim.xla_tpu import LibtpuMissingError, XlaCompileError, chip_topology

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed (pip install 'jax[tpu]')")

MLP = """HloModule mlp
ENTRY main {
  x = bf16[256,512] parameter(0)
  w = bf16[512,1024] parameter(1)
  d = bf16[256,1024] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  z = bf16[] constant(0)
  zs = bf16[256,1024] broadcast(z), dimensions={}
  ROOT r = bf16[256,1024] maximum(d, zs)
}
"""


def test_topologies_of_the_shipped_chips() -> None:
    assert chip_topology("tpu_v5e", 1) == "v5e:1x1"
    assert chip_topology("tpu_v6e", 4) == "v6e:2x2"
    assert chip_topology("tpu_v5p", 8) == "v5p:2x2x2"
    assert chip_topology("tpu_v5p", 4, (4, 1)) == "v5p:4x1x1"
    with pytest.raises(XlaCompileError, match=r"teaching.*none of them"):
        chip_topology("teaching", 1)


def test_without_libtpu_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_libtpu(name: str, *args: object, **kwargs: object) -> object:
        if name == "libtpu":
            raise ImportError("No module named 'libtpu'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_libtpu)
    with pytest.raises(LibtpuMissingError, match=r"pip install 'jax\[tpu\]'.*compiler='tpusim'"):
        tpusim.simulate(MLP, config="tpu_v5e", compiler="xla", timing_only=True)


def test_an_unknown_compiler_is_refused() -> None:
    with pytest.raises(tpusim.InputError, match="compiler must be one of tpusim, xla"):
        tpusim.simulate(MLP, compiler="gcc")


def test_reports_put_xla_kernel_estimates_beside_tpusim_for_a_compiled_module() -> None:
    program = load("decoder_block_bf16")
    result = tpusim.simulate(program.hlo("v5e"), config="tpu_v5e", timing_only=True)
    kernels = xla_kernels(result)
    assert len(kernels) > 10
    assert abs(sum(k.xla_share for k in kernels) - 1) < 1e-9
    assert all(k.tpusim_cycles > 0 for k in kernels[:5])  # tpusim ran (its parts of) each big kernel
    text = format_summary(result)
    assert "XLA:TPU's estimates (XLA's cost model, not a measurement):" in text
    assert kernels[0].name in text


@needs_libtpu
def test_simulate_with_xla_runs_xlas_compiled_module_and_reports_its_estimate() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((256, 512)) / 8).astype("bfloat16")
    w = (rng.standard_normal((512, 1024)) / 8).astype("bfloat16")
    result = tpusim.simulate(MLP, [x, w], config="tpu_v5e", compiler="xla")
    assert result.xla is not None and result.xla.topology == "v5e:1x1" and result.xla.optimal_seconds > 0
    assert "is_scheduled=true" in result.xla.text
    assert result.compiled.source.attributes.get("entry_computation_layout") is not None
    assert not result.fallbacks
    want = np.maximum(x.astype(np.float32) @ w.astype(np.float32), 0)
    np.testing.assert_allclose(np.asarray(result.outputs[0], np.float32), want, atol=0.05, rtol=0.02)
    assert "program: XLA optimal_seconds" in format_summary(result)


@needs_libtpu
def test_simulate_jax_with_xla() -> None:
    import jax.numpy as jnp

    result = tpusim.simulate_jax(lambda a: jnp.tanh(a) * 2, jnp.ones((8, 128)), compiler="xla", config="tpu_v6e")
    assert result.xla is not None and result.xla.topology == "v6e:1x1"
    assert float(result.tree[0, 0]) == pytest.approx(2 * 0.7615941559557649, rel=1e-3)


SHARDED = """HloModule sharded_matmul

ENTRY main {
  a = bf16[512,1024]{1,0} parameter(0), sharding={devices=[2,2]<=[4]}
  b = bf16[1024,512]{1,0} parameter(1), sharding={devices=[2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate}
  ROOT d = bf16[512,512]{1,0} dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0},
    sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
}
"""


@needs_libtpu
def test_an_spmd_program_compiled_by_xla_for_four_chips_runs_on_four() -> None:
    """A matmul sharded over a 2x2 mesh: XLA:TPU partitions it for v5e:2x2 (one replica, a partition per chip:
    its device assignment, which a list of lists did not make) and tpusim runs the partitioned module, its
    all-reduce over the ICI, on four simulated chips; every chip's block equals the reference's."""
    import numpy as np

    from tpusim.compiler.hlo import parse_module
    from tpusim.compiler.hlo.reference import evaluate_spmd

    compiled = tpusim.simulate(SHARDED, config="tpu_v5e", compiler="xla", chips=4, topology=(2, 2), timing_only=True)
    assert compiled.xla is not None and compiled.xla.topology == "v5e:2x2"
    module = parse_module(compiled.xla.text)
    assert module.num_partitions == 4 and "all-reduce" in compiled.xla.text
    rng = np.random.default_rng(1)
    shards = [p.shape for p in module.entry_computation.parameters]
    per_chip = [[(rng.standard_normal(s.dimensions) / 8).astype("bfloat16") for s in shards] for _ in range(4)]
    stacked = [np.stack([chip[i] for chip in per_chip]) for i in range(len(shards))]
    result = tpusim.simulate(SHARDED, stacked, config="tpu_v5e", compiler="xla", chips=4, topology=(2, 2))
    want = evaluate_spmd(module, per_chip)
    for chip in range(4):
        got = np.asarray(result.outputs[0][chip], np.float32)
        np.testing.assert_allclose(got, np.asarray(want[chip][0], np.float32), rtol=2e-2, atol=2e-2)


# JAX's own lowering of a jitted matmul with NamedSharding inputs on a 2x4 mesh (JAX lowers with Shardy by
# default: shardings as xla.sdy.* attributes and custom calls, which XLA refused with Shardy off).
SHARDY = """HloModule jit__lambda, entry_computation_layout={(f32[32,256]{1,0}, f32[256,512]{1,0})->f32[32,512]{1,0}}, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["data"=2, "model"=4]>}}

ENTRY main.1 {
  x.1 = f32[32,256]{1,0} parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}, frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\\"data\\"}, {}]>"}
  w.1 = f32[256,512]{1,0} parameter(1), sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}, frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{}, {\\"model\\"}]>"}
  dot_general.2 = f32[32,512]{1,0} dot(x.1, w.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  dot_general.3 = f32[32,512]{1,0} custom-call(dot_general.2), custom_call_target="xla.sdy.FuncResultSharding", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{\\"data\\"}, {\\"model\\"}]>]>"}
  tuple.1 = (f32[32,512]{1,0}) tuple(dot_general.3)
  ROOT get-tuple-element.1 = f32[32,512]{1,0} get-tuple-element(tuple.1), index=0, sharding={devices=[2,4]<=[8]}
}
"""  # noqa: E501


@needs_libtpu
def test_a_module_jax_lowered_with_shardy_compiles_for_eight_chips() -> None:
    result = tpusim.simulate(SHARDY, config="tpu_v5e", compiler="xla", chips=8, topology=(2, 4), timing_only=True)
    assert result.xla is not None and result.xla.topology == "v5e:2x4"
    assert result.cycles > 0


@needs_libtpu
def test_xlas_module_is_printed_with_its_large_constants() -> None:
    """XLA prints a large constant as ``{...}`` by default, which no parser can read back: the module of a
    convolution with input dilation (whose mask XLA makes a constant) could not be run."""
    from tpusim.xla_tpu import compile_with_xla

    values = ", ".join("{" + ", ".join(str((i * 7 + j) % 5) for j in range(64)) + "}" for i in range(64))
    text = (
        "HloModule big_constant\nENTRY main {\n  x = f32[64,64] parameter(0)\n"
        f"  c = f32[64,64] constant({{{values}}})\n  ROOT r = f32[64,64] add(x, c)\n}}\n"
    )
    compiled = compile_with_xla(text, "tpu_v5e")
    assert "{...}" not in compiled.text
    result = tpusim.simulate(text, config="tpu_v5e", compiler="xla", timing_only=True)
    assert result.cycles > 0


@needs_libtpu
def test_an_f64_program_compiled_by_xla_is_refused_before_it_runs() -> None:
    """XLA:TPU computes f64 as pairs of f32 values (``X64SplitHigh``/``Low``, ``X64Combine`` of f64): the
    run failed half way in a fallback kernel (a bad-input campaign); tpusim models no such arithmetic, so it
    says so when XLA's module is read (its own compiler runs f64)."""
    text = "HloModule m\nENTRY main {\n  a = f64[8,16] parameter(0)\n  ROOT n = f64[8,16] multiply(a, a)\n}\n"
    with pytest.raises(tpusim.TpusimError, match=r"XLA:TPU computes f64 as pairs of f32 values"):
        tpusim.simulate(text, timing_only=True, compiler="xla")
    assert tpusim.simulate(text, timing_only=True).cycles > 0
