"""Results for notebooks and dataframes: ``tpusim.report.to_pandas`` and the IPython extension that shows a
result as its summary table (issue 18)."""

from __future__ import annotations

import base64
import sys
from typing import Any

import pytest

import tpusim
from tpusim.report import summary_html, to_pandas, units_to_pandas
from tpusim.report.analysis import analyse
from tpusim.report.notebook import load_ipython_extension

PROGRAM = """HloModule mlp
ENTRY main {
  x = bf16[512,512] parameter(0)
  w = bf16[512,512] parameter(1)
  d = bf16[512,512] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = bf16[512,512] tanh(d)
}"""


@pytest.fixture(scope="module")
def result() -> tpusim.SimulationResult:
    return tpusim.simulate(PROGRAM, config="tpu_v5e", timing_only=True)


def test_to_pandas_has_a_row_per_op(result: tpusim.SimulationResult) -> None:
    frame = to_pandas(result)
    ops = analyse(result).ops
    assert list(frame.index) == [o["name"] for o in ops]
    assert frame.loc["d", "flops"] == 2 * 512**3
    assert {"span_cycles", "critical_path_fraction", "opcode", "source"} <= set(frame.columns)
    units = units_to_pandas(result)
    assert any(name.endswith("mxu0") for name in units.index)


def test_to_pandas_without_pandas_says_what_to_install(
    result: tpusim.SimulationResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas raises ImportError
    with pytest.raises(ImportError, match="pip install pandas"):
        to_pandas(result)


def test_a_notebook_shows_the_summary_table(result: tpusim.SimulationResult) -> None:
    html = summary_html(result)
    assert f"{result.cycles:,} cycles" in html and "<td>d</td>" in html and "tpu_v5e" in html
    png = base64.b64decode(html.split("data:image/png;base64,")[1].split("'")[0])
    assert png.startswith(b"\x89PNG")  # the timeline, inline
    assert result._repr_html_() == html  # what Jupyter shows without the extension

    class Formatter:
        def __init__(self) -> None:
            self.by_type: dict[type, Any] = {}

        def for_type(self, cls: type, fn: Any) -> None:
            self.by_type[cls] = fn

    class Shell:  # the part of IPython's shell the extension uses
        def __init__(self) -> None:
            self.display_formatter = type("D", (), {"formatters": {"text/html": Formatter()}})()

    shell = Shell()
    load_ipython_extension(shell)
    shown = shell.display_formatter.formatters["text/html"].by_type[tpusim.SimulationResult](result)
    assert shown == html
