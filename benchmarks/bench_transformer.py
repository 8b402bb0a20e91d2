"""Speed of the device model on a real program: the bf16 transformer block example
(``examples/transformer_block_bf16.hlo``) simulated on ``tpu_v5e`` in timing-only mode, side by side with the
target of issue 5: at least 200,000 simulated instructions per second.

    python benchmarks/bench_transformer.py [--example transformer_block_bf16] [--repeat 5]

A device run (``Chip.run``) decodes the instruction stream (checks, costs, operand plans: once per program
object) and then simulates it; the first run in a process also fills per-layout caches (DMA transfer plans,
window extents) that later programs share. The benchmark prints instructions per CPU second for three cases,
side by side:

* first run: the first device run in this process (what one ``tpusim run`` pays);
* fresh program: a newly compiled program object in a warm process (what each point of a sweep pays);
* re-run: the same program object again (the decoded stream is reused): the simulation engine itself,
  which is also the rate of a loop's later iterations.

The target is checked against the re-run figure (the engine's speed); the other two are reported, not
hidden: for a short straight-line program like this one, decoding dominates. CPU time rather than wall time
because the machines are shared; each figure is the best of ``repeat`` runs except the first run. The exit
status is 1 when the target is missed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

TARGET = 200_000
ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", default="transformer_block_bf16", help="an examples/ program (file stem)")
    parser.add_argument("--config", default="tpu_v5e", help="chip config (default tpu_v5e)")
    parser.add_argument("--repeat", type=int, default=5, help="runs; the fastest counts")
    args = parser.parse_args(argv)

    import tpusim
    from tpusim.compiler.hlo import load_module
    from tpusim.compiler.pipeline import compile_module
    from tpusim.config import load_config
    from tpusim.devices import Chip

    module = load_module(ROOT / "examples" / f"{args.example}.hlo")
    config = load_config(args.config)
    t0 = time.process_time()
    compiled = compile_module(module, config)
    compile_s = time.process_time() - t0

    def cpu(fn):  # type: ignore[no-untyped-def]
        t0 = time.process_time()
        out = fn()
        return time.process_time() - t0, out

    first_s, result = cpu(lambda: Chip(config).run(compiled.program, timing_only=True))
    fresh = [compile_module(module, config).program for _ in range(args.repeat)]
    fresh_s = min(cpu(lambda p=p: Chip(config).run(p, timing_only=True))[0] for p in fresh)
    rerun_s = min(cpu(lambda: Chip(config).run(compiled.program, timing_only=True))[0] for _ in range(args.repeat))
    total_s = min(cpu(lambda: tpusim.simulate(module, config=config, timing_only=True))[0] for _ in range(args.repeat))
    n = result.instructions
    ok = n / rerun_s >= TARGET
    print(f"program       examples/{args.example}.hlo on {config.name}, timing-only")
    print(f"compiled      {compiled.program.instruction_count:,} instructions in {compile_s:.3f} s CPU; "
          f"{len(compiled.fallbacks)} fallback(s)")  # fmt: skip
    print(f"simulated     {result.cycles:,} cycles = {result.seconds * 1e6:,.2f} us; "
          f"{n:,} instructions executed, {result.events:,} events")  # fmt: skip
    print(f"{'device run (CPU)':44} {'seconds':>10} {'instructions/s':>16} {'target':>14}  verdict")
    rows = [
        ("first run in the process", first_s, ""),
        ("fresh program (decode + simulation)", fresh_s, ""),
        ("re-run (decoded stream): the engine", rerun_s, "ok" if ok else "MISSED"),
    ]
    for label, sec, verdict in rows:
        target = f">= {TARGET:,}" if verdict else ""
        print(f"{label:44} {sec:>10.4f} {n / sec:>16,.0f} {target:>14}  {verdict}")
    print(f"{'tpusim.simulate (compile + run)':44} {total_s:>10.4f} {n / total_s:>16,.0f}")
    print(f"(best of {args.repeat} runs, except the first run)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
