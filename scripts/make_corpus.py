"""Generate the XLA:TPU corpus under ``tests/data/corpus/``: real JAX programs, each as JAX lowers it for a TPU
and as XLA's own TPU compiler compiles it, with XLA's cost estimates and JAX's outputs.

    python scripts/make_corpus.py               # (re)write every program (needs libtpu: pip install 'jax[tpu]')
    python scripts/make_corpus.py --only NAME   # one program
    python scripts/make_corpus.py --list        # the programs, a line each

For every program NAME the folder ``tests/data/corpus/NAME/`` holds:

- ``unoptimised.hlo.gz``: ``jax.jit(f).trace(...).lower(lowering_platforms=("tpu",))`` as HLO text, the module
  a TPU receives before XLA optimises it (what ``tpusim.simulate_jax`` compiles with tpusim's own compiler);
- ``v5e.hlo.gz`` and ``v6e.hlo.gz``: the module XLA:TPU compiles for that chip (``libtpu``, JAX's deviceless
  ahead-of-time compilation for the ``v5e:1x1`` and ``v6e:1x1`` topologies): its fusions, tiled layouts, VMEM
  ``S(1)`` buffers, prefetches and per-fusion ``estimated_cycles``;
- ``outputs.npz``: JAX's outputs (``jax.jit`` on the CPU) for the seeded inputs: of each output ``out<i>`` at
  most :data:`SAMPLES` elements at the flat positions :func:`sample_positions` picks (all of a small output),
  so the corpus stays a few MB; ``program.json`` adds each whole output's sum, sum of squares and largest
  magnitude;
- ``program.json``: what the program is, its arguments (shape, dtype and the distribution the inputs are
  drawn from, so a test makes the same inputs with numpy alone, see :func:`draw_inputs`), its outputs, and
  per chip XLA's ``cost_analysis()``: flops, bytes accessed and ``optimal_seconds``, with the two corrections
  XLA's figure needs (each ``ConcatBitcast`` custom-call counts -1 s in it and is added back; a ``while``
  body counts once, so loop programs also carry the estimate of a compile with the loop unrolled), and the
  versions of JAX, libtpu, flax and optax that made it.

XLA's estimate is XLA's cost model, not a measurement of a TPU: the corpus uses it to find where tpusim's
timing departs from what XLA believes, never as a number to fit.

Sizes are those of real models (128-multiple widths, several heads, a 4x MLP) but small enough that every
program simulates in seconds with numerics, so the suite can run them all.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# libtpu looks for a TPU host at import; deviceless AOT compilation needs none of that.
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

ROOT = Path(__file__).resolve().parent.parent
CORPUS_DIR = ROOT / "tests" / "data" / "corpus"
TOPOLOGIES = {"v5e": "v5e:1x1", "v6e": "v6e:1x1"}


@dataclass(frozen=True)
class Arg:
    """One flat argument and the distribution its seeded value is drawn from.

    ``kind`` is ``normal`` (``mean``, ``std``) or ``integers`` (``low`` to ``high``, exclusive)."""

    shape: tuple[int, ...]
    dtype: str
    kind: str = "normal"
    mean: float = 0.0
    std: float = 1.0
    low: int = 0
    high: int = 0
    path: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "shape": list(self.shape), "dtype": self.dtype, "kind": self.kind}
        if self.kind == "normal":
            out |= {"mean": self.mean, "std": self.std}
        else:
            out |= {"low": self.low, "high": self.high}
        return out


def draw_inputs(args: list[dict[str, Any]], seed: int) -> list[np.ndarray]:
    """The seeded inputs of a program, from its ``program.json`` argument list (numpy alone: tests use the same
    rule, ``tests/corpus.py``)."""
    import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)

    rng = np.random.default_rng(seed)
    out = []
    for a in args:
        shape = tuple(a["shape"])
        if a["kind"] == "normal":
            value = rng.normal(a["mean"], a["std"], shape).astype(np.float32).astype(a["dtype"])
        else:
            value = rng.integers(a["low"], a["high"], shape).astype(a["dtype"])
        out.append(np.asarray(value))
    return out


SAMPLES = 16384
"""Elements of each output kept in ``outputs.npz``."""


def sample_positions(size: int, samples: int = SAMPLES) -> np.ndarray:
    """The flat positions of an output of ``size`` elements the corpus keeps: all of them when there are at
    most ``samples``, else half on a regular stride and half drawn at random (seeded by the size), so that
    both a regular pattern and one that no layout period aliases are covered."""
    if size <= samples:
        return np.arange(size, dtype=np.int64)
    regular = np.linspace(0, size - 1, samples // 2).astype(np.int64)
    drawn = np.random.default_rng(size).choice(size, samples // 2, replace=False).astype(np.int64)
    return np.unique(np.concatenate([regular, drawn]))


def output_facts(value: np.ndarray) -> dict[str, Any]:
    """What ``program.json`` records of a whole output (in float64, NaN-free outputs assumed)."""
    wide = np.asarray(value).astype(np.float64)
    return {
        "shape": list(value.shape),
        "dtype": str(value.dtype),
        "sum": float(wide.sum()),
        "sum_squares": float((wide * wide).sum()),
        "max_abs": float(np.abs(wide).max()) if wide.size else 0.0,
    }


@dataclass(frozen=True)
class Program:
    """A corpus program: a JAX function of flat arguments."""

    name: str
    about: str
    fn: Callable[..., Any]
    args: tuple[Arg, ...]
    unrolled: Callable[..., Any] | None = None  # the same function with its loops unrolled (XLA's estimate)
    tags: tuple[str, ...] = field(default=())


PROGRAMS: dict[str, Program] = {}


def program(name: str, about: str, fn: Callable[..., Any], args: list[Arg], **kw: Any) -> None:
    PROGRAMS[name] = Program(name, about, fn, tuple(args), **kw)


def act(shape: tuple[int, ...], dtype: str) -> Arg:
    return Arg(tuple(shape), dtype)


def weight(shape: tuple[int, ...], dtype: str) -> Arg:
    return Arg(tuple(shape), dtype, std=float(1 / np.sqrt(np.prod(shape[:-1]))))


def ints(shape: tuple[int, ...], high: int, dtype: str = "int32") -> Arg:
    return Arg(tuple(shape), dtype, kind="integers", low=0, high=high)


def flax_program(
    name: str, about: str, module: nn.Module, inputs: list[Arg], method: str | None = None, **kw: Any
) -> None:
    """A flax module as a program of flat arguments: its parameters (in ``jax.tree`` order, drawn as a real
    initialisation would: kernels 1/sqrt(fan_in), scales and running variances near 1, biases and running
    means small), then ``inputs``."""
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in inputs]
    params = jax.eval_shape(lambda *xs: module.init(jax.random.key(0), *xs), *specs)
    leaves, tree = jax.tree_util.tree_flatten_with_path(params)
    param_args = []
    for path, leaf in leaves:
        label = jax.tree_util.keystr(path)
        dtype = str(leaf.dtype)
        if label.endswith(("['scale']", "['var']")):  # (a BatchNorm's running variance must be positive)
            param_args.append(Arg(leaf.shape, dtype, mean=1.0, std=0.1, path=label))
        elif label.endswith(("['bias']", "['mean']")):
            param_args.append(Arg(leaf.shape, dtype, std=0.02, path=label))
        elif label.endswith("['embedding']"):
            param_args.append(Arg(leaf.shape, dtype, std=1.0, path=label))
        else:
            fan_in = int(np.prod(leaf.shape[:-1])) if len(leaf.shape) > 1 else 1
            param_args.append(Arg(leaf.shape, dtype, std=float(1 / np.sqrt(fan_in)), path=label))
    n = len(param_args)
    treedef = tree

    def fn(*flat: Any) -> Any:
        p = jax.tree_util.tree_unflatten(treedef, flat[:n])
        return module.apply(p, *flat[n:]) if method is None else module.apply(p, *flat[n:], method=method)

    program(name, about, fn, param_args + list(inputs), **kw)


# ------------------------------------------------------------------------------------------------ programs
BF16, F32 = "bfloat16", "float32"


def _matmul(a: Any, b: Any) -> Any:
    return a @ b


program("matmul_bf16", "bf16 matmul 2048 x 2048 x 2048", _matmul, [act((2048, 2048), BF16), weight((2048, 2048), BF16)])
program(
    "matmul_rhs_transposed_bf16",
    "bf16 matmul with a transposed right operand, x @ w.T, 2048^3",
    lambda a, b: a @ b.T,
    [act((2048, 2048), BF16), weight((2048, 2048), BF16)],
)
program(
    "matmul_relu_bf16",
    "bf16 matmul with a ReLU epilogue, relu(x @ w), 2048^3",
    lambda a, b: jax.nn.relu(a @ b),
    [act((2048, 2048), BF16), weight((2048, 2048), BF16)],
)
program(
    "batched_matmul_f32_highest",
    "f32 batched matmul at HIGHEST precision, [8,256,512] x [8,512,256]",
    lambda a, b: jnp.matmul(a, b, precision=lax.Precision.HIGHEST),
    [act((8, 256, 512), F32), weight((8, 512, 256), F32)],
)
program(
    "einsum_heads_bf16",
    'the attention head projection einsum("bsd,dhk->bshk"), x[4,256,512], w[512,8,64], bf16',
    lambda x, w: jnp.einsum("bsd,dhk->bshk", x, w),
    [act((4, 256, 512), BF16), weight((512, 8, 64), BF16)],
)
flax_program(
    "mlp_bf16",
    "flax MLP: Dense 1024 -> 4096, relu, Dense 4096 -> 1024, bf16, x[512,1024]",
    nn.Sequential([nn.Dense(4096, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16), nn.relu,
                   nn.Dense(1024, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)]),
    [act((512, 1024), BF16)],
)  # fmt: skip
flax_program(
    "layernorm_bf16",
    "flax LayerNorm over the last axis of bf16 x[8,512,1024] (statistics in f32)",
    nn.LayerNorm(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16),
    [act((8, 512, 1024), BF16)],
)
program(
    "softmax_f32",
    "softmax over the last axis of f32 attention scores [4,8,256,256]",
    lambda x: jax.nn.softmax(x, axis=-1),
    [act((4, 8, 256, 256), F32)],
)
program(
    "gelu_bias_f32",
    "bias add and GELU (tanh form), memory bound, f32 x[2048,2048]",
    lambda x, b: jax.nn.gelu(x + b),
    [act((2048, 2048), F32), Arg((2048,), F32, std=0.02)],
)


class RmsSwiGlu(nn.Module):
    """RMSNorm, then a SwiGLU MLP (LLaMA style): w2(silu(w1 x) * w3 x), with a residual."""

    hidden: int
    dtype: Any = jnp.bfloat16

    @nn.compact
    def __call__(self, x: Any) -> Any:
        h = nn.RMSNorm(dtype=self.dtype, param_dtype=self.dtype)(x)
        dense = dict(use_bias=False, dtype=self.dtype, param_dtype=self.dtype)
        gate = nn.Dense(self.hidden, **dense)(h)
        up = nn.Dense(self.hidden, **dense)(h)
        return x + nn.Dense(x.shape[-1], **dense)(nn.silu(gate) * up)


flax_program(
    "rmsnorm_swiglu_bf16",
    "RMSNorm + SwiGLU MLP (512 -> 1536 -> 512) with a residual, bf16, x[4,256,512]",
    RmsSwiGlu(1536),
    [act((4, 256, 512), BF16)],
)


class Decoder(nn.Module):
    """A pre-norm GPT decoder block: LayerNorm, causal multi-head self-attention, residual; LayerNorm, GELU MLP
    (4x), residual."""

    heads: int
    dtype: Any

    @nn.compact
    def __call__(self, x: Any) -> Any:
        d = x.shape[-1]
        kw = dict(dtype=self.dtype, param_dtype=self.dtype)
        h = nn.LayerNorm(**kw)(x)
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
        x = x + nn.MultiHeadDotProductAttention(self.heads, **kw)(h, h, mask=mask)
        h = nn.LayerNorm(**kw)(x)
        h = nn.gelu(nn.Dense(4 * d, **kw)(h))
        return x + nn.Dense(d, **kw)(h)


class Attention(nn.Module):
    """LayerNorm and causal multi-head self-attention (flax), with a residual."""

    heads: int
    dtype: Any

    @nn.compact
    def __call__(self, x: Any) -> Any:
        kw = dict(dtype=self.dtype, param_dtype=self.dtype)
        h = nn.LayerNorm(**kw)(x)
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
        return x + nn.MultiHeadDotProductAttention(self.heads, **kw)(h, h, mask=mask)


flax_program(
    "attention_bf16",
    "flax LayerNorm + causal MultiHeadDotProductAttention, 8 heads, d512, s256, batch 4, bf16",
    Attention(8, jnp.bfloat16),
    [act((4, 256, 512), BF16)],
)
flax_program(
    "decoder_block_bf16",
    "flax pre-norm GPT decoder block (causal attention, 8 heads; GELU MLP 512 -> 2048), d512, s256, batch 4, bf16",
    Decoder(8, jnp.bfloat16),
    [act((4, 256, 512), BF16)],
)
flax_program(
    "decoder_block_f32",
    "the same decoder block in f32 (matmuls at the default precision)",
    Decoder(8, jnp.float32),
    [act((4, 256, 512), F32)],
)


class ConvNet(nn.Module):
    """A small residual conv net: 3x3 stem, two residual blocks of 3x3 convs with BatchNorm (inference), global
    average pool, dense classifier."""

    width: int
    dtype: Any

    @nn.compact
    def __call__(self, x: Any) -> Any:
        kw = dict(dtype=self.dtype, param_dtype=self.dtype)
        x = nn.relu(nn.Conv(self.width, (3, 3), **kw)(x))
        for _ in range(2):
            h = nn.Conv(self.width, (3, 3), use_bias=False, **kw)(x)
            h = nn.relu(nn.BatchNorm(use_running_average=True, **kw)(h))
            h = nn.Conv(self.width, (3, 3), use_bias=False, **kw)(h)
            h = nn.BatchNorm(use_running_average=True, **kw)(h)
            x = nn.relu(x + h)
        return nn.Dense(10, **kw)(x.mean(axis=(1, 2)))


flax_program(
    "resnet_block_bf16",
    "residual conv net: 3x3 stem to 128 channels, two residual blocks (3x3 conv, BatchNorm, relu), global pool, "
    "dense 10; bf16, batch 8 of 32x32x16",
    ConvNet(128, jnp.bfloat16),
    [act((8, 32, 32, 16), BF16)],
)
flax_program(
    "convnet_f32",
    "the same residual conv net, 64 channels, f32, batch 8 of 16x16x8",
    ConvNet(64, jnp.float32),
    [act((8, 16, 16, 8), F32)],
)
flax_program(
    "patch_embed_bf16",
    "ViT patch embedding: a 16x16 stride-16 convolution to 768 features, bf16, batch 8 of 224x224x3",
    nn.Conv(768, (16, 16), strides=(16, 16), padding="VALID", dtype=jnp.bfloat16, param_dtype=jnp.bfloat16),
    [act((8, 224, 224, 3), BF16)],
)
program(
    "depthwise_conv_bf16",
    "depthwise 3x3 convolution (MobileNet), 256 channels, bf16, batch 8 of 32x32",
    lambda x, k: lax.conv_general_dilated(
        x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=x.shape[-1]
    ),
    [act((8, 32, 32, 256), BF16), weight((3, 3, 1, 256), BF16)],
)
program(
    "int8_weight_matmul_bf16",
    "int8 weights dequantised to bf16 with a per-column scale, then x @ w: x[64,4096], w int8[4096,4096]",
    lambda x, w, s: x @ (w.astype(jnp.bfloat16) * s),
    [act((64, 4096), BF16), ints((4096, 4096), 127, "int8"), Arg((4096,), BF16, mean=0.01, std=0.001)],
)


class EmbedLmHead(nn.Module):
    """Token embedding, LayerNorm, tied LM head, and the mean cross-entropy of the next tokens."""

    vocab: int
    width: int
    dtype: Any = jnp.bfloat16

    @nn.compact
    def __call__(self, ids: Any, labels: Any) -> Any:
        embed = nn.Embed(self.vocab, self.width, dtype=self.dtype, param_dtype=self.dtype)
        h = nn.LayerNorm(dtype=self.dtype, param_dtype=self.dtype)(embed(ids))
        logits = embed.attend(h).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


flax_program(
    "embed_lm_head_bf16",
    "token embedding (vocab 8192, width 512), LayerNorm, tied LM head and mean cross-entropy; ids [4,128], bf16",
    EmbedLmHead(8192, 512),
    [ints((4, 128), 8192), ints((4, 128), 8192)],
)


def _gru_scan(unroll: bool) -> Callable[..., Any]:
    cell = nn.GRUCell(256)

    def fn(*flat: Any) -> Any:
        *params, h0, xs = flat
        p = jax.tree_util.tree_unflatten(_GRU_TREE, params)

        def step(h: Any, x: Any) -> tuple[Any, Any]:
            h, y = cell.apply(p, h, x)
            return h, y

        return lax.scan(step, h0, xs, unroll=unroll)

    return fn


_GRU_PARAMS = jax.eval_shape(
    lambda: nn.GRUCell(256).init(jax.random.key(0), jnp.zeros((64, 256)), jnp.zeros((64, 128)))
)
_GRU_LEAVES, _GRU_TREE = jax.tree_util.tree_flatten_with_path(_GRU_PARAMS)
program(
    "gru_scan_f32",
    "flax GRUCell (hidden 256) scanned over 16 steps of x[64,128], f32",
    _gru_scan(False),
    [
        *(
            Arg(leaf.shape, str(leaf.dtype), std=0.02 if leaf.ndim == 1 else float(1 / np.sqrt(leaf.shape[0])),
                path=jax.tree_util.keystr(p))
            for p, leaf in _GRU_LEAVES
        ),
        act((64, 256), F32),
        act((16, 64, 128), F32),
    ],
    unrolled=_gru_scan(True),
)  # fmt: skip


def _train_step(w1: Any, b1: Any, w2: Any, b2: Any, x: Any, y: Any) -> Any:
    params = {"w1": w1, "b1": b1, "w2": w2, "b2": b2}
    opt = optax.adam(1e-3)
    state = opt.init(params)

    def loss(p: Any) -> Any:
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    updates, state = opt.update(grads, state, params)
    return value, optax.apply_updates(params, updates)


program(
    "train_step_adam_f32",
    "one optax Adam step of a 2-layer MLP (256 -> 1024 -> 256) on a mean-squared loss: the loss and the new "
    "parameters; batch 256, f32",
    _train_step,
    [weight((256, 1024), F32), Arg((1024,), F32, std=0.02), weight((1024, 256), F32), Arg((256,), F32, std=0.02),
     act((256, 256), F32), act((256, 256), F32)],
)  # fmt: skip
program(
    "reduce_rows_f32",
    "row sums and row maxima of f32 x[4096,1024] (memory bound reductions along the lanes)",
    lambda x: (x.sum(-1), x.max(-1)),
    [act((4096, 1024), F32)],
)
program(
    "transpose_bf16",
    "a 2-D transpose of bf16 x[2048,2048] (the cross-lane unit's work)",
    lambda x: x.T + 1,
    [act((2048, 2048), BF16)],
)


# ------------------------------------------------------------------------------------------------ generation
def _flat_specs(prog: Program) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in prog.args]


def unoptimised(prog: Program) -> str:
    """The module JAX hands a TPU, before XLA optimises it."""
    lowered = jax.jit(prog.fn, keep_unused=True).trace(*_flat_specs(prog)).lower(lowering_platforms=("tpu",))
    text = lowered.as_text(dialect="hlo")
    if "{...}" in text:
        raise RuntimeError(f"{prog.name}: JAX elided a constant; the file would not be a complete program")
    return text


_TOPOLOGIES: dict[str, Any] = {}


def compiled(fn: Callable[..., Any], specs: list[jax.ShapeDtypeStruct], chip: str) -> tuple[str, dict[str, Any]]:
    """XLA:TPU's compiled module for ``chip`` and its cost analysis (with the ConcatBitcast correction)."""
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    if chip not in _TOPOLOGIES:
        _TOPOLOGIES[chip] = topologies.get_topology_desc(
            platform="tpu", topology_name=TOPOLOGIES[chip], chips_per_host_bounds=(1, 1, 1), num_slices=1
        )
    sharding = SingleDeviceSharding(_TOPOLOGIES[chip].devices[0])
    placed = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) for s in specs]
    exe = jax.jit(fn, keep_unused=True).trace(*placed).lower().compile()
    text = exe.as_text()
    cost = exe.cost_analysis()
    concats = text.count('custom_call_target="ConcatBitcast"')
    facts = {
        "flops": float(cost.get("flops", 0.0)),
        "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
        "optimal_seconds_raw": float(cost["optimal_seconds"]),
        "concat_bitcasts": concats,
        "optimal_seconds": float(cost["optimal_seconds"]) + concats,
    }
    return text, facts


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("jax", "jaxlib", "libtpu", "flax", "optax"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "absent"
    return out


def write_program(prog: Program, seed: int = 0) -> dict[str, Any]:
    out_dir = CORPUS_DIR / prog.name
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = _flat_specs(prog)
    _write_gz(out_dir / "unoptimised.hlo.gz", unoptimised(prog))
    xla: dict[str, Any] = {}
    for chip in TOPOLOGIES:
        text, facts = compiled(prog.fn, specs, chip)
        _write_gz(out_dir / f"{chip}.hlo.gz", text)
        if prog.unrolled is not None:
            _, unrolled = compiled(prog.unrolled, specs, chip)
            facts["unrolled_optimal_seconds"] = unrolled["optimal_seconds"]
        xla[chip] = facts
    arg_json = [a.to_json() for a in prog.args]
    inputs = draw_inputs(arg_json, seed)
    outputs = jax.tree.leaves(jax.jit(prog.fn, keep_unused=True)(*inputs))
    arrays = {f"out{i}": np.asarray(o) for i, o in enumerate(outputs)}
    samples = {k: _portable(v.reshape(-1)[sample_positions(v.size)]) for k, v in arrays.items()}
    np.savez_compressed(out_dir / "outputs.npz", **samples)
    meta = {
        "name": prog.name,
        "about": prog.about,
        "seed": seed,
        "args": arg_json,
        "outputs": [output_facts(a) for a in arrays.values()],
        "xla": xla,
        "versions": versions(),
    }
    (out_dir / "program.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def _portable(values: np.ndarray) -> np.ndarray:
    """``values`` as numpy stores them in ``.npz``: types numpy does not know (bfloat16, the float8 types) as
    unsigned integers of their width; ``program.json`` keeps the dtype to view them back."""
    if values.dtype.type.__module__.startswith("ml_dtypes"):
        return values.view(f"u{values.dtype.itemsize}")
    return values


def _write_gz(path: Path, text: str) -> None:
    # mtime=0: the same text gives the same bytes, so regenerating an unchanged program changes no file.
    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as gz:
        gz.write(text.encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="write only this program (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the programs")
    ns = parser.parse_args(argv)
    if ns.list:
        for p in PROGRAMS.values():
            print(f"{p.name:30s} {p.about}")
        return 0
    names = ns.only or list(PROGRAMS)
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown:
        parser.error(f"unknown programs {unknown}; --list shows them")
    for name in names:
        meta = write_program(PROGRAMS[name])
        est = ", ".join(f"{c} {m['optimal_seconds'] * 1e6:.1f} us" for c, m in meta["xla"].items())
        print(f"{name:30s} XLA estimate {est}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
