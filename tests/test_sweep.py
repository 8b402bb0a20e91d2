"""Sweeps: specs and their errors, the same table from 1 and 2 local workers and from a Dask LocalCluster,
a sweep killed half way and resumed without losing or repeating a row, failing points, and the plots."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from tpusim.cli import main
from tpusim.sweep import SweepError, load_spec, run_sweep
from tpusim.sweep.store import Journal

ROOT = Path(__file__).resolve().parent.parent


def _colours(rgb: np.ndarray) -> int:
    """Distinct colours of an image (8 bits per channel)."""
    q = (rgb[..., :3] * 255).round().astype(np.uint32)
    return len(np.unique((q[..., 0] << 16) | (q[..., 1] << 8) | q[..., 2]))


MLP = ROOT / "tests" / "hlo_samples" / "jax_mlp_short.hlo"

SPEC = f"""\
name: small
programs:
  mlp: {MLP}
config: teaching
grid:
  mxu.rows: [4, 8]
  hbm.bandwidth_bytes_per_s: [8.0e9, 1.6e10, 3.2e10]
objective: seconds
cost: hbm_bandwidth_bytes_per_s
metrics: [seconds, mxu_busy_fraction]
"""


@pytest.fixture(scope="module")
def spec_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "small.yaml"
    path.write_text(SPEC)
    return path


@pytest.fixture(scope="module")
def reference(spec_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sweep run point after point in this process: the table every other way must reproduce."""
    out = tmp_path_factory.mktemp("one-worker")
    result = run_sweep(load_spec(spec_path), out, workers=1, progress=False)
    assert result.ran == 6 and len(result.rows) == 6
    assert all(r["status"] == "ok" for r in result.rows)
    return out


def test_spec_expands_grid_and_zip(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(f"programs: [{MLP}]\nconfig: teaching\nzip:\n  mxu.rows: [4, 8]\n  mxu.cols: [8, 16]\n"
                    "grid:\n  tiling: [tpu_default, bf16_16x128]\n")  # fmt: skip
    spec = load_spec(path)
    assert spec.name == "s" and spec.axes == (("mxu.rows", "mxu.cols"), ("tiling",))
    assert [dict(p.params) for p in spec.points] == [
        {"mxu.rows": 4, "mxu.cols": 8, "tiling": "tpu_default"},
        {"mxu.rows": 4, "mxu.cols": 8, "tiling": "bf16_16x128"},
        {"mxu.rows": 8, "mxu.cols": 16, "tiling": "tpu_default"},
        {"mxu.rows": 8, "mxu.cols": 16, "tiling": "bf16_16x128"},
    ]
    assert [(p.config.mxu.rows, p.config.mxu.cols, p.options.tiling) for p in spec.points][3] == (8, 16, "bf16_16x128")
    assert len({p.id for p in spec.points}) == 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("programs: [{mlp}]\nbogus: 1\n", r"s\.yaml:2: unknown key 'bogus'; a sweep spec has: name, "),
        ("programs: [{mlp}]\nconfig: teaching\ngrid:\n  mxu.rowz: [4]\n",
         r"s\.yaml:4: point 0 \(mxu\.rowz=4\): override 'mxu\.rowz=4': mxu\.rowz: unknown key; MxuConfig keys are"),
        ("programs: [{mlp}]\nconfig: teaching\ngrid:\n  mxu.rows: [0]\n",
         r"s\.yaml:4: point 0 \(mxu\.rows=0\): override 'mxu\.rows=0': mxu\.rows: must be positive, not 0"),
        ("programs: [{mlp}]\nzip:\n  mxu.rows: [4, 8]\n  mxu.cols: [8]\n", r"s\.yaml:2: a zip group needs non-empty"),
        ("programs: [{mlp}]\ngrid:\n  mxu.rows: []\n", r"s\.yaml:3: grid\.mxu\.rows must be a non-empty list"),
        ("programs: {{a: nowhere.hlo}}\n", r"s\.yaml:1: program 'a': no file .*nowhere\.hlo"),
        ("programs: [{mlp}]\noptions: {{tilling: x}}\n", r"s\.yaml:2: unknown compile option 'tilling'"),
        ("programs: [{mlp}]\ngrid:\n  matmul_precision: [bogus]\n",
         r"s\.yaml:3: point 0 \(matmul_precision=bogus\): matmul precision must be default, high or highest"),
    ],
)  # fmt: skip
def test_spec_errors_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text.format(mlp=MLP))
    with pytest.raises(SweepError, match=message):
        load_spec(path)


