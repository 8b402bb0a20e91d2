"""Speed of the HLO front end on real modules of 1x, 4x and 16x the size, side by side.

    python benchmarks/bench_parser.py [--layers 16] [--repeat 3]

The modules are a transformer-like stack of ``layers`` blocks (RMS norm, attention, MLP) compiled by
XLA for the host CPU (the optimised form: fusions, ``%names``, metadata, stack-frame tables, printed with
large constants) and the same program in JAX's short form with debug info. 4x and 16x have 4 and 16
times the layers. Each figure is the best of ``repeat`` runs; MB is 10**6 characters of HLO text.
Parsing must stay at 2 MB/s or more and linear in size (the same MB/s at every size).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from typing import Any

SCALES = (1, 4, 16)


def _block(x: Any, w1: Any, w2: Any, g: Any) -> Any:
    import jax
    import jax.numpy as jnp

    h = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g
    q = h @ w1
    a = jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, q) / 8.0, -1)
    return x + jax.nn.gelu(jnp.einsum("bqk,bkd->bqd", a, q) @ w2)


def make_texts(layers: int) -> dict[str, str]:
    """The optimised and the short-form HLO text of a ``layers``-block model."""
    import jax
    import jax.numpy as jnp
    from jax._src.lib import xla_client

    def model(x: Any, w1: Any, w2: Any, g: Any) -> Any:
        for i in range(layers):
            x = _block(x, w1 * (i + 1), w2, g)
        return x

    args = (jnp.ones((2, 16, 64)), jnp.ones((64, 64)), jnp.ones((64, 64)), jnp.ones((64,)))
    lowered = jax.jit(model).lower(*args)
    options = xla_client.hlo.HloPrintOptions()
    options.print_large_constants = True
    modules = lowered.compile().runtime_executable().hlo_modules()
    return {
        "optimized": "\n\n".join(m.to_string(options) for m in modules),
        "short+debug": lowered.as_text(dialect="hlo", debug_info=True),
    }


def best_seconds(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16, help="layers of the 1x model (default 16)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement, the best is shown")
    args = parser.parse_args(argv)

    from tpusim.compiler.hlo import parse_module, print_module, verify_module

    start = time.perf_counter()
    texts = {scale: make_texts(args.layers * scale) for scale in SCALES}
    print(f"generated the modules with JAX/XLA in {time.perf_counter() - start:.1f} s\n")

    header = f"{'form':<12} {'measure':<16}" + "".join(f"{f'{s}x':>12}" for s in SCALES)
    print(header)
    print("-" * len(header))
    for form in texts[1]:
        sizes = [len(texts[s][form]) / 1e6 for s in SCALES]
        modules = {s: parse_module(texts[s][form], verify=False) for s in SCALES}
        counts = [sum(len(c.instructions) for c in modules[s].computations) for s in SCALES]
        rows: dict[str, list[float]] = {"parse MB/s": [], "verify MB/s": [], "parse+verify MB/s": [], "print MB/s": []}
        for s, mb in zip(SCALES, sizes):
            text, module = texts[s][form], modules[s]
            parse = best_seconds(lambda t=text: parse_module(t, verify=False), args.repeat)
            verify = best_seconds(lambda m=module: verify_module(m), args.repeat)
            printing = best_seconds(lambda m=module: print_module(m), args.repeat)
            rows["parse MB/s"].append(mb / parse)
            rows["verify MB/s"].append(mb / verify)
            rows["parse+verify MB/s"].append(mb / (parse + verify))
            rows["print MB/s"].append(mb / printing)
        print(f"{form:<12} {'size MB':<16}" + "".join(f"{mb:>12.2f}" for mb in sizes))
        print(f"{'':<12} {'instructions':<16}" + "".join(f"{n:>12d}" for n in counts))
        for name, values in rows.items():
            print(f"{'':<12} {name:<16}" + "".join(f"{v:>12.2f}" for v in values))
        print()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
