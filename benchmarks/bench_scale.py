"""Scale (issue 17): a real program's cold run, as a user's first ``tpusim run --timing-only`` pays it.

    python benchmarks/bench_scale.py           # the d1024 decoder block on v5e: bf16, f32, four bf16 blocks
    python benchmarks/bench_scale.py --large   # also 32 bf16 blocks in a row (2.8 M instructions, about a minute)

Each run is ``python -m tpusim run PROGRAM --timing-only`` in a fresh process; the benchmark prints its wall
and CPU seconds, the phases the run reports (compile, decode, simulation), simulated instructions per CPU
second end to end, and the process's peak resident memory (the child's own ``wait4`` usage), side by side with the
figures at filing (issue 17: the bf16 block took 15 s and 3.2 GB, four blocks 53 s and 12 GB; on this tree
before the closed-form transfer costs and the cached layout comparisons one block took 61 CPU s and 5.0 GB).
CPU rather than wall time because the machines are shared. Then the whole command for a 2048^3 and an 8192^3
bf16 matmul, timing-only (issue 17: under 0.6 s and 2 s of CPU), and last the README's first command without
``--report`` (numerics and the check on the small transformer block). The exit status is 0: a report, not a test.

First it writes tpusim's bytecode (``compileall``), as ``pip install`` does: where ``PYTHONDONTWRITEBYTECODE``
is set (this machine sets it) a source file edited since its ``.pyc`` was written is compiled again by every
process, 0.1 s of CPU per run after editing two dozen modules.
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = [ROOT / "benchmarks" / "programs" / f"decoder_d1024_{t}.hlo" for t in ("bf16", "f32", "bf16_4layers")]
LARGE = ROOT / "benchmarks" / "programs" / "decoder_d1024_bf16_32layers.hlo.gz"
MATMUL_TARGETS = {2048: 0.6, 8192: 2.0}
"""Issue 17: CPU seconds of a whole ``tpusim run --timing-only`` of an n^3 bf16 matmul."""


def matmul_program(n: int) -> str:
    return (
        f"HloModule matmul_{n}\nENTRY main {{\n  a = bf16[{n},{n}] parameter(0)\n  b = bf16[{n},{n}] parameter(1)\n"
        f"  ROOT d = bf16[{n},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n}}\n"
    )


README_COMMAND = [ROOT / "examples" / "transformer_block_bf16.hlo", "--check"]
"""The README's first command without ``--report`` (issue 17: under 1 s of CPU): numerics and the check."""


def cold_run(program: Path, config: str = "tpu_v5e", flags: tuple[str, ...] = ("--timing-only",)) -> dict[str, float]:
    t0 = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "tpusim", "run", str(program), "--config", config, *flags],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)  # this child's own CPU time and peak memory
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise RuntimeError(f"{program.name}: tpusim run exited with {child.returncode}")
    wall = time.perf_counter() - t0
    facts = {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss_gb": usage.ru_maxrss / 2**20}
    executed = re.search(r"([\d,]+) instructions executed", out)
    facts["instructions"] = float(executed.group(1).replace(",", "")) if executed else 0.0
    for phase in ("compiled in", "decode", "simulation"):
        found = re.search(rf"{phase} ([\d.]+) s", out)
        facts[phase] = float(found.group(1)) if found else float("nan")
    return facts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="also the 32-block decoder (about a minute)")
    args = parser.parse_args()
    compileall.compile_dir(ROOT / "tpusim", quiet=1)
    print("| program | instructions | wall (s) | CPU (s) | compile / decode / simulate (s) | instr/CPU s ", end="")
    print("| peak RSS (GB) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for program in [*PROGRAMS, *([LARGE] if args.large else [])]:
        f = cold_run(program)
        phases = f"{f['compiled in']:.1f} / {f['decode']:.1f} / {f['simulation']:.1f}"
        rate = f["instructions"] / f["cpu"] if f["cpu"] else 0.0
        print(
            f"| {program.name.split('.')[0]} | {f['instructions']:,.0f} | {f['wall']:.1f} | {f['cpu']:.1f} | {phases} "
            f"| {rate:,.0f} | {f['rss_gb']:.2f} |",
            flush=True,
        )
    with tempfile.TemporaryDirectory() as tmp:
        for n, target in MATMUL_TARGETS.items():
            path = Path(tmp) / f"matmul_{n}.hlo"
            path.write_text(matmul_program(n))
            f = cold_run(path)
            print(
                f"\n{n}^3 bf16 matmul, `tpusim run --timing-only`: {f['cpu']:.2f} CPU s ({f['wall']:.2f} s wall), "
                f"peak {f['rss_gb']:.2f} GB; target under {target} CPU s",
                end="",
            )
    print()
    program, *flags = README_COMMAND
    f = cold_run(Path(program), flags=tuple(str(x) for x in flags))
    print(
        f"\nREADME command (`tpusim run {Path(program).relative_to(ROOT)} {' '.join(map(str, flags))}`): "
        f"{f['cpu']:.2f} CPU s ({f['wall']:.2f} s wall), compile {f['compiled in']:.2f} s; target under 1 CPU s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
