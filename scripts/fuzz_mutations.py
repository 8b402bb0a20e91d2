"""Mutation-fuzz the whole pipeline over the shipped examples, for as long as you like.

    python scripts/fuzz_mutations.py --seed 1 --count 5000 --time-limit 1500 --out fuzz-findings
    python scripts/fuzz_mutations.py --seed 1 --index 417          # rebuild and rerun one mutant, verbosely

Each mutant (an example with byte flips, token deletions, swaps or replacements, a duplicated line, a
truncation, a huge or boundary number, or a shape in deep tuples: tests/mutation_fuzz.py) is read from disk,
parsed, verified, printed, compiled and, where it compiles, simulated timing-only in a worker process with a
time limit per mutant. The summary says how many mutants parsed, compiled and ran, how many stopped with
which TpusimError, and lists every other outcome (another exception, a hang, a dead worker) grouped by root
cause (exception type and innermost tpusim frame). With ``--check`` each mutant that runs also runs
numerically against the reference interpreter, and wrong outputs (or numeric cycles unlike the timing-only
run's) are findings too. Each such mutant is saved under ``--out`` with its
traceback, for reproduction. The exit code is 1 when there were findings.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from mutation_fuzz import MUTATORS, STAGES, MutantRunner, Outcome, load_sources, make_mutant


def _slug(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", key).strip("_")[:120]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count", type=int, default=1000, help="mutants to run (default 1000)")
    ap.add_argument("--start", type=int, default=0, help="index of the first mutant")
    ap.add_argument("--index", type=int, help="run only this mutant and print its outcome in full")
    ap.add_argument("--mutators", default=",".join(MUTATORS), help=f"comma-separated subset of {','.join(MUTATORS)}")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per mutant before it counts as a hang")
    ap.add_argument("--time-limit", type=float, default=0.0, help="stop starting mutants after this many seconds")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument(
        "--check",
        action="store_true",
        help="also run each mutant that compiles numerically and compare its outputs with the reference "
        "interpreter and its cycles with the timing-only run's (slower; differences are findings)",
    )
    ap.add_argument("--out", type=Path, default=Path("fuzz-findings"), help="folder for the findings' mutants")
    args = ap.parse_args(argv)
    mutators = tuple(m for m in args.mutators.split(",") if m)
    unknown = [m for m in mutators if m not in MUTATORS]
    if unknown:
        ap.error(f"unknown mutators {unknown}; known: {', '.join(MUTATORS)}")
    sources = load_sources()
    global _mutator_set
    _mutator_set = mutators

    if args.index is not None:
        mutant = make_mutant(sources, args.seed, args.index, mutators)
        with MutantRunner(args.timeout, check=args.check) as runner:
            outcome = runner.run(mutant)
        print(f"{mutant.name} of {mutant.example}: {'; '.join(mutant.mutations)}")
        print(f"{outcome.status} at {outcome.stage}: {outcome.error_type} {outcome.message}")
        if outcome.traceback:
            print(outcome.traceback)
        path = args.out / f"{mutant.name}.hlo"
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_bytes(mutant.data)
        print(f"mutant written to {path}")
        return 1 if outcome.is_finding else 0

    began = time.perf_counter()
    lock = threading.Lock()
    indices = iter(range(args.start, args.start + args.count))
    results: list[tuple[int, str, tuple[str, ...], Outcome]] = []
    stop = threading.Event()

    def work() -> None:
        with MutantRunner(args.timeout, check=args.check) as runner:
            while not stop.is_set():
                with lock:
                    i = next(indices, None)
                if i is None:
                    return
                if args.time_limit and time.perf_counter() - began > args.time_limit:
                    stop.set()
                    return
                mutant = make_mutant(sources, args.seed, i, mutators)
                outcome = runner.run(mutant)
                with lock:
                    results.append((i, mutant.example, mutant.mutations, outcome))
                    if outcome.is_finding:
                        _save(args.out, mutant, outcome)
                        key = _group(outcome, mutant.mutations)
                        print(f"FINDING {mutant.name} ({mutant.example}): {key}: {outcome.message}", flush=True)
                    if len(results) % 250 == 0:
                        print(f"... {len(results)} mutants, {time.perf_counter() - began:.0f} s", flush=True)

    threads = [threading.Thread(target=work) for _ in range(max(1, args.jobs))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        stop.set()
        print("interrupted; waiting for the running mutants", flush=True)
        for t in threads:
            t.join()
    elapsed = time.perf_counter() - began
    _summary(args, sorted(results, key=lambda r: r[0]), elapsed)
    return 1 if any(o.is_finding for *_, o in results) else 0


def _group(outcome: Outcome, mutations: tuple[str, ...]) -> str:
    """The root-cause key of a finding. Wrong outputs are grouped by the mutations that made the program (an
    opcode by its new opcode): an exchanged opcode such as power or remainder after a matmul turns the
    matmul's rounding into large differences, which is ill-conditioning rather than a wrong answer."""
    if outcome.status != "wrong":
        return outcome.key
    kinds = sorted(
        {m.split(" ")[0] + (f"->{m.rsplit(' ', 1)[-1]}" if m.startswith("opcode at") else "") for m in mutations}
    )
    return f"{outcome.key} after {'+'.join(kinds)}"


