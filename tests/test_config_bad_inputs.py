"""Bad config input (issue 13): YAML that is not plain data, values that make no sense or would make a run spin,
integers of thousands of digits, and cross-key checks that blame the right key. Each is a ConfigError (or a
SweepError for sweep points) with one short first line naming the file, line and column, or the override, and
the key; the command line prints it and exits 1."""

from __future__ import annotations

import dataclasses
import math
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import numpy as np
import pytest

from tpusim.cli import main
from tpusim.compiler.tiling_rules import load_tiling_rules
from tpusim.config import (
    CONFIG_DIR,
    MAX_LATENCY_CYCLES,
    ChipConfig,
    load_config,
    override_values,
    with_overrides,
)
from tpusim.errors import ConfigError, TpusimError
from tpusim.sweep import load_spec

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "tests" / "hlo_samples" / "jax_mlp_short.hlo"
BASE = (CONFIG_DIR / "teaching.yaml").read_text()
HUGE = "9" * 5000  # over Python's 4,300-digit limit of int(str)
LONG = "9" * 4000  # under it: read, then out of range


def _first_line(err: BaseException) -> str:
    line = str(err).splitlines()[0]
    assert len(line) <= 400, line
    return line


# ---------------------------------------------------------------------------------------------------------
# 1. YAML that is not plain data: chip configs, tiling rule sets, sweep specs
# ---------------------------------------------------------------------------------------------------------
BAD_YAML = [
    ("!!python/name:os.system", r"the tag !!python/name:os\.system is not supported"),
    ("!!python/object/apply:os.system [ls]", r"the tag !!python/object/apply:os\.system is not supported"),
    ("!foo 3", r"the tag !foo is not supported"),
    ("!!binary aGVsbG8=", r"the tag !!binary is not supported"),
    ("!!int abc", r"'abc' is not a valid !!int value"),
    ("!!float x1", r"'x1' is not a valid !!float value"),
    ("!!bool maybe", r"'maybe' is not a valid !!bool value"),
    (HUGE, r"an integer of 5,000 digits is too long to read"),
]


@pytest.mark.parametrize(("value", "message"), BAD_YAML, ids=[v[:20] for v, _ in BAD_YAML])
def test_chip_config_yaml_that_is_not_plain_data(tmp_path: Path, value: str, message: str) -> None:
    text = BASE.replace("clock_hz: 1.0e9", f"clock_hz: {value}", 1)
    line = text[: text.index("clock_hz:")].count("\n") + 1
    path = tmp_path / "chip.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"chip\.yaml:{line}:11: clock_hz: {message}") as err:
        load_config(path)
    _first_line(err.value)
    with pytest.raises(ConfigError, match=rf"override 'clock_hz=.*': clock_hz: {message}"):
        load_config("teaching", [f"clock_hz={value}"])


def test_aliases_merge_keys_and_deep_nesting_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "chip.yaml"
    path.write_text(BASE.replace("  rows: 8 ", "  rows: &r 8 ", 1).replace("  cols: 8 ", "  cols: *r ", 1))
    with pytest.raises(ConfigError, match=r"chip\.yaml:\d+:9: mxu\.cols: aliases \(\*r\) are not supported"):
        load_config(path)
    path.write_text(BASE.replace("mxu:\n", "mxu:\n  <<: {rows: 8}\n", 1))
    with pytest.raises(ConfigError, match=r"chip\.yaml:\d+:3: mxu: merge keys \(<<\) are not supported"):
        load_config(path)
    path.write_text(BASE + "deep: " + "[" * 200 + "]" * 200 + "\n")
    with pytest.raises(ConfigError, match=r"nested more than 64 levels deep") as err:
        load_config(path)
    _first_line(err.value)
    # an exponential "billion laughs" document is refused at its first alias, without expanding it
    laughs = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
    )
    path.write_text(laughs)
    with pytest.raises(ConfigError, match=r"chip\.yaml:2:8: b\[0\]: aliases \(\*a\) are not supported"):
        load_config(path)


def test_files_that_are_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "chip.yaml"
    path.write_bytes(BASE.encode().replace(b"name: teaching", b"name: teach\xffing", 1))
    with pytest.raises(ConfigError, match=r"chip\.yaml:\d+: not UTF-8 text \(byte 0xff\)"):
        load_config(path)
    path.write_bytes(b"name: x\x00\n")
    with pytest.raises(ConfigError, match=r"chip\.yaml:1:8: not valid YAML: unacceptable character"):
        load_config(path)