def test_two_workers_give_the_same_table(spec_path: Path, reference: Path, tmp_path: Path) -> None:
    result = run_sweep(load_spec(spec_path), tmp_path, workers=2, progress=False)
    assert result.ran == 6
    for name in ("results.csv", "results.jsonl"):
        assert (tmp_path / name).read_text() == (reference / name).read_text()
    rows = [json.loads(line) for line in (reference / "results.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(6))
    # More HBM bandwidth never makes this program slower; the best point is one with the most.
    assert result.best["mlp"]["hbm.bandwidth_bytes_per_s"] == 3.2e10
    for rows_ in (rows[:3], rows[3:]):
        assert [r["cycles"] for r in rows_] == sorted((r["cycles"] for r in rows_), reverse=True)


def test_dask_local_cluster_gives_the_same_table(spec_path: Path, reference: Path, tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        result = run_sweep(load_spec(spec_path), tmp_path, executor="dask", scheduler=cluster.scheduler_address,
                           progress=False)  # fmt: skip
    assert result.ran == 6
    assert (tmp_path / "results.csv").read_text() == (reference / "results.csv").read_text()


# 24 points of ~0.2 s: killed after its first row, the sweep has seconds of work left, so a test process
# starved by a loaded machine between its poll and the kill still finds it mid-sweep (with 6 points it
# once found all of them done).
KILL_SPEC = SPEC.replace("[8.0e9, 1.6e10, 3.2e10]", "[" + ", ".join(f"{k}.0e9" for k in range(4, 52, 4)) + "]")


def test_killed_sweep_resumes_without_losing_or_repeating_a_row(tmp_path: Path) -> None:
    spec_path = tmp_path / "kill.yaml"
    spec_path.write_text(KILL_SPEC)
    total = len(load_spec(spec_path).points)
    assert total == 24
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "tpusim.cli", "sweep", str(spec_path), "--out", str(out), "-j", "2", "--no-progress"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = out / "journal.jsonl"
    deadline = time.monotonic() + 120
    try:
        while not (journal.exists() and journal.read_bytes().count(b"\n") >= 1):
            assert proc.poll() is None, "the sweep ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its workers, at once
        proc.wait()
    done_before = journal.read_bytes().count(b"\n")
    assert 1 <= done_before < total
    result = run_sweep(load_spec(spec_path), out, workers=2, progress=False)
    assert result.ran == total - done_before
    ids = [json.loads(line)["id"] for line in journal.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == total
    fresh = run_sweep(load_spec(spec_path), tmp_path / "fresh", workers=2, progress=False)
    assert fresh.ran == total
    assert (out / "results.csv").read_text() == (tmp_path / "fresh" / "results.csv").read_text()
    again = run_sweep(load_spec(spec_path), out, workers=2, progress=False)
    assert again.ran == 0 and journal.read_text().count("\n") == total


def test_journal_drops_a_torn_last_line(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    j.append({"id": "a", "status": "ok"})
    j.close()
    with open(tmp_path / "journal.jsonl", "ab") as f:
        f.write(b'{"id": "b", "sta')  # a crash in the middle of a write
    j = Journal(tmp_path)
    assert list(j.rows) == ["a"]
    j.append({"id": "b", "status": "ok"})
    j.close()
    lines = (tmp_path / "journal.jsonl").read_text().splitlines()
    assert [json.loads(x)["id"] for x in lines] == ["a", "b"]


def test_one_sweep_per_folder(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    with pytest.raises(SweepError, match="another sweep is writing"):
        Journal(tmp_path)
    j.close()


def test_failing_points_are_recorded_and_the_others_go_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "f.yaml"
    spec.write_text(f"programs: [{MLP}]\nconfig: teaching\ngrid:\n  hbm.bytes: [1048576, 1024]\n")
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), "-j", "1"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["ok", "error"]
    assert rows[1]["error"].startswith("OutOfMemoryError: HBM is full: parameter buffer")
    assert rows[1]["cycles"] is None and rows[0]["cycles"] > 0
    captured = capsys.readouterr()
    assert "2 points (1 failed, 2 run now)" in captured.out and "point #1 failed: OutOfMemoryError" in captured.err
    assert "## Failed points" in (tmp_path / "out" / "sweep.md").read_text()


def test_sweep_page_and_plots(reference: Path) -> None:
    md = (reference / "sweep.md").read_text()
    assert "**Best point** (lowest `seconds`): #5, mxu.rows = 8, hbm.bandwidth_bytes_per_s = 3.2e+10" in md
    for name in ("seconds", "mxu_busy_fraction", "pareto"):
        assert f"(plots/{name}.png)" in md
        img = imread(reference / "plots" / f"{name}.png")[..., :3]
        assert img.shape[0] > 300 and img.shape[1] > 500
        assert 0.01 < (img < 0.9).any(axis=-1).mean() < 0.9
        assert _colours(img) > 20


def test_cli_dry_run(spec_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", str(spec_path), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        len(lines) == 6
        and lines[0].startswith("#0 ")
        and lines[0].endswith("mlp: mxu.rows=4, hbm.bandwidth_bytes_per_s=8000000000.0")
    )


@pytest.mark.parametrize("name", ["mxu_vs_hbm", "bf16_tiling", "vmem_vs_block"])
def test_shipped_specs_load(name: str) -> None:
    spec = load_spec(ROOT / "configs" / "sweeps" / f"{name}.yaml")
    assert len(spec.points) >= 6
    assert all(p.timing_only for p in spec.points)


def test_local_workers_share_the_cores_between_their_blas_threads():
    """Each local worker may start cores/workers BLAS threads (more threads than cores made small products
    wait for descheduled threads: 10x slower)."""
    import multiprocessing

    from threadpoolctl import threadpool_info

    from tpusim.sweep import executors

    cores = os.cpu_count() or 1
    assert executors.blas_threads_per_worker(1) == cores
    assert executors.blas_threads_per_worker(cores) == 1 and executors.blas_threads_per_worker(4 * cores) == 1
    pool = multiprocessing.get_context("forkserver").Pool(1, executors._start_worker, (1,))
    try:
        info = pool.apply(threadpool_info)
    finally:
        pool.close()
        pool.join()
    blas = [lib for lib in info if lib["user_api"] == "blas"]
    assert blas and all(lib["num_threads"] == 1 for lib in blas)
