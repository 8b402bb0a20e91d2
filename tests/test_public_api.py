"""The package's public surface: ``tpusim --version``, ``python -m tpusim``, presets in ``--help``, and the
names ``import tpusim`` offers (``__all__``, ``dir``), each the object its defining module has."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tpusim
from tpusim.cli import build_parser, main, shipped_presets
from tpusim.config import CONFIG_DIR, PRESETS

ROOT = Path(__file__).resolve().parents[1]


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"tpusim {tpusim.__version__}"


def test_python_dash_m_runs_the_command_line() -> None:
    done = subprocess.run([sys.executable, "-m", "tpusim", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"tpusim {tpusim.__version__}"
    bad = subprocess.run([sys.executable, "-m", "tpusim", "layout", "bf16[2"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert bad.returncode == 1 and bad.stderr.startswith("tpusim layout: ")


@pytest.mark.parametrize("command", ["run", "compile"])
def test_help_lists_the_shipped_presets(command: str) -> None:
    chips, tilings = shipped_presets(), shipped_presets("tiling")
    assert set(chips) == set(PRESETS) and "tpu_default" in tilings and "bf16_16x128" in tilings
    assert tilings == sorted(p.stem for p in (CONFIG_DIR / "tiling").glob("*.yaml"))
    sub = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    text = " ".join(sub.format_help().split())
    assert f"presets: {', '.join(chips)}" in text
    assert f"shipped: {', '.join(tilings)}" in text


def test_the_public_names() -> None:
    from tpusim.compiler.errors import CompileError
    from tpusim.compiler.options import CompileOptions
    from tpusim.compiler.pipeline import CompiledProgram
    from tpusim.config import ChipConfig, load_config
    from tpusim.limits import RunLimitError

    assert tpusim.CompileOptions is CompileOptions and tpusim.load_config is load_config
    assert tpusim.CompiledProgram is CompiledProgram and tpusim.ChipConfig is ChipConfig
    assert tpusim.RunLimitError is RunLimitError and tpusim.CompileError is CompileError
    names = set(dir(tpusim))
    want = {"simulate", "simulate_jax", "compile_program", "CompileOptions", "load_config", "SimulationResult",
            "CompiledProgram", "TpusimError", "RunLimitError", "__version__"}  # fmt: skip
    assert want <= set(tpusim.__all__) <= names
    for name in tpusim.__all__:
        value = getattr(tpusim, name)
        if name.endswith("Error"):
            assert issubclass(value, tpusim.TpusimError), name
    scope: dict[str, object] = {}
    exec("from tpusim import *", scope)
    assert scope["simulate"] is tpusim.simulate and scope["CompileOptions"] is CompileOptions
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        tpusim.nonesuch  # noqa: B018


def test_run_limit_error_is_with_the_other_errors() -> None:
    import tpusim.errors
    from tpusim.errors import RunLimitError
    from tpusim.limits import RunLimitError as Defined

    assert RunLimitError is Defined and issubclass(RunLimitError, tpusim.errors.TpusimError)
    with pytest.raises(AttributeError):
        tpusim.errors.Nonesuch  # type: ignore[attr-defined]  # noqa: B018


def test_compile_options_from_the_package_compile_a_program() -> None:
    hlo = "HloModule m\nENTRY e {\n  x = f32[8,128] parameter(0)\n  ROOT y = f32[8,128] add(x, x)\n}\n"
    compiled = tpusim.compile_program(hlo, config=tpusim.load_config("teaching"),
                                      options=tpusim.CompileOptions(fuse=False))  # fmt: skip
    assert isinstance(compiled, tpusim.CompiledProgram)


def test_format_summary_needs_no_made_up_host_time() -> None:
    """From Python the summary's host line adds up the times the result measured (the tutorial's call)."""
    from tpusim.report.summary import format_summary

    hlo = "HloModule m\nENTRY e {\n  x = f32[8,128] parameter(0)\n  ROOT y = f32[8,128] add(x, x)\n}\n"
    result = tpusim.simulate(hlo, config="teaching")
    host = format_summary(result).splitlines()[1]
    assert result.compile_seconds > 0 and result.run_seconds > 0
    assert host.endswith(f"; {result.compile_seconds + result.run_seconds:.2f} s in all")
    assert format_summary(result, 12.5).splitlines()[1].endswith("; 12.50 s in all")


def test_a_result_summarises_itself_and_gives_a_frame() -> None:
    """``result.summary()`` is the text ``tpusim run`` prints; ``result.to_pandas()`` the per-op frame."""
    from tpusim.report.summary import format_summary

    result = tpusim.simulate(ROOT / "examples" / "mlp_bf16.hlo", timing_only=True)
    assert result.summary() == format_summary(result)
    assert result.summary().startswith("program ")
    frame = result.to_pandas()
    assert len(frame) > 0 and "span_cycles" in frame.columns


def test_a_string_is_hlo_text_when_it_has_a_computation_else_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a campaign of bad inputs: a string was taken for HLO text only when it held "HloModule", so
    text without a header (which the parser accepts) was opened as a file named by the whole program, a file
    whose name held "HloModule" was parsed as text, and a missing file was a bare FileNotFoundError."""
    body = "ENTRY main {\n  a = f32[8,128] parameter(0)\n  ROOT n = f32[8,128] negate(a)\n}\n"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "HloModule_a.hlo").write_text("HloModule m\n" + body)
    assert tpusim.compile_program(body).source.entry_computation.root == "n"
    assert tpusim.compile_program("HloModule_a.hlo").source.name == "m"
    for compiler in ("tpusim", "xla"):  # (XLA's path refuses it before it needs libtpu)
        with pytest.raises(tpusim.TpusimError, match=r"'missing.hlo' is not HLO text .* no file has that path"):
            tpusim.simulate("missing.hlo", timing_only=True, compiler=compiler)


