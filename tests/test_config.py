"""Chip configs: shipped files load and match published figures; bad input is rejected by file, line and key."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from tpusim.config import (
    CONFIG_DIR,
    PRESETS,
    ChipConfig,
    ConfigValueError,
    load_config,
    parse_override,
    with_overrides,
)
from tpusim.errors import ConfigError

# Published figures from Google Cloud's TPU pages (https://cloud.google.com/tpu/docs/v4, .../v5e, .../v5p,
# .../v6e): peak bf16 FLOP/s, HBM bytes/s.
PUBLISHED = {
    "tpu_v4": (275e12, 1200e9),
    "tpu_v5e": (197e12, 819e9),
    "tpu_v5p": (459e12, 2765e9),
    "tpu_v6e": (918e12, 1640e9),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_load_and_self_check(name):
    cfg = load_config(name)
    assert cfg.name == name
    assert cfg.check_published() == []
    assert cfg.source == str(PRESETS[name]) and cfg.overrides == ()


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_derived_peaks_match_vendor_numbers(name):
    cfg = load_config(name)
    flops, hbm = PUBLISHED[name]
    assert cfg.peak_bf16_flops_per_s == pytest.approx(flops, rel=0.01)
    assert cfg.hbm.bandwidth_bytes_per_s == pytest.approx(hbm, rel=0.001)


def test_teaching_chip_is_small_and_exact():
    cfg = load_config("teaching")
    assert (cfg.mxu.rows, cfg.mxu.cols, cfg.vpu.sublanes, cfg.vpu.lanes) == (8, 8, 8, 8)
    assert cfg.vpu.vreg_bytes == 256 and cfg.hbm_bytes_per_cycle == 16.0
    assert cfg.cycles(20) == 20 and cfg.peak_bf16_flops_per_s == 128e9


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.yaml")))
def test_every_number_has_a_source_comment(path):
    for i, line in enumerate(path.read_text().splitlines(), 1):
        m = re.match(r"\s*[a-z_0-9]+:\s*([^#\s][^#]*?)\s*(#.*)?$", line)
        if m and re.search(r"\d", m.group(1)) and not line.lstrip().startswith("name:"):
            follow = path.read_text().splitlines()[i] if i < len(path.read_text().splitlines()) else ""
            assert m.group(2) or follow.strip().startswith("#"), f"{path.name}:{i} has no source comment: {line}"


def _fields(cls, prefix=""):
    out = []
    for f in dataclasses.fields(cls):
        if f.name in ("source", "overrides"):
            continue
        tp = cls.__annotations__[f.name] if isinstance(cls.__annotations__[f.name], type) else None
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if f.name == "published":
            from tpusim.config import PublishedFigures

            out += _fields(PublishedFigures, "published.")
        elif sub is not None and dataclasses.is_dataclass(sub()):
            out += _fields(type(sub()), f"{prefix}{f.name}.")
        elif tp is None and f.name in ("vmem", "smem", "hbm"):
            from tpusim.config import HbmConfig, SmemConfig, VmemConfig

            out += _fields({"vmem": VmemConfig, "smem": SmemConfig, "hbm": HbmConfig}[f.name], f"{f.name}.")
        else:
            out.append(prefix + f.name)
    return out


def test_readme_documents_every_key():
    readme = (CONFIG_DIR / "README.md").read_text()
    keys_section = readme[readme.index("## Keys") :]
    documented = set(re.findall(r"^\| `([a-z_.0-9]+)` \|", keys_section, re.M)) - {"published"}
    keys = set(_fields(ChipConfig))
    assert "vpu.alu.latency_cycles" in keys and "published.tolerance" in keys
    assert keys <= documented, f"undocumented: {sorted(keys - documented)}"
    assert documented <= keys, f"documented but unknown: {sorted(documented - keys)}"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "chip.yaml"
    p.write_text(text)
    return p


BASE = (CONFIG_DIR / "teaching.yaml").read_text()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("  rows: 8 ", "  rowz: 8 "), r"chip\.yaml:{line}: mxu\.rowz: unknown key; MxuConfig keys are: count, rows"),
        (("  rows: 8 ", "  rows: eight "), r"chip\.yaml:{line}: mxu\.rows: expected an integer, not 'eight'"),
        (("  rows: 8 ", "  rows: -8 "), r"chip\.yaml:{line}: mxu\.rows: must be positive, not -8"),
        (("  double_buffered: true", "  double_buffered: 1"), r":{line}: mxu\.double_buffered: expected true or false"),
        (("  topology: torus", "  topology: hypercube"), r":{line}: ici\.topology: expected 'torus' or 'mesh'"),
        (("  dims: 1 ", "  dims: 2 "), r":{line}: ici\.max_shape: must have 2 entries"),
        (("clock_hz: 1.0e9", "clock_hz: [1]"), r"chip\.yaml:{line}: clock_hz: expected a number, not a list"),
        (("  rows: 8 ", "  rows: 8\n  rows: 8 "), r":{next}: mxu\.rows: key given twice \(first at line {line}\)"),
        (
            ("  peak_bf16_flops_per_s: 1.28e11", "  peak_bf16_flops_per_s: 1.3e11"),
            r"published\.peak_bf16_flops_per_s: the config gives 1\.28e\+11 but the published figure is 1\.3e\+11",
        ),
        (("hbm:\n  bytes: 1048576", "hbm:\n  extra: 3\n  bytes: 1048576"), r":{next}: hbm\.extra: unknown key"),
    ],
)
def test_bad_files_name_file_line_and_key(tmp_path, edit, message):
    old, new = edit
    assert old in BASE
    text = BASE.replace(old, new, 1)
    line = text[: text.index(new)].count("\n") + 1
    path = _write(tmp_path, text)
    if "max_shape" in message:  # the error is reported at the key that is inconsistent, max_shape
        line = text[: text.index("  max_shape")].count("\n") + 1
    with pytest.raises(ConfigError, match=message.format(line=line, next=line + 1)):
        load_config(path)


def test_missing_required_key_and_missing_file(tmp_path):
    path = _write(tmp_path, BASE.replace("  bytes: 65536 ", "  # no size "))
    with pytest.raises(ConfigError, match=r"chip\.yaml:\d+: vmem\.bytes: required key is missing"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"cannot read config 'no_such_chip'.*presets are: tpu_v4"):
        load_config("no_such_chip")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "name: [unclosed"))


def test_overrides_are_typed_like_yaml():
    cfg = load_config(
        "teaching",
        ["mxu.rows=16", "mxu.double_buffered=false", "hbm.bandwidth_bytes_per_s=3.2e10", "mxu.weight_load_cycles=null"],
    )
    assert cfg.mxu.rows == 16 and cfg.mxu.double_buffered is False
    assert cfg.hbm.bandwidth_bytes_per_s == 3.2e10 and cfg.mxu.load_cycles == 16
    assert cfg.overrides[0] == "mxu.rows=16"
    # overridden configs are hypothetical chips: no published-figure check
    assert cfg.check_published() != []
    assert load_config("teaching", {"vpu.alu.latency_cycles": 5}).vpu.alu.latency_cycles == 5
    assert parse_override("ici.max_shape=[4,4]") == (("ici", "max_shape"), "[4,4]")
    grid = load_config("teaching", ["ici.dims=2", "ici.max_shape=[4,4]", "ici.links_per_chip=4"])
    assert grid.ici.max_shape == (4, 4)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("mxu.rows=abc", r"override 'mxu\.rows=abc': mxu\.rows: expected an integer, not 'abc'"),
        ("mxu.rowz=3", r"override 'mxu\.rowz=3': mxu\.rowz: unknown key"),
        ("mxu.rows=0", r"override 'mxu\.rows=0': mxu\.rows: must be positive"),
        ("mxu=3", r"override 'mxu=3': mxu: expected a mapping"),
        ("mxu.rows", r"override 'mxu\.rows' must look like section\.key=value"),
        ("mxu.rows=[1", r"override 'mxu\.rows=\[1': the value is not valid YAML"),
    ],
)
def test_bad_overrides_name_the_override(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("teaching", [override])


def test_python_overrides_are_validated():
    cfg = load_config("teaching")
    assert with_overrides(cfg, {"mxu.cols": 16}).mxu.cols == 16
    with pytest.raises(ConfigError, match=r"mxu\.cols: expected an integer, not 'x'"):
        with_overrides(cfg, {"mxu.cols": "x"})
    with pytest.raises(ConfigError, match=r"mxu\.cols: must be positive"):
        with_overrides(cfg, {"mxu.cols": 0})
    with pytest.raises(ConfigError, match="unknown config key 'colz'"):
        with_overrides(cfg, {"mxu.colz": 1})


def test_command_line_options():
    import argparse

    from tpusim.config import add_config_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = parser.parse_args(["--config", "teaching", "--set", "mxu.rows=16", "--set", "mxu.cols=32"])
    cfg = config_from_args(args)
    assert (cfg.mxu.rows, cfg.mxu.cols, cfg.overrides) == (16, 32, ("mxu.rows=16", "mxu.cols=32"))
    assert config_from_args(parser.parse_args([])).name == "tpu_v5e"


def test_configs_are_frozen_values():
    cfg = load_config("tpu_v5e")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.mxu.rows = 3  # type: ignore[misc]
    assert load_config("tpu_v5e") == cfg
    with pytest.raises(ConfigValueError, match="count: must be positive"):
        dataclasses.replace(cfg.core, count=0)


def test_docstring_examples_run():
    import doctest

    import tpusim.config
    import tpusim.devices.system
    import tpusim.isa.program

    for module in (tpusim.config, tpusim.isa.program, tpusim.devices.system):
        failed, tried = doctest.testmod(module)
        assert tried > 0 and failed == 0, module.__name__


def test_integers_with_leading_zeros_are_decimal_as_in_yaml_1_2(tmp_path):
    """PyYAML follows YAML 1.1 and read ``010`` as octal 8: ``--set mxu.rows=010`` simulated 8 rows."""
    assert load_config("teaching", ["mxu.rows=016", "dma.engines=0o10"]).mxu.rows == 16
    assert load_config("teaching", ["dma.engines=0o10"]).dma.engines == 8
    base = (Path(__file__).parent.parent / "configs" / "teaching.yaml").read_text()
    edited = base.replace("\n  rows: ", "\n  rows: 0", 1)
    assert edited != base
    assert load_config(_write(tmp_path, edited)).mxu.rows == load_config("teaching").mxu.rows


@pytest.mark.parametrize("text", ["1:20", "0b1000", "1_000", "1_0.5e9"])
def test_yaml_1_1_number_forms_are_text_as_in_yaml_1_2(text: str) -> None:
    """YAML 1.1 also read ``1:20`` (base 60) as 80, ``0b1000`` as 8 and ``1_000`` as 1000 (a campaign of bad
    inputs): text in YAML 1.2, so a key that wants a number says so. Hexadecimal stays a number."""
    with pytest.raises(ConfigError, match=rf"mxu\.rows: expected an integer, not '{text}'"):
        load_config("teaching", [f"mxu.rows={text}"])
    assert load_config("teaching", ["mxu.rows=0x10"]).mxu.rows == 16


def test_yes_no_on_off_are_text_as_in_yaml_1_2():
    """PyYAML follows YAML 1.1, which read ``off`` as false: a typo-like value passed silently."""
    with pytest.raises(ConfigError, match=r"mxu\.double_buffered: expected true or false, not 'off'"):
        load_config("teaching", ["mxu.double_buffered=off"])
    assert load_config("teaching", ["mxu.double_buffered=false"]).mxu.double_buffered is False
