"""Speed of the device model on a real program: the bf16 transformer block example
(``examples/transformer_block_bf16.hlo``) simulated on ``tpu_v5e`` in timing-only mode, side by side with the
target of issue 5: at least 200,000 simulated instructions per second.

    /work/venv/bin/python benchmarks/bench_transformer.py [--example transformer_block_bf16] [--repeat 5]

Instructions per second = instructions executed / CPU seconds of one device run (``Chip.run``: decoding the
stream, then the SimPy simulation), best of ``repeat`` runs; CPU time rather than wall time because the
machines are shared. Compilation is timed and shown apart, and so is the whole ``tpusim.simulate`` call. The
exit status is 1 when the target is missed.
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

    best_run = best_total = float("inf")
    result = None
    for _ in range(args.repeat):
        t0 = time.process_time()
        result = Chip(config).run(compiled.program, timing_only=True)
        best_run = min(best_run, time.process_time() - t0)
        t0 = time.process_time()
        tpusim.simulate(module, config=config, timing_only=True)
        best_total = min(best_total, time.process_time() - t0)
    assert result is not None
    rate = result.instructions / best_run
    ok = rate >= TARGET
    print(f"program       examples/{args.example}.hlo on {config.name}, timing-only")
    print(f"compiled      {compiled.program.instruction_count:,} instructions in {compile_s:.3f} s CPU; "
          f"{len(compiled.fallbacks)} fallback(s)")  # fmt: skip
    print(f"simulated     {result.cycles:,} cycles = {result.seconds * 1e6:,.2f} us; "
          f"{result.instructions:,} instructions executed, {result.events:,} events")  # fmt: skip
    print(f"{'figure':44} {'measured':>16} {'target':>16}  verdict")
    print(f"{'device run (decode + simulation), CPU':44} {best_run:>14.4f} s")
    print(f"{'simulated instructions per CPU second':44} {rate:>16,.0f} {'>= ' + format(TARGET, ','):>16}  "
          f"{'ok' if ok else 'MISSED'}")  # fmt: skip
    total_rate = result.instructions / best_total
    print(f"{'tpusim.simulate (compile + run), CPU':44} {best_total:>14.4f} s {'':>16}  "
          f"({total_rate:,.0f} instructions/s)")  # fmt: skip
    print(f"(best of {args.repeat} runs)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
