"""Where sweep points run: this process, a pool of local processes, or a Dask distributed cluster.

Each executor takes the jobs (:func:`tpusim.sweep.point.payload`) and calls ``on_row`` in this process with
every finished row, in whatever order points finish; the caller records rows and orders the tables, so the
results never depend on the executor or the number of workers.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

from tpusim.sweep.point import run_point
from tpusim.sweep.spec import SweepError

__all__ = ["EXECUTORS", "run_dask", "run_local"]

Job = dict[str, Any]
OnRow = Callable[[dict[str, Any]], None]


def _start_worker(blas_threads: int) -> None:
    # Ctrl-C reaches the whole process group: the parent handles it (stops the pool); workers just stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # NOTE: speed. BLAS (numpy's matmul, the MXU's numerics) starts one thread per core in every worker;
    # with more threads than cores each small product waits for a descheduled thread: the transformer
    # block ran 10x slower beside one busy process. The workers share the cores instead.
    from threadpoolctl import threadpool_limits

    threadpool_limits(blas_threads, user_api="blas")


def blas_threads_per_worker(workers: int) -> int:
    """BLAS threads each of ``workers`` local processes may start: the machine's cores shared out."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def run_local(jobs: Sequence[Job], on_row: OnRow, *, workers: int = 1, scheduler: str | None = None) -> None:
    """Run the jobs here (``workers <= 1``) or in ``workers`` local processes (started by a fork server, so
    they hold no state of this process but the imported modules), which share the machine's cores between
    their BLAS threads."""
    if scheduler is not None:
        raise SweepError("--scheduler is for --executor dask")
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            on_row(run_point(job))
        return
    ctx = multiprocessing.get_context("forkserver")
    n = min(workers, len(jobs))
    pool = ctx.Pool(n, initializer=_start_worker, initargs=(blas_threads_per_worker(n),))
    try:
        for row in pool.imap_unordered(run_point, jobs, chunksize=1):
            on_row(row)
        pool.close()
    except BaseException:
        pool.terminate()  # interrupted: stop the points in flight, they run again on resume
        raise
    finally:
        pool.join()


def run_dask(jobs: Sequence[Job], on_row: OnRow, *, workers: int = 1, scheduler: str | None = None) -> None:
    """Run the jobs on the Dask distributed cluster whose scheduler listens at ``scheduler`` (``tcp://host:8786``).

    The cluster decides how many run at once (``workers`` is ignored). Needs ``dask.distributed`` on this
    machine and on the workers, with tpusim installed there too: ``pip install 'tpusim[sweep-dask]'``.
    """
    if scheduler is None:
        raise SweepError("--executor dask needs --scheduler ADDRESS (for example tcp://127.0.0.1:8786)")
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise SweepError("--executor dask needs dask.distributed: pip install 'tpusim[sweep-dask]'") from None
    try:
        client = Client(scheduler, timeout=30)
    except OSError as e:
        raise SweepError(f"cannot reach the Dask scheduler at {scheduler}: {e}") from None
    try:
        futures = [client.submit(run_point, job, pure=False) for job in jobs]
        try:
            for future in as_completed(futures):
                on_row(future.result())
        except BaseException:
            client.cancel(futures)
            raise
    finally:
        client.close()


EXECUTORS: dict[str, Callable[..., None]] = {"local": run_local, "dask": run_dask}
"""Executors by the name ``--executor`` takes."""