def _mutators_flag() -> str:
    """``--mutators ...`` when the run used a subset: a mutant depends on the mutators it may draw from."""
    return "" if _mutator_set == tuple(MUTATORS) else f" --mutators {','.join(_mutator_set)}"


_mutator_set: tuple[str, ...] = tuple(MUTATORS)


def _save(out: Path, mutant, outcome: Outcome) -> None:  # type: ignore[no-untyped-def]
    folder = out / _slug(_group(outcome, mutant.mutations))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{mutant.name}.hlo").write_bytes(mutant.data)
    (folder / f"{mutant.name}.txt").write_text(
        f"seed {mutant.seed} index {mutant.index} of {mutant.example}\n"
        f"mutations: {'; '.join(mutant.mutations)}\n"
        f"rerun: python scripts/fuzz_mutations.py --seed {mutant.seed} --index {mutant.index}{_mutators_flag()}\n"
        f"{outcome.status} at {outcome.stage}: {outcome.error_type}: {outcome.message}\n\n{outcome.traceback}"
    )


def _summary(
    args: argparse.Namespace, results: list[tuple[int, str, tuple[str, ...], Outcome]], elapsed: float
) -> None:
    n = len(results)
    outcomes = [o for *_, o in results]

    def reached(stage: str) -> int:  # mutants that got past ``stage``
        k = STAGES.index(stage)
        return sum(1 for o in outcomes if o.status == "ok" or (o.stage in STAGES and STAGES.index(o.stage) > k))

    errors = [o for o in outcomes if o.status == "error"]
    findings = [r for r in results if r[3].is_finding]
    print(f"\n{n} mutants of seed {args.seed} (indices {args.start}..{args.start + n - 1}) in {elapsed:.0f} s"
          f"{'; mutators ' + ','.join(_mutator_set) if _mutators_flag() else ''}")  # fmt: skip
    print(f"  parsed {reached('parse')}, verified {reached('verify')}, compiled {reached('compile')}, "
          f"ran {sum(o.status in ('ok', 'wrong') for o in outcomes)}"
          + (f", checked {sum(o.status in ('ok', 'wrong') for o in outcomes)}" if args.check else ""))  # fmt: skip
    print(f"  TpusimErrors: {len(errors)}; other failures (findings): {len(findings)}")
    by_kind = Counter((o.stage, o.error_type.rsplit(".", 1)[-1]) for o in errors)
    for (stage, kind), k in sorted(by_kind.items(), key=lambda kv: (STAGES.index(kv[0][0]), -kv[1])):
        print(f"    {stage:9} {kind:28} {k}")
    long = [r for r in results if r[3].status == "error" and r[3].message_length > 300]
    if long:
        worst = max(long, key=lambda r: r[3].message_length)
        kind = worst[3].error_type.rsplit(".", 1)[-1]
        print(f"  TpusimErrors whose first line is over 300 characters: {len(long)} (longest "
              f"{worst[3].message_length:,}: mutant-{args.seed}-{worst[0]}, {kind})")  # fmt: skip
    # TpusimErrors that the compiler's or the device model's own checks raise once the HLO verifier has
    # accepted a module: not a traceback, but a message about tpusim's internals instead of the user's program.
    internal: dict[str, list[int]] = defaultdict(list)
    for i, _, _, o in results:
        kind = o.error_type.rsplit(".", 1)[-1]
        if o.is_internal:
            message = re.sub(r"[0-9]+", "N", re.sub(r"`[^`]*`", "`...`", o.message))
            internal[f"{o.stage} {kind}: {message[:120]}"].append(i)
    if internal:
        print(f"  internal errors after the verifier accepted the module ({sum(map(len, internal.values()))}):")
        for key, ids in sorted(internal.items(), key=lambda kv: -len(kv[1])):
            print(f"    {len(ids)} x {key} (mutant-{args.seed}-{ids[0]})")
    slow = sorted(outcomes, key=lambda o: -o.seconds)[:3]
    print(f"  slowest mutants: {', '.join(f'{o.seconds:.1f} s' for o in slow)}")
    groups: dict[str, list[tuple[int, str, tuple[str, ...], Outcome]]] = defaultdict(list)
    for r in findings:
        groups[_group(r[3], r[2])].append(r)
    if groups:
        print(f"\nfindings by root cause ({len(groups)}), mutants saved under {args.out}/:")
    for key, rows in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(rows)} x {key}")
        for i, example, mutations, o in rows:
            what = "; ".join(mutations)[:160]
            print(f"      mutant-{args.seed}-{i} ({example}; {what}) at {o.stage}: {o.message[:160]}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"summary-{args.seed}.json").write_text(
        json.dumps(
            {
                "seed": args.seed,
                "mutants": n,
                "seconds": round(elapsed, 1),
                "parsed": reached("parse"),
                "verified": reached("verify"),
                "compiled": reached("compile"),
                "ran": sum(o.status == "ok" for o in outcomes),
                "tpusim_errors": {f"{s}/{k}": v for (s, k), v in by_kind.items()},
                "internal_errors": {key: [f"mutant-{args.seed}-{i}" for i in ids] for key, ids in internal.items()},
                "findings": {key: [f"mutant-{args.seed}-{r[0]}" for r in rows] for key, rows in groups.items()},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
