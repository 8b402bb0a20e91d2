"""The command line: outputs, exit statuses and error messages without tracebacks."""

import json
from pathlib import Path

import pytest

from tpusim.cli import main


def test_layout_writes_a_diagram(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d.svg"
    assert main(["layout", "f32[3,5]{1,0:T(2,2)}", "--out", str(out)]) == 0
    assert out.read_text().lstrip().startswith("<?xml")
    assert "96 bytes" in capsys.readouterr().err


def test_layout_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["layout", "bf16[4,8]{1,0:T(2,4)(2,1)}", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["linear_positions"][1] == [1, 3, 5, 7, 9, 11, 13, 15]


def test_bad_shape_is_one_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["layout", "f32[3,5]{1,1}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tpusim layout: invalid shape or layout at column 12: minor_to_major repeats dimension 1")
    assert "Traceback" not in err


def test_bad_output_suffix(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["layout", "f32[2]", "--out", str(tmp_path / "x.txt")]) == 1
    assert "written as .png, .svg or .pdf" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "ROOT c = bf16[4] stochastic-convert(x, r)",
            "the reference interpreter has no function for stochastic-convert",
        ),
        (
            'ROOT c = f32[4] custom-call(x, r), custom_call_target="my_kernel"',
            "no hardware lowering for custom-call, and custom-call target 'my_kernel' has no reference function",
        ),
    ],
)
def test_an_op_nothing_can_run_is_a_compile_error_at_its_line(
    line: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a lowering and without a reference function a fallback kernel could only fail when the device
    reached it; the compiler refuses the program up front instead, naming the instruction and its line."""
    path = tmp_path / "p.hlo"
    path.write_text(f"HloModule m\nENTRY e {{\n  x = f32[4] parameter(0)\n  r = u32[4] parameter(1)\n  {line}\n}}\n")
    assert main(["run", str(path), "--timing-only"]) == 1
    err = capsys.readouterr().err
    assert f"e/c ({path}:5): " in err
    assert expected in err
    assert "Traceback" not in err


def test_help_loads_no_compiler_device_or_report_code() -> None:
    """``tpusim --help`` (every subcommand's parser) imports only the command line (the report's and the
    sweep's ``command`` modules included) and the config loader:
    it took 1.1 s when building the parser loaded the HLO front end, the oracle, the sweep runner and the
    report's statistics (issue 17). A fresh interpreter, so nothing earlier tests imported counts."""
    import subprocess
    import sys

    code = (
        "import sys; from tpusim.cli import build_parser; build_parser(); "
        "print(sorted(m for m in sys.modules if m.startswith(('tpusim.compiler', 'tpusim.devices', "
        "'tpusim.report.', 'tpusim.sweep.', 'numpy')) and not m.endswith('.command')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
