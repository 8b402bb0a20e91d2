"""``tpusim sweep SPEC.yaml``: the command-line side of sweeps (registered by ``tpusim/cli.py``)."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

from tpusim.argtypes import at_least

__all__ = ["configure_sweep", "run_sweep_command"]


def configure_sweep(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", type=Path, help="a sweep spec (see configs/sweeps/ and docs/sweeps.md)")
    p.add_argument("--out", type=Path, help="output folder (default reports/sweeps/<name>/); an existing one resumes")
    p.add_argument("--workers", "-j", type=at_least(1), default=max(1, min(os.cpu_count() or 1, 8)),
                   help="local worker processes (default: the CPU count, at most 8)")  # fmt: skip
    p.add_argument("--executor", choices=("local", "dask"), default="local",
                   help="where points run: local processes, or a Dask cluster (needs --scheduler)")  # fmt: skip
    p.add_argument("--scheduler", metavar="ADDRESS", help="the Dask scheduler, e.g. tcp://10.0.0.5:8786")
    p.add_argument("--retry-failed", action="store_true", help="run again the points an earlier run recorded as failed")
    p.add_argument("--no-progress", action="store_true", help="no progress line even on a terminal")
    p.add_argument("--no-plots", action="store_true",
                   help="write the tables and sweep.md without the plots (rendering them takes seconds)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="list the points and exit")


def _show_warning(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
    print(f"tpusim sweep: warning: {message}", file=sys.stderr)


def run_sweep_command(args: argparse.Namespace) -> int:
    from tpusim.sweep.runner import run_sweep
    from tpusim.sweep.spec import load_spec
    from tpusim.sweep.store import SweepWarning

    spec = load_spec(args.spec)
    if args.dry_run:
        for p in spec.points:
            setting = ", ".join(f"{k}={v}" for k, v in p.params) or "the base"
            print(f"#{p.index} {p.id} {p.program}: {setting}")
        return 0
    with warnings.catch_warnings():  # a skipped journal line or a stale lock: one line each, no source echo
        warnings.simplefilter("always", SweepWarning)
        warnings.showwarning = _show_warning
        result = run_sweep(
            spec, args.out, workers=args.workers, executor=args.executor, scheduler=args.scheduler,
            progress=False if args.no_progress else None, retry_failed=args.retry_failed, plots=not args.no_plots,
        )  # fmt: skip
    folder = result.files[-1].parent
    failed = sum(r["status"] != "ok" for r in result.rows)
    print(f"sweep {spec.name}: {len(result.rows)} points ({failed} failed, {result.ran} run now) -> {folder}/")
    metric = spec.objective[0]
    for program, b in result.best.items():
        setting = ", ".join(f"{k}={b.get(k)}" for k in spec.parameters if k != "program") or "the base"
        value = f"{b[metric]:.6g}"
        print(f"best point for {program}: #{b['index']} ({setting}): {metric} = {value} ({b['cycles']:,} cycles)")
    for r in result.rows:
        if r["status"] != "ok":
            print(f"point #{r['index']} failed: {r['error']}", file=sys.stderr)
    return 1 if failed == len(result.rows) and result.rows else 0
