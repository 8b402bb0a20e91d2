"""Sweeps: specs and their errors, the same table from 1 and 2 local workers and from a Dask LocalCluster,
a sweep killed half way and resumed without losing or repeating a row, failing points, and the plots."""

from __future__ import annotations

import csv
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
from tpusim.sweep import SweepError, SweepWarning, load_spec, run_sweep
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
        ("programs: [{mlp}]\nconfig: teaching\ngrid:\n  hbm.latency_ns: [10, .inf]\n",
         r"s\.yaml:4: point 1 \(hbm\.latency_ns=inf\): override 'hbm\.latency_ns=\.inf': hbm\.latency_ns: must be a "
         r"finite number, not inf"),
        ("programs: [{mlp}]\nconfig: teaching\nset:\n  dma.setup_cycles: 1e15\n",
         r"s\.yaml:4: point 0 \(\): override 'dma\.setup_cycles=1000000000000000\.0': dma\.setup_cycles: must be at "
         r"most 2\^20"),
        ("programs: [{mlp}]\nconfig: teaching\nseed: -1\n", r"s\.yaml:3: point 0 \(\): seed must be a whole number "
         r"from 0 to 2\^64 - 1, not -1"),
        ("programs: [{mlp}]\ntiming_only: 3\n", r"s\.yaml:2: point 0 \(\): timing_only must be true or false, not 3"),
        ("programs: [{mlp}]\ngrid:\n  a: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n  b: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n"
         "  c: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n  d: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n"
         "  e: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n  f: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n",
         r"s\.yaml: the spec expands to 1,000,000 points \(10 x 10 x 10 x 10 x 10 x 10\), more than 100,000; split"),
        # columns the results do not have ran every point and then failed drawing (cost) or showed nothing
        ("programs: [{mlp}]\ncost: money\n", r"s\.yaml:2: 'money' is not a column of the results; columns: "),
        ("programs: [{mlp}]\nobjective: speed\n", r"s\.yaml:2: 'speed' is not a column of the results"),
        ("programs: [{mlp}]\nmetrics: [seconds, speed]\n", r"s\.yaml:2: 'speed' is not a column of the results"),
        ("programs: [{mlp}]\noptions: {{fuse: maybe}}\n", r"s\.yaml:2: fuse must be true or false, not 'maybe'"),
        ("programs: [{mlp}]\ngrid:\n  tiling: [tpu_default, nope]\n", r"s\.yaml:3: tiling 'nope': "),
        # the name is the output folder's: a path would write outside reports/sweeps/
        ("programs: [{mlp}]\nname: ../../escape\n", r"s\.yaml:2: the name '\.\./\.\./escape' names the output folder"),
        ("programs: [{mlp}]\nname: /tmp/abs\n", r"s\.yaml:2: the name '/tmp/abs' names the output folder"),
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