@pytest.mark.parametrize(("value", "message"), BAD_YAML, ids=[v[:20] for v, _ in BAD_YAML])
def test_tiling_rule_set_yaml_that_is_not_plain_data(tmp_path: Path, value: str, message: str) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(f"name: mine\nextends: tpu_default\nrules:\n  - rank: 2\n    bits: {value}\n    tiles: '(S,L)'\n")
    with pytest.raises(ConfigError, match=rf"rules\.yaml:5:11: rules\[0\]\.bits: {message}"):
        load_tiling_rules(path)
    path.write_text("name: mine\nrules:\n  - &x {rank: 2, tiles: '(S,L)'}\n  - *x\n")
    with pytest.raises(ConfigError, match=r"rules\.yaml:4:5: rules\[1\]: aliases \(\*x\) are not supported"):
        load_tiling_rules(path)


@pytest.mark.parametrize(("value", "message"), BAD_YAML, ids=[v[:20] for v, _ in BAD_YAML])
def test_sweep_spec_yaml_that_is_not_plain_data(tmp_path: Path, value: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(f"programs: [{MLP}]\nconfig: teaching\ngrid:\n  mxu.rows:\n    - 4\n    - {value}\n")
    with pytest.raises(ConfigError, match=rf"s\.yaml:6:7: grid\.mxu\.rows\[1\]: {message}") as err:
        load_spec(path)
    _first_line(err.value)
    path.write_text(f"programs: [{MLP}]\nset: &b {{mxu.rows: 4}}\noptions: *b\n")
    with pytest.raises(ConfigError, match=r"s\.yaml:3:10: options: aliases \(\*b\) are not supported"):
        load_spec(path)
    path.write_text(f"programs: [{MLP}]\nset:\n  <<: {{mxu.rows: 4}}\n")
    with pytest.raises(ConfigError, match=r"s\.yaml:3:3: set: merge keys \(<<\) are not supported"):
        load_spec(path)


def test_the_command_line_prints_one_line_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "chip.yaml"
    path.write_text(BASE.replace("clock_hz: 1.0e9", "clock_hz: !!python/name:os.system", 1))
    assert main(["run", str(MLP), "--config", str(path), "--timing-only"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "chip.yaml:" in err and "Traceback" not in err
    for option in ("dma.setup_cycles=1e15", f"mxu.rows={HUGE}", "smem.bytes=6", "hbm.latency_ns=.inf"):
        assert main(["run", str(MLP), "--config", "teaching", "--set", option, "--timing-only"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and option.split("=")[0] in err and len(err) < 400, err


# ---------------------------------------------------------------------------------------------------------
# 2. Values that make no sense or would make a run spin: one rule per kind of key
# ---------------------------------------------------------------------------------------------------------
def _numeric_keys(cls: Any = ChipConfig, prefix: str = "") -> list[tuple[str, Any]]:
    """Every numeric key of the schema (dotted) with its type."""
    out = []
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if get_origin(tp) in (Union, types.UnionType):
            tp = next(a for a in get_args(tp) if a is not type(None))
        if dataclasses.is_dataclass(tp):
            out += _numeric_keys(tp, f"{prefix}{f.name}.")
        elif tp in (int, float) or (get_origin(tp) is tuple and get_args(tp)[0] is int):
            out.append((prefix + f.name, tp))
    return out


NUMERIC_KEYS = _numeric_keys()


def test_the_schema_has_the_numeric_keys_the_limits_cover() -> None:
    keys = dict(NUMERIC_KEYS)
    assert len(keys) > 40 and "dma.setup_cycles" in keys and "ici.max_shape" in keys and "clock_hz" in keys


@pytest.mark.parametrize(("key", "tp"), NUMERIC_KEYS, ids=[k for k, _ in NUMERIC_KEYS])
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1e300", "-1", HUGE, LONG], ids=lambda v: v[:8])
def test_every_numeric_key_rejects_nonsense_naming_the_key(key: str, tp: Any, value: str) -> None:
    if key.startswith("published.") and key.endswith("_per_s") and value == "1e300":
        pytest.skip("a published figure is only compared, any finite positive value is fine")
    text = value if tp in (int, float) else f"[{value}, {0 if key == 'ici.routing' else 2}]"
    with pytest.raises(ConfigError) as err:
        load_config("tpu_v5e", [f"{key}={text}"])
    line = _first_line(err.value)
    assert f": {key}" in line, line


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("clock_hz=.inf", r"clock_hz: must be a finite number, not inf"),
        ("clock_hz=1e-300", r"clock_hz: must be from 1e\+06 to 1e\+12 Hz"),
        ("hbm.latency_ns=.nan", r"hbm\.latency_ns: must be a finite number, not nan"),
        ("vpu.alu.latency_cycles=.inf", r"vpu\.alu\.latency_cycles: expected an integer, not inf"),
        ("dma.runs_per_cycle=1e-300", r"dma\.runs_per_cycle: must be at least 1/1,024 per cycle"),
        ("dma.setup_cycles=1e15", r"dma\.setup_cycles: must be at most 2\^20 = 1,048,576 cycles"),
        ("hbm.latency_ns=1e15", r"hbm\.latency_ns: 1e\+15 ns is 1e\+15 cycles at clock_hz 1e\+09, more than 2\^20"),
        ("hbm.bandwidth_bytes_per_s=1", r"hbm\.bandwidth_bytes_per_s: 1 bytes/s is 1e-09 bytes per cycle"),
        ("xlu.transpose_cycles_per_vreg=5000", r"xlu\.transpose_cycles_per_vreg: must be at most 1,024 cycles"),
        ("hbm.bytes=1e20", r"hbm\.bytes: must be at most 2\^48"),
        ("dma.burst_bytes=281474976710656", r"dma\.burst_bytes: must be at most 2\^16 = 65,536 bytes"),
        ("hbm.interleave_bytes=100000", r"hbm\.interleave_bytes: must be at most 2\^16"),
        ("mxu.rows=100000", r"mxu\.rows: must be at most 65,536"),
        ("published.tolerance=2", r"published\.tolerance: must be a fraction from 0 to 1"),
        ("mxu.result_buffer_rows=1", r"mxu\.result_buffer_rows: must be a multiple of 2 x vpu\.sublanes = 16"),
        ("mxu.result_buffer_rows=24", r"mxu\.result_buffer_rows: must be a multiple of 2 x vpu\.sublanes = 16"),
        ("mxu.weight_load_cycles=0", r"mxu\.weight_load_cycles: must be positive, not 0"),
    ],
)
def test_values_that_make_no_sense_are_refused_at_load(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"override '{override.replace('.', '[.]')}': {message}"):
        load_config("teaching", [override])


def test_limits_hold_in_files_and_python_overrides(tmp_path: Path) -> None:
    path = tmp_path / "chip.yaml"
    text = BASE.replace("  setup_cycles: ", "  setup_cycles: 1e15 #", 1)
    path.write_text(text)
    line = text[: text.index("  setup_cycles")].count("\n") + 1
    with pytest.raises(ConfigError, match=rf"chip\.yaml:{line}: dma\.setup_cycles: must be at most 2\^20"):
        load_config(path)
    cfg = load_config("teaching")
    with pytest.raises(ConfigError, match=r"dma\.setup_cycles: must be at most 2\^20"):
        with_overrides(cfg, {"dma.setup_cycles": 10**15})
    with pytest.raises(ConfigError, match=r"clock_hz: must be a finite number, not inf"):
        with_overrides(cfg, {"clock_hz": math.inf})
    with pytest.raises(ConfigError, match=r"mxu\.rows: must be at most 65,536 .*not an integer of 5,000 digits"):
        with_overrides(cfg, {"mxu.rows": 10**5000})
    assert with_overrides(cfg, {"dma.setup_cycles": MAX_LATENCY_CYCLES}).dma.setup_cycles == MAX_LATENCY_CYCLES


def test_every_shipped_config_is_within_the_limits() -> None:
    for path in sorted(CONFIG_DIR.glob("*.yaml")):
        load_config(path)


SPIN = """HloModule spin
ENTRY e {
  a = f32[64,256] parameter(0)
  b = f32[256,128] parameter(1)
  ROOT d = f32[64,128] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


@pytest.mark.parametrize(
    "override",
    ["dma.setup_cycles=1048576", "hbm.latency_ns=1048576", "dma.runs_per_cycle=0.0009765625",
     "hbm.bandwidth_bytes_per_s=976563", "vpu.alu.issue_vregs_per_cycle=0.0009765625", "dma.burst_bytes=65536"],
)  # fmt: skip
def test_a_run_at_a_limit_ends_with_exact_cycles(override: str) -> None:
    """At each limit a small matmul still runs to the end, far below 2^53 cycles (dma.setup_cycles=1e15 spun)."""
    import tpusim

    result = tpusim.simulate(SPIN, config="teaching", overrides=[override], timing_only=True)
    assert 0 < result.cycles < 2**44


@pytest.mark.parametrize("rows", [16, 32, 48])
def test_the_smallest_result_buffers_compute_right(rows: int) -> None:
    """result_buffer_rows 1 divided by zero in the dot lowering, and 20 or 40 (halves not of whole registers)
    overran the buffer; every multiple of 2 x sublanes computes the product."""
    import tpusim

    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 256)).astype(np.float32)
    b = rng.standard_normal((256, 128)).astype(np.float32)
    result = tpusim.simulate(SPIN, [a, b], config="tpu_v5e", overrides=[f"mxu.result_buffer_rows={rows}"])
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(result.outputs[0] - want).max() <= 0.05 * np.abs(want).max()


# ---------------------------------------------------------------------------------------------------------
# 3. Integers of thousands of digits: configs, --set, Python overrides, sweep specs
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("digits", [HUGE, LONG], ids=["5000-digits", "4000-digits"])
def test_integers_of_thousands_of_digits(tmp_path: Path, digits: str) -> None:
    path = tmp_path / "chip.yaml"
    path.write_text(BASE.replace("  rows: 8 ", f"  rows: {digits} ", 1))
    with pytest.raises(ConfigError, match=r"chip\.yaml:\d+(:\d+)?: mxu\.rows: ") as err:
        load_config(path)
    _first_line(err.value)
    with pytest.raises(ConfigError, match=r"override 'mxu\.rows=9+\.\.\. \([\d,]+ characters\)': mxu\.rows: ") as err:
        load_config("teaching", [f"mxu.rows={digits}"])
    _first_line(err.value)
    with pytest.raises(ConfigError, match=r"mxu\.rows: ") as err:
        override_values([f"mxu.rows={digits}"]) if digits == HUGE else with_overrides(
            load_config("teaching"), override_values([f"mxu.rows={digits}"])
        )
    _first_line(err.value)
    spec = tmp_path / "s.yaml"
    spec.write_text(f"programs: [{MLP}]\nconfig: teaching\ngrid:\n  mxu.rows: [{digits}]\n")
    with pytest.raises(TpusimError, match=r"s\.yaml:4(:\d+)?: .*mxu\.rows") as err:
        load_spec(spec)
    _first_line(err.value)
    spec.write_text(f"programs: [{MLP}]\nconfig: teaching\nseed: {digits}\n")
    with pytest.raises(TpusimError, match=r"s\.yaml:3(:\d+)?: .*seed") as err:
        load_spec(spec)
    _first_line(err.value)


def test_huge_integers_in_the_api_overrides() -> None:
    import tpusim

    cfg = load_config("teaching")
    with pytest.raises(ConfigError, match=r"override 'mxu\.rows=9+.*': mxu\.rows: an integer of 5,000 digits"):
        tpusim.compile_program(SPIN, config=cfg, overrides=[f"mxu.rows={HUGE}"])
    # --set and the API type values alike: 1.5e9 is a number (YAML 1.2), not the text PyYAML alone reads
    assert tpusim.compile_program(SPIN, config=cfg, overrides=["clock_hz=1.5e9"]).config.clock_hz == 1.5e9


# ---------------------------------------------------------------------------------------------------------
# 4. Cross-key checks blame the key that is wrong
# ---------------------------------------------------------------------------------------------------------
def test_smem_bytes_is_blamed_for_smem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^override 'smem\.bytes=6': smem\.bytes: memories hold whole 32-bit"):
        load_config("teaching", ["smem.bytes=6"])
    with pytest.raises(ConfigError, match=r"^override 'vmem\.bytes=6': vmem\.bytes: "):
        load_config("teaching", ["vmem.bytes=6"])
    with pytest.raises(ConfigError, match=r"^override smem\.bytes=6: smem\.bytes: memories hold whole"):
        with_overrides(load_config("teaching"), {"smem.bytes": 6})
    path = tmp_path / "chip.yaml"
    text = BASE.replace("smem:\n  bytes: ", "smem:\n  bytes: 6 #", 1)
    assert text != BASE
    path.write_text(text)
    line = text[: text.index("  bytes: 6 #")].count("\n") + 1
    with pytest.raises(ConfigError, match=rf"chip\.yaml:{line}: smem\.bytes: memories hold whole 32-bit words"):
        load_config(path)


def test_a_rule_between_keys_broken_by_an_override_names_the_override() -> None:
    """The line is where the other key is written in the preset; the override that broke the rule was not
    named (a helper's CLI sweep)."""
    with pytest.raises(ConfigError, match=r"mxu\.result_buffer_rows: .* \(with the overrides vpu\.sublanes=3\)"):
        load_config("tpu_v5e", overrides=["vpu.sublanes=3"])


def test_core_count_is_bounded() -> None:
    """65,536 TensorCores (within the generic count bound) ran for minutes: megacore compares every pair of
    cores at each instruction."""
    with pytest.raises(ConfigError, match=r"core\.count: must be at most 64 TensorCores per chip, not 65536"):
        load_config("tpu_v5e", overrides=["core.count=65536"])


@pytest.mark.parametrize("name", ["../../../outside", "a/b", "..", ""])
def test_a_chip_name_with_a_path_is_refused(tmp_path: Path, name: str) -> None:
    """The name is part of the default report folder, reports/<program>-<name>/: `../x` wrote the report
    outside reports/ (found by a bad-input campaign)."""
    path = tmp_path / "chip.yaml"
    path.write_text(BASE.replace("name: teaching", f"name: {name!r}", 1))
    with pytest.raises(ConfigError, match=r"chip\.yaml:\d+: name: .* give a plain name, no path"):
        load_config(path)