_SRC = "HloModule m\nENTRY main {\n  a = f32[8,128] parameter(0)\n  ROOT n = f32[8,128] negate(a)\n}\n"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: tpusim.simulate(_SRC, seed=-1), "seed must be a whole number"),
        (lambda: tpusim.simulate(_SRC, seed="3"), "seed must be a whole number"),
        (lambda: tpusim.simulate(_SRC, seed=2**64), "seed must be a whole number"),
        (lambda: tpusim.simulate(_SRC, overrides="mxu.rows=64"), "overrides must be a list"),
        (lambda: tpusim.simulate(_SRC, overrides=["mxu.rows=64", 5]), "an override must be"),
        (lambda: tpusim.simulate(_SRC, chips=4, topology=5), "topology must be"),
        (lambda: tpusim.simulate(_SRC, monitor=1), "monitor must be"),
        (lambda: tpusim.simulate(_SRC, (x for x in [1])), "inputs must be a list or tuple"),
        (lambda: tpusim.simulate(_SRC, {"arg0": 1}), "inputs must be a list or tuple"),
        (lambda: tpusim.simulate(Path("/")), "cannot open /: Is a directory"),
        (lambda: tpusim.simulate(_SRC, options=tpusim.CompileOptions(tiling=5)), "tiling must be"),  # type: ignore[arg-type]
        (lambda: tpusim.compile_program(_SRC, config=5), "config must be"),  # type: ignore[arg-type]
        (lambda: tpusim.compile_program(_SRC, options="x"), "options must be"),  # type: ignore[arg-type]
        (lambda: tpusim.load_config(None), "a chip config is a preset name or a YAML path"),  # type: ignore[arg-type]
        (lambda: tpusim.load_config("tpu_v5e", overrides=[("mxu.rows", 64)]), "an override must be a"),  # type: ignore[list-item]
        (lambda: tpusim.simulate_jax(5, 1), "takes the function to lower first"),  # type: ignore[arg-type]
    ],
)
def test_api_arguments_of_the_wrong_kind_are_named(call: object, message: str) -> None:
    """Found by a campaign of bad inputs: each of these ended in a bare numpy or Python error (or a string of
    overrides was read one character at a time)."""
    with pytest.raises(tpusim.TpusimError, match=message):
        call()  # type: ignore[operator]


def test_api_takes_override_dicts_and_inputs_in_the_other_byte_order() -> None:
    """``load_config`` took ``{"mxu.rows": 64}`` and ``simulate`` read its keys as override texts; an input
    of the right type in big-endian order holds the same values and is taken (as the CLI's npz reader does)."""
    a = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    r = tpusim.simulate(_SRC, [a.astype(">f4")], overrides={"mxu.rows": 64})
    assert r.compiled.config.mxu.rows == 64
    np.testing.assert_array_equal(r.outputs[0], -a)