def _until_a_row_is_recorded(proc: subprocess.Popen[str] | subprocess.Popen[bytes], journal: Path) -> None:
    """Wait (up to 120 s) until the sweep ``proc`` has recorded a row in ``journal``, still running."""
    deadline = time.monotonic() + 120
    while not (journal.exists() and journal.read_bytes().count(b"\n") >= 1):
        assert proc.poll() is None, "the sweep ended before it could be stopped"
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_killed_sweep_resumes_without_losing_or_repeating_a_row(tmp_path: Path) -> None:
    spec_path = tmp_path / "kill.yaml"
    spec_path.write_text(KILL_SPEC)
    total = len(load_spec(spec_path).points)
    assert total == 24
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "tpusim.cli", "sweep", str(spec_path), "--out", str(out), "-j", "2", "--no-progress"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = out / "journal.jsonl"
    try:
        _until_a_row_is_recorded(proc, journal)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its workers, at once
        proc.wait()
    done_before = journal.read_bytes().count(b"\n")
    assert 1 <= done_before < total
    # SIGKILL left the killed sweep's pid in journal.lock (the kernel released the flock): taken over
    with pytest.warns(SweepWarning, match=rf"journal\.lock: taking over the lock of pid {proc.pid}\b"):
        result = run_sweep(load_spec(spec_path), out, workers=2, progress=False)
    assert result.ran == total - done_before
    ids = [json.loads(line)["id"] for line in journal.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == total
    fresh = run_sweep(load_spec(spec_path), tmp_path / "fresh", workers=2, progress=False)
    assert fresh.ran == total
    assert (out / "results.csv").read_text() == (tmp_path / "fresh" / "results.csv").read_text()
    again = run_sweep(load_spec(spec_path), out, workers=2, progress=False)
    assert again.ran == 0 and journal.read_text().count("\n") == total


def test_a_terminated_sweep_stops_its_workers_and_writes_its_tables(tmp_path: Path) -> None:
    """SIGTERM (``kill``, a batch system's time limit) ended a sweep at once: no tables, its workers left to
    the resource tracker ("leaked semaphore objects"). It now stops as on Ctrl-C, with the shell's 143."""
    spec_path = tmp_path / "kill.yaml"
    spec_path.write_text(KILL_SPEC)
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "tpusim.cli", "sweep", str(spec_path), "--out", str(out), "-j", "2", "--no-progress",
           "--no-plots"]  # fmt: skip
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = out / "journal.jsonl"
    try:
        _until_a_row_is_recorded(proc, journal)
        proc.send_signal(signal.SIGTERM)  # the sweep's process only, as `kill PID` sends it
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, err
    assert "tpusim sweep: interrupted:" in err and "points are recorded in" in err, err
    assert "leaked" not in err and "Traceback" not in err, err
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) - 1 == journal.read_text().count("\n") >= 1


def _row(i: str) -> dict[str, object]:
    return {"index": 0, "id": i, "program": "p", "status": "ok"}


def test_journal_keeps_every_row_around_a_torn_last_line(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    j.append(_row("a"))
    j.close()
    with open(tmp_path / "journal.jsonl", "ab") as f:
        f.write(b'{"id": "b", "sta')  # a crash in the middle of a write
    with pytest.warns(SweepWarning, match=r"journal\.jsonl:2: skipped a line that is not a sweep row \(not valid "
                      r"JSON, cut short"):  # fmt: skip
        j = Journal(tmp_path)
    assert list(j.rows) == ["a"]
    j.append(_row("b"))
    j.close()
    lines = (tmp_path / "journal.jsonl").read_bytes().splitlines()
    assert lines[1] == b'{"id": "b", "sta'  # never truncated: the torn bytes stay, on a line of their own
    assert [json.loads(x)["id"] for x in (lines[0], lines[2])] == ["a", "b"]
    with pytest.warns(SweepWarning, match=r"journal\.jsonl:2: skipped"):
        assert list(Journal(tmp_path).rows) == ["a", "b"]


def test_journal_keeps_every_valid_row_after_a_corrupt_line(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    rows = [json.dumps(_row(i)).encode() for i in "abcde"]
    damaged = [rows[0], b'{"id": "x", "status": "ok", "ind\x00\xff', rows[1], b"[1, 2]", b'{"id": "y"}', b"",
               b"[" * 100_000, b"1" * 5000, rows[2], rows[3], rows[4] + b"\r"]  # fmt: skip
    data = b"\n".join(damaged) + b"\n"
    path.write_bytes(data)
    with pytest.warns(SweepWarning) as caught:
        j = Journal(tmp_path)
    assert list(j.rows) == ["a", "b", "c", "d", "e"]
    messages = [str(w.message) for w in caught]
    assert [m.split(": ")[0].rsplit(":", 1)[1] for m in messages] == ["2", "4", "5", "7", "8"]
    assert all(m.startswith(f"{path}:") and len(m) < 300 for m in messages)
    assert "no 'index'" in messages[2]
    j.append(_row("f"))
    j.close()
    assert path.read_bytes() == data + json.dumps(_row("f"), separators=(",", ":")).encode() + b"\n"


def test_a_row_whose_metric_is_not_a_number_is_skipped_not_rendered(tmp_path: Path) -> None:
    """A row whose measured column held text passed and then failed rendering sweep.md (a traceback)."""
    path = tmp_path / "journal.jsonl"
    bad = {**_row("b"), "cycles": "oops"}
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in (_row("a"), bad, _row("c"))))
    with pytest.warns(SweepWarning, match="'cycles' is not a number"):
        j = Journal(tmp_path)
    assert list(j.rows) == ["a", "c"]
    j.close()


