"""Packing speed: tiled layouts against a numpy transpose-copy of the same array, measured side by side.

Target (issue 2): each direction within 5x of ``np.ascontiguousarray(a.T)`` on a 4096x4096 array.
Run: ``python benchmarks/bench_packing.py`` (prints one row per case; exit status 1 if a target is missed).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import ml_dtypes
import numpy as np

from tpusim.memory import pack, parse_shape, unpack

TARGET = 5.0


def best_of(fn: Callable[[], object], repeats: int = 7) -> float:
    fn()  # warm up caches and page in memory
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    rng = np.random.default_rng(0)
    cases = [
        ("bf16[4096,4096]{1,0:T(8,128)(2,1)}", ml_dtypes.bfloat16),
        ("f32[4096,4096]{1,0:T(8,128)}", np.float32),
    ]
    ok = True
    print(f"{'layout':38} {'transpose-copy':>15} {'pack':>10} {'ratio':>6} {'unpack':>10} {'ratio':>6}")
    for text, dtype in cases:
        shape = parse_shape(text)
        values = rng.standard_normal((4096, 4096), dtype=np.float32).astype(dtype)
        packed = pack(values, shape)  # type: ignore[arg-type]
        assert np.array_equal(unpack(packed, shape).view(np.uint8), values.view(np.uint8))
        baseline = best_of(lambda v=values: np.ascontiguousarray(v.T))
        t_pack = best_of(lambda v=values, s=shape: pack(v, s))  # type: ignore[misc]
        t_unpack = best_of(lambda p=packed, s=shape: unpack(p, s))  # type: ignore[misc]
        r_pack, r_unpack = t_pack / baseline, t_unpack / baseline
        ok &= r_pack <= TARGET and r_unpack <= TARGET
        print(f"{text:38} {baseline * 1e3:12.1f} ms {t_pack * 1e3:7.1f} ms {r_pack:5.2f}x "
              f"{t_unpack * 1e3:7.1f} ms {r_unpack:5.2f}x")  # fmt: skip
    print(f"target: each ratio <= {TARGET}x -> {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
