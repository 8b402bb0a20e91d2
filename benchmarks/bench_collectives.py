"""Collectives against the scaling book's formulas: formula, tpusim and error, one row per worked case.

Formulas (jax-ml/scaling-book, sharding.md; ``W`` the bidirectional bandwidth of one link,
``2 x ici.link_bandwidth_bytes_per_s``, ``V`` the whole array, ``n`` the axes a collective spans):

* AllGather / ReduceScatter over ``n`` torus axes: ``V / (W n)``; AllReduce twice that.
* AllToAll over a ring of ``N`` chips: ``V / (4 W)`` (each half sends a quarter of the data across the
  bisection).
* Point to point between the corners of a grid without wraparound: ``V / W`` (two ports, each one way).
* Over ``S`` slices joined by the data-center network (``dcn.slices``), a collective is hierarchical: the
  ICI axes as above, plus a ring over the slices that moves each chip's share of one slice's data,
  ``V / N_ici``, through the chip's DCN egress of ``B = dcn.bandwidth_bytes_per_s``: ``(S - 1) / S x V /
  (N_ici B)`` for a gather or a scatter, twice that for an all-reduce (the bandwidth-optimal ring bound,
  Patarasuk and Yuan, JPDC 2009). The phases run one after the other, so the times add.

Each run is timing-only on the shipped config. Rows whose error is large are open items of issue 16
(docs/multichip.md lists why). A second table runs async pairs with an independent matmul between their
start and their done: with perfect overlap the pair takes as long as the longer of the two alone.

    python benchmarks/bench_collectives.py
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import tpusim
from tpusim.config import load_config

SUM = "sum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n"
MIB = 2**20


@dataclass(frozen=True)
class Case:
    name: str
    chip: str
    topology: tuple[int, ...]
    kind: str
    nbytes: int  # V, the whole array
    groups: str  # replica_groups
    axes: int  # torus axes the group spans
    slices: int = 1  # slices of `topology` joined by DCN
    dcn_group: int = 1  # slices the group spans (with its ICI axes: N_ici chips per slice)

    @property
    def chips(self) -> int:
        chips = self.slices
        for n in self.topology:
            chips *= n
        return chips

    def program(self) -> str:
        chips = self.chips
        if self.kind == "collective-permute":  # groups: the source_target_pairs; V the array
            rows = self.nbytes // 4096
            body = (f"x = f32[{rows},1024] parameter(0)\n  ROOT r = f32[{rows},1024] collective-permute(x), "
                    f"source_target_pairs={self.groups}")  # fmt: skip
            return f"HloModule cp, replica_count={chips}\nENTRY main {{\n  {body}\n}}\n"
        group = chips if self.groups == "{}" else int(self.groups.split("]")[0].split(",")[1])
        cols = 1024
        rows = self.nbytes // (4 * cols)
        if self.kind == "all-gather":
            body = (f"x = f32[{rows // group},{cols}] parameter(0)\n  ROOT r = f32[{rows},{cols}] all-gather(x), "
                    f"replica_groups={self.groups}, dimensions={{0}}")  # fmt: skip
        elif self.kind == "reduce-scatter":
            body = (f"x = f32[{rows},{cols}] parameter(0)\n  ROOT r = f32[{rows // group},{cols}] reduce-scatter(x), "
                    f"replica_groups={self.groups}, dimensions={{0}}, to_apply=sum")  # fmt: skip
        elif self.kind == "all-reduce":
            body = (f"x = f32[{rows},{cols}] parameter(0)\n  ROOT r = f32[{rows},{cols}] all-reduce(x), "
                    f"replica_groups={self.groups}, to_apply=sum")  # fmt: skip
        else:  # all-to-all: every chip holds V / group and sends a 1/group slice to each
            per = rows // group
            body = (f"x = f32[{per},{cols}] parameter(0)\n  ROOT r = f32[{per},{cols}] all-to-all(x), "
                    f"replica_groups={self.groups}, dimensions={{0}}")  # fmt: skip
        return f"HloModule {self.kind}, replica_count={chips}\n{SUM}ENTRY main {{\n  {body}\n}}\n"

    def formula(self) -> float:
        cfg = load_config(self.chip)
        w = 2 * cfg.ici.link_bandwidth_bytes_per_s
        if self.kind == "all-to-all":
            return self.nbytes / (4 * w)
        if self.kind == "collective-permute":
            return self.nbytes / w
        once = self.nbytes / (w * self.axes) if self.axes else 0.0
        if self.dcn_group > 1:
            group = self.chips if self.groups == "{}" else int(self.groups.split("]")[0].split(",")[1])
            s = self.dcn_group
            once += (s - 1) / s * self.nbytes / (group // s) / cfg.dcn.bandwidth_bytes_per_s
        return 2 * once if self.kind == "all-reduce" else once


CASES = [
    Case("v4 4x4x4, AllGather over X and Y, 8 MiB", "tpu_v4", (4, 4, 4), "all-gather", 8 * MIB,
         "[4,16]<=[16,4]T(1,0)", 2),
    Case("v4 4x4x4, AllReduce over Z, 512 KiB", "tpu_v4", (4, 4, 4), "all-reduce", MIB // 2, "[16,4]<=[64]", 1),
    Case("v4 4x4, AllGather over both axes, 64 MiB", "tpu_v4", (4, 4), "all-gather", 64 * MIB, "{}", 2),
    Case("v4 4x4, ReduceScatter over both axes, 64 MiB", "tpu_v4", (4, 4), "reduce-scatter", 64 * MIB, "{}", 2),
    Case("v4 4x4, AllReduce over both axes, 64 MiB", "tpu_v4", (4, 4), "all-reduce", 64 * MIB, "{}", 2),
    Case("v4 4x4x4, AllGather over X, Y and Z, 64 MiB", "tpu_v4", (4, 4, 4), "all-gather", 64 * MIB, "{}", 3),
    Case("v4 4x4x4, ReduceScatter over X, Y and Z, 64 MiB", "tpu_v4", (4, 4, 4), "reduce-scatter", 64 * MIB, "{}", 3),
    Case("v4 4x4x4, AllReduce over X, Y and Z, 64 MiB", "tpu_v4", (4, 4, 4), "all-reduce", 64 * MIB, "{}", 3),
    Case("v5e 16 ring, AllReduce, 64 MiB", "tpu_v5e", (16,), "all-reduce", 64 * MIB, "{}", 1),
    Case("v5e 16x16, AllReduce over both axes, 64 MiB", "tpu_v5e", (16, 16), "all-reduce", 64 * MIB, "{}", 2),
    Case("v5e 16 ring, AllToAll, 8 MiB per chip", "tpu_v5e", (16,), "all-to-all", 128 * MIB, "{}", 1),
    Case("v5e 4x4 without wraparound, point to point corner to corner, 16.8 MB", "tpu_v5e", (4, 4),
         "collective-permute", 16_797_696, "{{0,15}}", 2),
    Case("v5e 2 slices of a 16 ring, AllReduce across the slices, 8 MiB", "tpu_v5e", (16,), "all-reduce", 8 * MIB,
         "[16,2]<=[2,16]T(1,0)", 0, 2, 2),
    Case("v5e 2 slices of a 16 ring, AllGather over all 32 chips, 64 MiB", "tpu_v5e", (16,), "all-gather",
         64 * MIB, "{}", 1, 2, 2),
    Case("v5e 2 slices of a 16 ring, ReduceScatter over all 32 chips, 64 MiB", "tpu_v5e", (16,), "reduce-scatter",
         64 * MIB, "{}", 1, 2, 2),
    Case("v5e 2 slices of a 16 ring, AllReduce over all 32 chips, 64 MiB", "tpu_v5e", (16,), "all-reduce",
         64 * MIB, "{}", 1, 2, 2),
]  # fmt: skip


@dataclass(frozen=True)
class Overlap:
    """An async pair of ``kind`` over 16 MiB on a v5e ring of 8 with a bf16 ``n``^3 matmul between its start
    and its done that does not need it."""

    kind: str
    n: int

    def program(self, collective: bool, matmul: bool) -> str:
        if self.kind == "all-gather":
            x, res = "f32[512,1024]", "f32[4096,1024]"
            start = f"s = ({x}, {res}) all-gather-start(x), replica_groups={{}}, dimensions={{0}}"
        else:
            x = res = "f32[4096,1024]"
            start = f"s = {res} all-reduce-start(x), replica_groups={{}}, to_apply=sum"
        n = self.n
        body = [f"x = {x} parameter(0)", f"a = bf16[{n},{n}] parameter(1)", f"b = bf16[{n},{n}] parameter(2)"]
        roots, shapes = [], []
        if collective:
            body.append(start)
        if matmul:
            body.append(f"m = bf16[{n},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}")
            roots, shapes = ["m"], [f"bf16[{n},{n}]"]
        if collective:
            body.append(f"g = {res} {self.kind}-done(s)")
            roots, shapes = ["g", *roots], [res, *shapes]
        body.append(f"ROOT t = ({', '.join(shapes)}) tuple({', '.join(roots)})")
        lines = "\n  ".join(body)
        return f"HloModule overlap, replica_count=8\n{SUM}ENTRY main {{\n  {lines}\n}}\n"

    def seconds(self, collective: bool, matmul: bool) -> float:
        program = self.program(collective, matmul)
        return tpusim.simulate(program, chips=8, topology=(8,), config="tpu_v5e", timing_only=True).seconds


OVERLAPS = [Overlap("all-gather", 2048), Overlap("all-reduce", 2048), Overlap("all-reduce", 4096)]


def main() -> None:
    print("| case | formula (us) | tpusim (us) | error | wall (s) |")
    print("| --- | --- | --- | --- | --- |")
    for case in CASES:
        began = time.perf_counter()
        result = tpusim.simulate(
            case.program(), chips=case.chips, topology=case.topology, config=case.chip, timing_only=True,
            overrides=[f"dcn.slices={case.slices}"],
        )  # fmt: skip
        wall = time.perf_counter() - began
        want = case.formula()
        print(
            f"| {case.name} | {want * 1e6:,.1f} | {result.seconds * 1e6:,.1f} | {result.seconds / want - 1:+.1%} "
            f"| {wall:.1f} |",
            flush=True,
        )
    print()
    print("Async pairs (v5e ring of 8, 16 MiB) with a bf16 matmul between start and done, against perfect overlap:")
    print()
    print("| pair | collective alone (us) | matmul alone (us) | both (us) | over the longer of the two | wall (s) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for o in OVERLAPS:
        began = time.perf_counter()
        alone, matmul, both = o.seconds(True, False), o.seconds(False, True), o.seconds(True, True)
        wall = time.perf_counter() - began
        bound = max(alone, matmul)
        print(
            f"| {o.kind}, {o.n}^3 matmul | {alone * 1e6:,.1f} | {matmul * 1e6:,.1f} | {both * 1e6:,.1f} "
            f"| {both / bound - 1:+.1%} | {wall:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