def test_journal_keeps_a_whole_last_row_without_its_newline(tmp_path: Path) -> None:
    (tmp_path / "journal.jsonl").write_bytes(json.dumps(_row("a")).encode())
    j = Journal(tmp_path)
    assert list(j.rows) == ["a"]
    j.append(_row("b"))
    j.close()
    assert [json.loads(x)["id"] for x in (tmp_path / "journal.jsonl").read_text().splitlines()] == ["a", "b"]


def test_the_command_line_warns_of_a_damaged_journal_in_one_line(
    spec_path: Path, reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    lines = (reference / "journal.jsonl").read_bytes().splitlines(keepends=True)
    (out / "journal.jsonl").write_bytes(b"".join([*lines[:2], b"garbage\n", *lines[2:]]))
    assert main(["sweep", str(spec_path), "--out", str(out), "-j", "1", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert captured.err == f"tpusim sweep: warning: {out / 'journal.jsonl'}:3: skipped a line that is not a sweep " \
        "row (not valid JSON); the rows around it are kept\n"  # fmt: skip
    assert "6 points (0 failed, 0 run now)" in captured.out
    assert (out / "results.csv").read_text() == (reference / "results.csv").read_text()


def test_one_sweep_per_folder(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    owner = json.loads((tmp_path / "journal.lock").read_text())
    assert owner["pid"] == os.getpid()
    with pytest.raises(SweepError, match=rf"another sweep \(pid {os.getpid()}, since [-\dT:]+\) is writing this "
                       r"folder \(journal\.lock is held\); wait for it to finish, or give another --out"):  # fmt: skip
        Journal(tmp_path)
    j.close()
    assert (tmp_path / "journal.lock").read_text() == ""  # a clean exit leaves no owner behind
    Journal(tmp_path).close()  # and no warning


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_stale_lock_of_a_dead_sweep_is_taken_over(tmp_path: Path) -> None:
    import socket

    pid = _dead_pid()
    (tmp_path / "journal.lock").write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
    with pytest.warns(SweepWarning, match=rf"journal\.lock: taking over the lock of pid {pid}, which ended"):
        j = Journal(tmp_path)
    assert json.loads((tmp_path / "journal.lock").read_text())["pid"] == os.getpid()
    j.close()


def test_without_flock_the_pid_decides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a filesystem without flock (some network ones): a live owner on this host refuses, a dead one is taken
    over, an owner on another host refuses (its liveness cannot be checked from here)."""
    import errno
    import socket

    import tpusim.sweep.store as store

    def no_flock(fd: int, op: int) -> None:
        if op & store.fcntl.LOCK_EX:
            raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(store.fcntl, "flock", no_flock)
    lock = tmp_path / "journal.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock.write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname()}))
        with pytest.raises(SweepError, match=rf"another sweep \(pid {holder.pid}\) may be writing this folder"):
            Journal(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    lock.write_text(json.dumps({"pid": holder.pid, "host": "elsewhere"}))
    with pytest.raises(
        SweepError, match=rf"\(pid {holder.pid} on elsewhere\) may be writing .* delete .*journal\.lock"
    ):
        Journal(tmp_path)
    lock.write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname()}))
    with pytest.warns(SweepWarning, match=rf"taking over the lock of pid {holder.pid}"):
        Journal(tmp_path).close()


def test_a_second_sweep_on_the_same_folder_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_path = tmp_path / "kill.yaml"
    spec_path.write_text(KILL_SPEC)
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "tpusim.cli", "sweep", str(spec_path), "--out", str(out), "-j", "1", "--no-progress"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lock = out / "journal.lock"
    deadline = time.monotonic() + 120
    try:
        while not (lock.exists() and lock.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        before = (out / "journal.jsonl").read_bytes() if (out / "journal.jsonl").exists() else b""
        assert main(["sweep", str(spec_path), "--out", str(out), "-j", "1", "--no-progress"]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"tpusim sweep: {out}: another sweep (pid {proc.pid}, since ") and err.count("\n") == 1
        assert (out / "journal.jsonl").read_bytes()[: len(before)] == before  # nothing of the second one written
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    rows = [json.loads(x) for x in (out / "journal.jsonl").read_text().splitlines()]
    assert len({r["id"] for r in rows}) == len(rows)


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
    # the point of least time in the table, whichever it is (4 and 8 MXU rows differ by 2 cycles on this MLP)
    rows = list(csv.DictReader((reference / "results.csv").read_text().splitlines()))
    best = min(range(len(rows)), key=lambda i: float(rows[i]["seconds"]))
    rows_, bandwidth = rows[best]["mxu.rows"], float(rows[best]["hbm.bandwidth_bytes_per_s"])
    assert (
        f"**Best point** (lowest `seconds`): #{best}, mxu.rows = {rows_}, hbm.bandwidth_bytes_per_s = {bandwidth:.2g}"
        in md
    )
    for name in ("seconds", "mxu_busy_fraction", "pareto"):
        assert f"(plots/{name}.png)" in md
        img = imread(reference / "plots" / f"{name}.png")[..., :3]
        assert img.shape[0] > 300 and img.shape[1] > 500
        assert 0.01 < (img < 0.9).any(axis=-1).mean() < 0.9
        assert _colours(img) > 20


def test_no_plots_writes_the_tables_and_the_page_without_them(spec_path: Path, reference: Path, tmp_path: Path) -> None:
    """``--no-plots``: the same tables, a page without the plot section, no plots folder (resumed from the
    reference's journal, so no point runs again)."""
    for name in ("journal.jsonl", "spec.yaml"):
        (tmp_path / name).write_bytes((reference / name).read_bytes())
    assert main(["sweep", str(spec_path), "--out", str(tmp_path), "--no-plots", "--no-progress"]) == 0
    assert (tmp_path / "results.csv").read_bytes() == (reference / "results.csv").read_bytes()
    md = (tmp_path / "sweep.md").read_text()
    assert "**Best point**" in md and "plots/" not in md and not (tmp_path / "plots").exists()


def test_cli_dry_run(spec_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", str(spec_path), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        len(lines) == 6
        and lines[0].startswith("#0 ")
        and lines[0].endswith("mlp: mxu.rows=4, hbm.bandwidth_bytes_per_s=8000000000.0")
    )


@pytest.mark.parametrize("name", ["mxu_vs_hbm", "bf16_tiling", "vmem_vs_block", "megacore", "vector_units"])
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


def test_a_program_that_does_not_parse_is_the_specs_error(tmp_path: Path) -> None:
    """It passed --dry-run and failed at every point without naming the file."""
    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\nENTRY e {\n  ROOT x = f32[8] bogus(1)\n}\n")
    path = tmp_path / "s.yaml"
    path.write_text("programs: [bad.hlo]\n")
    with pytest.raises(SweepError, match=r"s\.yaml:1: program 'bad': .*bad\.hlo.*bogus"):
        load_spec(path)


def test_a_folder_of_other_files_is_not_taken_as_a_sweeps(spec_path: Path, tmp_path: Path) -> None:
    (tmp_path / "results.csv").write_text("my table")
    with pytest.raises(SweepError, match="not a sweep's"):
        run_sweep(load_spec(spec_path), tmp_path, progress=False)
    assert (tmp_path / "results.csv").read_text() == "my table"


_TINY = """HloModule tiny
ENTRY main {
  x = f32[ROWS,128] parameter(0)
  ROOT y = f32[ROWS,128] exponential(x)
}
"""


def test_a_resumed_sweep_runs_again_the_points_whose_files_changed(tmp_path: Path) -> None:
    """Points were matched by names and parameters only: after its program (or its chip file) was edited, a
    resumed sweep reported the old rows as results of the new files (found by a bad-input campaign)."""
    program = tmp_path / "p.hlo"
    program.write_text(_TINY.replace("ROWS", "8"))
    chip = tmp_path / "chip.yaml"
    chip.write_text((Path(__file__).parent.parent / "configs" / "teaching.yaml").read_text())
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text("name: s\nprograms:\n  p: p.hlo\nconfig: chip.yaml\ngrid:\n  dma.engines: [1, 2]\n")
    out = tmp_path / "out"
    first = run_sweep(load_spec(spec_path), out, progress=False, plots=False)
    assert first.ran == 2
    program.write_text(_TINY.replace("ROWS", "64"))
    again = run_sweep(load_spec(spec_path), out, progress=False, plots=False)
    assert again.ran == 2
    fresh = run_sweep(load_spec(spec_path), tmp_path / "fresh", progress=False, plots=False)
    assert [r["cycles"] for r in again.rows] == [r["cycles"] for r in fresh.rows] != [r["cycles"] for r in first.rows]
    chip.write_text(chip.read_text().replace("clock_hz:", "clock_hz: 5.0e8 #", 1))
    assert run_sweep(load_spec(spec_path), out, progress=False, plots=False).ran == 2
    assert run_sweep(load_spec(spec_path), out, progress=False, plots=False).ran == 0  # (nothing changed)
    # a tiling rule file the options name (found by the next campaign): edited, its points run again
    rules = tmp_path / "mine.yaml"
    rules.write_text("name: mine\nextends: tpu_default\nrules:\n  - {element_type: f32, tiles: '(S,L)'}\n")
    spec_path.write_text(spec_path.read_text() + f"options:\n  tiling: {rules}\n")
    assert run_sweep(load_spec(spec_path), out, progress=False, plots=False).ran == 2
    rules.write_text(rules.read_text().replace("(S,L)", "(1,L)"))
    assert run_sweep(load_spec(spec_path), out, progress=False, plots=False).ran == 2


def test_a_grid_that_lists_a_value_twice_is_refused(tmp_path: Path) -> None:
    """Both copies ran, but rows are matched to points by what they run, so the tables showed one point's row
    twice and the other's not at all (found by a campaign of bad inputs)."""
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text(f"name: s\nprograms:\n  p: {MLP}\nconfig: teaching\ngrid:\n  dma.engines: [2, 4, 2]\n")
    with pytest.raises(SweepError, match=r"s\.yaml: points 0 and 2 are the same run \(dma\.engines=2\)"):
        load_spec(spec_path)


def test_a_folder_of_another_sweep_is_not_resumed_by_this_one(tmp_path: Path) -> None:
    """A folder holding sweep a was taken as a resume of sweep b: a's spec.yaml and tables were replaced by
    b's (a campaign of bad inputs). A spec of the same sweep, edited, still resumes."""
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"name: a\nprograms:\n  p: {MLP}\nconfig: teaching\ngrid:\n  dma.engines: [1, 2]\n")
    b.write_text(f"name: b\nprograms:\n  p: {MLP}\nconfig: teaching\ngrid:\n  hbm.latency_ns: [100, 200]\n")
    out = tmp_path / "runs"
    run_sweep(load_spec(a), out, progress=False, plots=False)
    with pytest.raises(SweepError, match=r"runs: the folder holds sweep 'a' \(its spec\.yaml\), not 'b'"):
        run_sweep(load_spec(b), out, progress=False, plots=False)
    assert (out / "spec.yaml").read_text() == a.read_text()
    a.write_text(a.read_text().replace("[1, 2]", "[1, 2, 4]"))
    assert run_sweep(load_spec(a), out, progress=False, plots=False).ran == 1
