"""Write the programs of the timing-fidelity benchmark (``benchmarks/bench_fidelity.py``, issue 15).

    python scripts/make_fidelity_programs.py      # needs jax, flax and (for XLA's estimates) libtpu

Writes ``benchmarks/programs/``: the flax GPT decoder block of the issue at d_model 1024, sequence 1024,
batch 8, 16 heads, in bf16 and in f32 (default precision), as the unoptimised HLO text JAX hands a TPU, and
``decoder.json`` with XLA:TPU's own estimate of each (``optimal_seconds``, ConcatBitcast-corrected) for v5e
and v6e; and four (and, gzipped, 32) bf16 blocks in a row for the scale benchmark
(``benchmarks/bench_scale.py``). The matmul programs of the benchmark are written by the benchmark itself (one
line of HLO each).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from make_corpus import TOPOLOGIES, Decoder, compiled  # noqa: E402

OUT = ROOT / "benchmarks" / "programs"
D, S, B, H = 1024, 1024, 8, 16


def decoder(dtype: Any) -> tuple[Any, list[jax.ShapeDtypeStruct]]:
    """The block as a function of its flat parameters and input, and their shapes."""
    mod = Decoder(H, dtype)
    x = jax.ShapeDtypeStruct((B, S, D), dtype)
    params = jax.eval_shape(lambda: mod.init(jax.random.key(0), jnp.zeros(x.shape, x.dtype)))
    flat, tree = jax.tree.flatten(params)

    def fn(*args: Any) -> Any:
        return mod.apply(jax.tree.unflatten(tree, args[:-1]), args[-1])

    return fn, [jax.ShapeDtypeStruct(p.shape, p.dtype) for p in flat] + [x]


def stacked(dtype: Any, layers: int) -> tuple[Any, list[jax.ShapeDtypeStruct]]:
    """``layers`` blocks one after another (each with its own parameters), as a function of their flat
    parameters and the input, and their shapes: the scale benchmark's bigger program (issue 17)."""
    mods = [Decoder(H, dtype) for _ in range(layers)]
    x = jax.ShapeDtypeStruct((B, S, D), dtype)
    trees = []
    specs: list[jax.ShapeDtypeStruct] = []
    for mod in mods:
        params = jax.eval_shape(lambda mod=mod: mod.init(jax.random.key(0), jnp.zeros(x.shape, x.dtype)))
        flat, tree = jax.tree.flatten(params)
        trees.append((tree, len(flat)))
        specs += [jax.ShapeDtypeStruct(p.shape, p.dtype) for p in flat]

    def fn(*args: Any) -> Any:
        h, at = args[-1], 0
        for mod, (tree, n) in zip(mods, trees):
            h = mod.apply(jax.tree.unflatten(tree, args[at : at + n]), h)
            at += n
        return h

    return fn, [*specs, x]


def write_stacked(layers: int = 4, compressed: bool = False) -> Path:
    """Write ``decoder_d1024_bf16_{layers}layers.hlo`` (``.hlo.gz`` when ``compressed``; no XLA estimate: the
    benchmark that runs it measures tpusim's own speed and memory)."""
    fn, specs = stacked(jnp.bfloat16, layers)
    lowered = jax.jit(fn, keep_unused=True).trace(*specs).lower(lowering_platforms=("tpu",))
    text = lowered.as_text(dialect="hlo")
    path = OUT / f"decoder_d1024_bf16_{layers}layers.hlo"
    if compressed:
        path = path.with_suffix(".hlo.gz")
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)
    return path


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    facts: dict[str, Any] = {"about": f"flax GPT decoder block, d_model {D}, seq {S}, batch {B}, {H} heads"}
    for name, dtype in (("bf16", jnp.bfloat16), ("f32", jnp.float32)):
        fn, specs = decoder(dtype)
        lowered = jax.jit(fn, keep_unused=True).trace(*specs).lower(lowering_platforms=("tpu",))
        path = OUT / f"decoder_d1024_{name}.hlo"
        path.write_text(lowered.as_text(dialect="hlo"))
        facts[name] = {"flops": 2 * B * S * 12 * D * D + 4 * B * S * S * D, "xla": {}}
        for chip in TOPOLOGIES:
            try:
                _, xla = compiled(fn, specs, chip)
            except Exception as err:  # libtpu absent: the estimates stay out
                print(f"{name} {chip}: no XLA estimate ({type(err).__name__}: {err})", file=sys.stderr)
                continue
            facts[name]["xla"][chip] = xla["optimal_seconds"]
        print(f"{path}: XLA estimates {facts[name]['xla']}")
    (OUT / "decoder.json").write_text(json.dumps(facts, indent=1) + "\n")
    print(write_stacked())
    print(write_stacked(32, compressed=True))  # (bench_scale.py --large: 2.8 M instructions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
