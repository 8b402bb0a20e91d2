"""Bad inputs, outputs and arguments of the command line (issue 13): each is one line naming the file, member,
flag or path, exit status 1, no traceback, and nothing is read, drawn or simulated before it is known to fit."""

from __future__ import annotations

import io
import json
import os
import struct
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tpusim.cli import main
from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import io as refio
from tpusim.compiler.hlo.reference.io import InputFileError, load_inputs, random_inputs

PROGRAM = """HloModule add
ENTRY e {
  x = f32[8,128] parameter(0)
  y = f32[8,128] parameter(1)
  ROOT z = f32[8,128] add(x, y)
}
"""

BIG = """HloModule big
ENTRY e {
  x = f32[100000,100000] parameter(0)
  ROOT z = f32[100000,100000] add(x, x)
}
"""


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "add.hlo"
    path.write_text(PROGRAM)
    return path


def _good_arrays() -> dict[str, np.ndarray]:
    return {"arg0": np.ones((8, 128), np.float32), "arg1": np.full((8, 128), 2.0, np.float32)}


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _zip(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _one_error(main_args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(main_args) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _no_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any simulation, input drawing or input reading fail the test (it must not start)."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the run started although its arguments were bad")

    import tpusim.api

    monkeypatch.setattr(tpusim.api, "simulate", refuse)
    monkeypatch.setattr(refio, "random_inputs", refuse)
    monkeypatch.setattr(refio, "load_inputs", refuse)


# ------------------------------------------------------------------------------------------------ --inputs
def test_good_inputs_still_run(tmp_path: Path, program: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(tmp_path / "in.npz", **_good_arrays())  # type: ignore[arg-type]
    out = tmp_path / "out.npz"
    assert main(["run", str(program), "--inputs", str(tmp_path / "in.npz"), "--out", str(out)]) == 0
    with np.load(out) as data:
        np.testing.assert_array_equal(data["out0"], np.full((8, 128), 3.0, np.float32))


def test_compressed_inputs_are_read(tmp_path: Path, program: Path) -> None:
    np.savez_compressed(tmp_path / "in.npz", **_good_arrays())  # type: ignore[arg-type]
    (inputs,) = load_inputs(tmp_path / "in.npz", parse_module(PROGRAM))
    np.testing.assert_array_equal(inputs[1], _good_arrays()["arg1"])


def test_fortran_order_inputs_are_read(tmp_path: Path) -> None:
    arrays = _good_arrays()
    arrays["arg0"] = np.asfortranarray(np.arange(8 * 128, dtype=np.float32).reshape(8, 128))
    np.savez(tmp_path / "in.npz", **arrays)  # type: ignore[arg-type]
    (inputs,) = load_inputs(tmp_path / "in.npz", parse_module(PROGRAM))
    np.testing.assert_array_equal(inputs[0], arrays["arg0"])


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: p.write_bytes(b""), r"in\.npz: the file is empty; give an \.npz"),
        (lambda p: p.write_bytes(_npy_bytes(np.zeros(3))), r"in\.npz: a single \.npy array, not an \.npz"),
        (lambda p: p.write_bytes(b"PK\x03\x04 not really a zip"), r"in\.npz: not an \.npz file \(a zip archive\)"),
        (lambda p: p.write_bytes(b"hello world, just text"), r"in\.npz: not an \.npz file \(a zip archive\)"),
    ],
    ids=["empty", "npy", "corrupt-zip", "text"],
)
def test_unreadable_inputs_files(  # type: ignore[no-untyped-def]
    make, expected: str, tmp_path: Path, program: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "in.npz"
    make(path)
    line = _one_error(["run", str(program), "--inputs", str(path)], capsys)
    assert line.startswith("tpusim run: ")
    import re

    assert re.search(expected, line), line


def test_truncated_zip(tmp_path: Path, program: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(tmp_path / "good.npz", **_good_arrays())  # type: ignore[arg-type]
    data = (tmp_path / "good.npz").read_bytes()
    for cut in (len(data) // 2, len(data) - 10, 40):
        path = tmp_path / f"cut{cut}.npz"
        path.write_bytes(data[:cut])
        line = _one_error(["run", str(program), "--inputs", str(path)], capsys)
        assert f"{path}: " in line and ("not an .npz file" in line or "truncated" in line), line


def test_truncated_member_data(tmp_path: Path) -> None:
    """A member whose data is shorter than its header declares (the zip itself is intact)."""
    arrays = _good_arrays()
    members = {"arg0.npy": _npy_bytes(arrays["arg0"])[:-100], "arg1.npy": _npy_bytes(arrays["arg1"])}
    path = _zip(tmp_path / "in.npz", members)
    with pytest.raises(InputFileError, match=r"in\.npz: arg0: the member holds 4124 bytes but its header "
                                             r"declares float32 \(8, 128\): 4224 bytes"):  # fmt: skip
        load_inputs(path, parse_module(PROGRAM))


def test_huge_declared_shape_is_refused_from_the_header(tmp_path: Path) -> None:
    """A header declaring a 10^15-element array is refused before anything is allocated or read."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10**9, 10**6)})
    members = {"arg0.npy": header.getvalue() + b"\0" * 64, "arg1.npy": _npy_bytes(_good_arrays()["arg1"])}
    path = _zip(tmp_path / "in.npz", members)
    tracemalloc.start()
    try:
        with pytest.raises(InputFileError, match=r"in\.npz: arg0 has shape \[1000000000, 1000000\], expected "
                                                 r"\[8, 128\] for f32\[8,128\]"):  # fmt: skip
            load_inputs(path, parse_module(PROGRAM))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 << 20


def test_wrong_dtype_is_refused_from_the_header(tmp_path: Path) -> None:
    arrays = _good_arrays()
    arrays["arg1"] = arrays["arg1"].astype(np.float64)
    np.savez(tmp_path / "in.npz", **arrays)  # type: ignore[arg-type]
    with pytest.raises(InputFileError, match=r"in\.npz: arg1: dtype float64 cannot be the f32 input; give float32"):
        load_inputs(tmp_path / "in.npz", parse_module(PROGRAM))


def test_object_arrays_are_refused_without_unpickling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    arrays: dict[str, np.ndarray] = dict(_good_arrays())
    obj = np.empty((8, 128), object)
    obj[:] = 1.0
    arrays["arg0"] = obj
    np.savez(tmp_path / "in.npz", **arrays)  # type: ignore[arg-type]
    with pytest.raises(InputFileError, match=r"in\.npz: arg0: an object array \(pickled Python objects\); tpusim "
                                             r"reads only plain numeric arrays"):  # fmt: skip
        load_inputs(tmp_path / "in.npz", parse_module(PROGRAM))


def test_corrupt_npy_header(tmp_path: Path) -> None:
    members = {"arg0.npy": b"\x93NUMPY\x01\x00\x10\x00{'descr': 'xx", "arg1.npy": _npy_bytes(_good_arrays()["arg1"])}
    with pytest.raises(InputFileError, match=r"in\.npz: arg0: not a \.npy array"):
        load_inputs(_zip(tmp_path / "in.npz", members), parse_module(PROGRAM))
    members["arg0.npy"] = b"this is no npy"
    with pytest.raises(InputFileError, match=r"in2\.npz: arg0: not a \.npy array: the magic string is not correct"):
        load_inputs(_zip(tmp_path / "in2.npz", members), parse_module(PROGRAM))


def _patch_sizes(path: Path, name: bytes, size: int) -> None:
    """Rewrite the uncompressed size a zip's local and central headers declare for member ``name``."""
    data = bytearray(path.read_bytes())
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = 0
        while (at := data.find(signature, at)) >= 0:
            start = at + (30 if signature == b"PK\x03\x04" else 46)
            if data[start : start + len(name)] == name:
                data[at + offset : at + offset + 4] = struct.pack("<I", size)
            at += 4
    path.write_bytes(bytes(data))


def test_zip_bomb_declaring_gigabytes_is_refused_before_inflating(tmp_path: Path) -> None:
    """A member whose zip directory declares 4 GB for an f32[8,128] parameter: refused from the directory."""
    arrays = _good_arrays()
    members = {"arg0.npy": _npy_bytes(arrays["arg0"]), "arg1.npy": _npy_bytes(arrays["arg1"])}
    path = _zip(tmp_path / "in.npz", members, zipfile.ZIP_DEFLATED)
    _patch_sizes(path, b"arg0.npy", 0xFFFFFFF0)
    with pytest.raises(InputFileError, match=r"in\.npz: arg0: the member holds 4294967280 bytes but its header "
                                             r"declares float32 \(8, 128\): 4224 bytes"):  # fmt: skip
        load_inputs(path, parse_module(PROGRAM))


def test_zip_bomb_inflating_past_its_declared_size_stops(tmp_path: Path) -> None:
    """A deflated member that declares the right size but inflates to 64 MiB: only the declared bytes are
    inflated, and the checksum of the member refuses it."""
    arrays = _good_arrays()
    bomb = _npy_bytes(arrays["arg0"]) + b"\0" * (64 << 20)
    members = {"arg0.npy": bomb, "arg1.npy": _npy_bytes(arrays["arg1"])}
    path = _zip(tmp_path / "in.npz", members, zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 1 << 20
    _patch_sizes(path, b"arg0.npy", len(_npy_bytes(arrays["arg0"])))
    tracemalloc.start()
    try:
        with pytest.raises(InputFileError, match=r"in\.npz: arg0: corrupt member"):
            load_inputs(path, parse_module(PROGRAM))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def test_unused_members_are_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A member the program does not take is refused by name from the zip directory, never inflated."""
    arrays = _good_arrays()
    members = {"arg0.npy": _npy_bytes(arrays["arg0"]), "arg1.npy": _npy_bytes(arrays["arg1"]), "junk.npy": b"x" * 1000}
    path = _zip(tmp_path / "in.npz", members)
    opened: list[str] = []
    real_open = zipfile.ZipFile.open

    def spy(self, name, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(name if isinstance(name, str) else name.filename)
        return real_open(self, name, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", spy)
    with pytest.raises(InputFileError, match=r"in\.npz: unexpected junk \(the program takes arg0: f32\[8,128\], "
                                             r"arg1: f32\[8,128\]\)"):  # fmt: skip
        load_inputs(path, parse_module(PROGRAM))
    assert opened == []


def test_missing_and_directory_inputs(tmp_path: Path, program: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_error(["run", str(program), "--inputs", str(tmp_path / "nothing.npz")], capsys)
    assert "nothing.npz: cannot read an npz file" in line
    line = _one_error(["run", str(program), "--inputs", str(tmp_path)], capsys)
    assert f"{tmp_path}: cannot read an npz file" in line


# ------------------------------------------------------------------------------------------------ HBM first
def test_a_program_that_does_not_fit_fails_before_drawing_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "big.hlo"
    path.write_text(BIG)
    _no_simulation(monkeypatch)
    line = _one_error(["run", str(path)], capsys)
    assert line.startswith("tpusim run: HBM is full: parameter buffer e/x (f32[100000,100000]"), line
    line = _one_error(["run", str(path), "--inputs", str(tmp_path / "never_read.npz")], capsys)
    assert line.startswith("tpusim run: HBM is full"), line
    line = _one_error(["run", str(path), "--chips", "2"], capsys)
    assert line.startswith("tpusim run: HBM is full"), line


def test_random_inputs_are_drawn_in_bounded_memory() -> None:
    """Random inputs cost their own size plus a small buffer, not a float64 copy of every array."""
    module = parse_module(
        "HloModule m\nENTRY e {\n  x = bf16[2048,1024] parameter(0)\n  ROOT n = bf16[2048,1024] negate(x)\n}"
    )
    tracemalloc.start()
    try:
        (inputs,) = random_inputs(module, 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    size = 2048 * 1024 * 2
    assert inputs[0].nbytes == size
    assert peak < size + (3 << 20), peak  # a float64 draw alone would be 16 MiB


def test_random_inputs_keep_their_seeded_values() -> None:
    """Drawn in chunks, the values are those of one draw of the whole array (the documented stream)."""
    shapes = ["f32[300,700]", "bf16[5,100001]", "s8[70000]", "u4[70001]", "pred[66000]", "c64[40000]", "f8e4m3fn[9]"]
    params = "\n".join(f"  p{i} = {s} parameter({i})" for i, s in enumerate(shapes))
    module = parse_module(f"HloModule m\nENTRY e {{\n{params}\n  ROOT t = () tuple()\n}}\n")
    (inputs,) = random_inputs(module, 7)
    for i, (value, param) in enumerate(zip(inputs, module.entry_computation.parameters)):
        rng = np.random.default_rng([7, 0, i, 0])
        et = param.shape.element_type
        dims = param.shape.dimensions
        if et.kind == "pred":
            want = rng.integers(0, 2, dims).astype(bool)
        elif et.kind == "signed":
            want = rng.integers(-8, 8, dims, endpoint=True).astype(et.dtype)
        elif et.kind == "unsigned":
            want = rng.integers(0, 16, dims, endpoint=True).astype(et.dtype)
        elif et.kind == "complex":
            want = (rng.standard_normal(dims) + 1j * rng.standard_normal(dims)).astype(et.dtype)
        else:
            v = rng.standard_normal(dims)
            if et.bits <= 8:
                import ml_dtypes

                v = np.clip(v, -float(ml_dtypes.finfo(et.dtype).max), float(ml_dtypes.finfo(et.dtype).max))
            want = v.astype(np.float32).astype(et.dtype)
        assert value.dtype == want.dtype and value.shape == want.shape
        np.testing.assert_array_equal(value.view(np.uint8), want.view(np.uint8), err_msg=shapes[i])


# ------------------------------------------------------------------------------------------------ --out, --report
def test_out_writes_exactly_the_path_printed(tmp_path: Path, program: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results"
    assert main(["run", str(program), "--out", str(out)]) == 0
    assert f"wrote {out}\n" in capsys.readouterr().err
    assert out.is_file() and not (tmp_path / "results.npz").exists()
    with np.load(out) as data:
        assert data["out0"].shape == (8, 128)


def test_reference_out_writes_exactly_the_path_printed(
    tmp_path: Path, program: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ref_results"
    assert main(["run", str(program), "--reference", "--out", str(out)]) == 0
    assert f"-> {out}\n" in capsys.readouterr().err
    assert out.is_file() and not (tmp_path / "ref_results.npz").exists()


@pytest.mark.parametrize("flag", ["--out", "--report"])
def test_output_paths_are_checked_before_the_run(
    flag: str, tmp_path: Path, program: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _no_simulation(monkeypatch)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    under = a_file / "sub" / "x.npz"
    line = _one_error(["run", str(program), flag, str(under)], capsys)
    assert line == f"tpusim run: {flag} {under}: cannot be written: {a_file} is a file, not a folder"
    if flag == "--report":
        line = _one_error(["run", str(program), flag, str(a_file)], capsys)
        assert line == f"tpusim run: {flag} {a_file}: is a file, not a folder"
    else:
        line = _one_error(["run", str(program), flag, str(tmp_path)], capsys)
        assert line == f"tpusim run: {flag} {tmp_path}: is a folder, not a file"
    if flag == "--out":  # the reference interpreter's outputs too
        line = _one_error(["run", str(program), "--reference", "--out", str(under)], capsys)
        assert line == f"tpusim run: --out {under}: cannot be written: {a_file} is a file, not a folder"


def test_output_folders_without_permission(
    tmp_path: Path, program: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(As root every folder is writable, so the permission check is exercised through os.access.)"""
    import tpusim.paths

    _no_simulation(monkeypatch)
    monkeypatch.setattr(tpusim.paths.os, "access", lambda *_args: False)
    line = _one_error(["run", str(program), "--out", str(tmp_path / "x.npz")], capsys)
    assert (
        line == f"tpusim run: --out {tmp_path / 'x.npz'}: cannot be written: {tmp_path} is not writable "
        "(permission denied)"
    )
    line = _one_error(["run", str(program), "--report", str(tmp_path)], capsys)
    assert line == f"tpusim run: --report {tmp_path}: cannot be written: permission denied"


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root may write anywhere")
@pytest.mark.parametrize("flag", ["--out", "--report"])
def test_unwritable_output_paths(
    flag: str, tmp_path: Path, program: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _no_simulation(monkeypatch)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        line = _one_error(["run", str(program), flag, str(locked / "x")], capsys)
        assert line.startswith(f"tpusim run: {flag} {locked / 'x'}: cannot be written"), line
    finally:
        locked.chmod(0o700)


def test_a_failing_report_keeps_the_outputs(
    tmp_path: Path, program: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tpusim.report.command
    from tpusim.errors import TpusimError

    def broken(*_args: object, **_kwargs: object) -> None:
        raise TpusimError("the report broke")

    monkeypatch.setattr(tpusim.report.command, "write_run_report", broken)
    out = tmp_path / "out.npz"
    assert main(["run", str(program), "--out", str(out), "--report", str(tmp_path / "rep")]) == 1
    assert "the report broke" in capsys.readouterr().err
    with np.load(out) as data:
        assert data["out0"].shape == (8, 128)


# ------------------------------------------------------------------------------------------------ --trace-view
@pytest.mark.parametrize(
    "window", ["nan:inf", "0:inf", "nan:", ":inf", "-inf:5", "9000:3000", "5:5", "a:b", "3000", "1e999:", "-5:10"]
)
def test_bad_trace_view_windows(window: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_error(["report", str(tmp_path), f"--trace-view={window}"], capsys)
    assert line.startswith(f"tpusim report: --trace-view {window}: "), line


# ------------------------------------------------------------------------------------------------ layout
def test_layout_json_of_a_huge_array_is_cut_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    tracemalloc.start()
    try:
        assert main(["layout", "f32[100000,100000]", "--json"]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["byte_size"] == 40_000_000_000 and data["element_slots"] == 10**10
    assert data["linear_positions"] is None
    assert data["linear_positions_truncated"] is True
    assert "linear_positions left out" in captured.err
    assert peak < 64 << 20


def test_layout_json_of_a_small_array_is_whole(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["layout", "bf16[4,8]{1,0:T(2,4)(2,1)}", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["linear_positions_truncated"] is False and len(data["linear_positions"]) == 4


def test_layout_drawing_of_a_huge_array_is_cut(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "big.png"
    assert main(["layout", "f32[100000,100000]", "--out", str(out)]) == 0
    assert out.is_file()


@pytest.mark.parametrize("args", [["--max-rows", "100000000", "--max-cols", "100000000"], ["--max-rows", "0"],
                                  ["--max-cols", "-3"]])  # fmt: skip
def test_layout_drawing_budget_is_bounded(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_error(["layout", "f32[100000,100000]", "--out", str(tmp_path / "x.png"), *args], capsys)
    assert line.startswith("tpusim layout: --max-rows"), line


def test_layout_out_under_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("")
    line = _one_error(["layout", "f32[8,128]", "--out", str(a_file / "x.png")], capsys)
    assert line == f"tpusim layout: --out {a_file / 'x.png'}: cannot be written: {a_file} is a file, not a folder"


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_layout_replaces_only_a_diagram(suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--out`` replaced any file (a user's notes named notes.png), where ``run --out`` refuses a file that is
    not its own output (a campaign of bad inputs); an earlier diagram is still replaced."""
    mine = tmp_path / f"notes{suffix}"
    mine.write_text("<svg>my own drawing</svg>" if suffix == ".svg" else "my notes")
    line = _one_error(["layout", "f32[8,128]", "--out", str(mine)], capsys)
    assert line.endswith(
        "the file exists and is not a diagram tpusim drew; it would be overwritten: choose another file"
    )
    assert mine.read_text().startswith(("<svg>", "my notes"))
    drawn = tmp_path / f"d{suffix}"
    for _ in range(2):
        assert main(["layout", "f32[8,128]", "--out", str(drawn)]) == 0
    capsys.readouterr()


# ---------------------------------------------------------------- found by a helper's sweep of the CLI
def test_out_never_overwrites_the_program_or_the_inputs(
    tmp_path: Path, program: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = program.read_text()
    line = _one_error(["run", str(program), "--out", str(program)], capsys)
    assert "--out" in line and "the program" in line and program.read_text() == before
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **_good_arrays())
    line = _one_error(["run", str(program), "--inputs", str(inputs), "--out", str(inputs)], capsys)
    assert "--inputs" in line and sorted(np.load(inputs)) == ["arg0", "arg1"]


@pytest.mark.parametrize("flag", [["--out", "o.npz"], ["--check"]])
def test_timing_only_refuses_flags_it_would_ignore(
    flag: list[str], tmp_path: Path, program: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _one_error(["run", str(program), "--timing-only", *flag], capsys)
    assert flag[0] in line and "--timing-only" in line


@pytest.mark.parametrize("flag", [["--seed", "-1"], ["--chips", "0"], ["--chips", "-1"], ["--replicas", "0"]])
def test_counts_and_seeds_out_of_range_are_usage_errors(
    flag: list[str], program: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", str(program), *flag])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag[0] in err and "Traceback" not in err


@pytest.mark.parametrize("where", ["program", "--config", "--inputs"])
def test_a_device_file_is_refused_not_read(where: str, program: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """/dev/zero never ends: reading it whole grew to 14 GB."""
    args = ["run", "/dev/zero"] if where == "program" else ["run", str(program), where, "/dev/zero"]
    line = _one_error(args, capsys)
    assert "/dev/zero" in line and "regular file" in line


def test_a_default_report_folder_is_never_replaced(
    tmp_path: Path, program: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(program), "--timing-only", "--report"]) == 0
    assert main(["run", str(program), "--timing-only", "--report", "--set", "mxu.rows=64"]) == 0
    folders = sorted(p.name for p in (tmp_path / "reports").iterdir())
    assert folders == ["add-tpu_v5e", "add-tpu_v5e-2"], folders
    capsys.readouterr()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes")
    line = _one_error(["run", str(program), "--timing-only", "--report", str(mine)], capsys)
    assert "not a tpusim report" in line and (mine / "report.md").read_text() == "my notes"


def test_a_failing_fallback_kernel_names_the_instruction_not_a_line_of_its_kernel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The kernel is a module of its own: its line numbers are not the program's (the error said line 5 for
    an instruction on line 4)."""
    path = tmp_path / "infeed.hlo"
    path.write_text(
        "HloModule m\nENTRY e {\n  t = token[] after-all()\n  i = (f32[8], token[]) infeed(t)\n"
        "  ROOT g = f32[8] get-tuple-element(i), index=0\n}\n"
    )
    line = _one_error(["run", str(path)], capsys)
    assert "(from HLO i)" in line and "infeed queue" in line and "line" not in line


@pytest.mark.parametrize(
    ("args", "flag"),
    [(["report", ".", "--dpi", "1"], "--dpi"), (["sweep", "s.yaml", "-j", "0"], "--workers/-j")],
)
def test_resolutions_and_worker_counts_out_of_range_are_usage_errors(
    args: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dpi 1 ended in a FreeType traceback and --dpi 100000 in a MemoryError; -j 0 was accepted."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2 and flag in capsys.readouterr().err


def test_a_layout_without_elements_is_not_drawn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_error(["layout", "f32[0,5]", "--out", str(tmp_path / "x.png")], capsys)
    assert "no elements" in line and not (tmp_path / "x.png").exists()


def test_a_report_folder_whose_file_is_a_folder_is_refused_before_the_run(
    tmp_path: Path, program: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was found only when writing, after the whole run, leaving a half-written folder."""
    folder = tmp_path / "rep"
    assert main(["run", str(program), "--timing-only", "--report", str(folder)]) == 0
    (folder / "trace.json").unlink()
    (folder / "trace.json").mkdir()
    capsys.readouterr()
    line = _one_error(["run", str(program), "--timing-only", "--report", str(folder)], capsys)
    assert "trace.json is not a file" in line
    assert not list(folder.glob("*.tmp"))


def test_tiling_rules_are_refused_with_xlas_compiler(program: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """They were silently ignored (XLA's module carries its own layouts)."""
    line = _one_error(["run", str(program), "--compiler", "xla", "--tiling", "bf16_16x128"], capsys)
    assert "--tiling bf16_16x128" in line and "XLA" in line


def test_a_compiled_module_is_not_compiled_again_by_xla(capsys: pytest.CaptureFixture[str]) -> None:
    """XLA's front end refused it with only "UNIMPLEMENTED: Tiled layout is not supported yet" (and without
    libtpu the message asked to install it)."""
    compiled = Path(__file__).parent / "data" / "corpus" / "softmax_f32" / "v5e.hlo.gz"
    line = _one_error(["run", str(compiled), "--compiler", "xla", "--timing-only"], capsys)
    assert "already has tiled layouts" in line and "run it as it is" in line


def test_flags_of_the_other_mode_are_refused_not_ignored(
    program: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a bad-input campaign: --replicas without --reference and --chips with it were ignored (the
    oracle's outputs then had no leading chip axis), and --reference never read --config or --set."""
    out = str(tmp_path / "o.npz")
    line = _one_error(["run", str(program), "--replicas", "4", "--timing-only"], capsys)
    assert "--replicas is the devices --reference runs" in line
    line = _one_error(["run", str(program), "--reference", "--chips", "2", "--out", out], capsys)
    assert "cannot be combined with --chips" in line
    line = _one_error(["run", str(program), "--reference", "--config", "no_such.yaml", "--out", out], capsys)
    assert "cannot read config 'no_such.yaml'" in line
    line = _one_error(["run", str(program), "--reference", "--set", "mxu.rowz=1", "--out", out], capsys)
    assert "mxu.rowz" in line
    assert not (tmp_path / "o.npz").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chips": "2"}, "chips must be a whole number"),
        ({"chips": True}, "chips must be a whole number"),
        ({"options": {"tiling": "bf16_16x128"}}, "options must be a CompileOptions"),
        ({"timing_only": "no"}, "timing_only must be True or False"),
        ({"config": 5}, "config must be a preset name"),
    ],
)
def test_api_arguments_of_the_wrong_type_are_one_clear_error(program: Path, kwargs: dict, message: str) -> None:
    """Found by a bad-input campaign: chips="2" failed as a TypeError in the topology, options={...} as an
    AttributeError, and timing_only="no" ran timing-only (a truthy string)."""
    import tpusim

    with pytest.raises(tpusim.InputError, match=message):
        tpusim.simulate(program, **kwargs)


def test_numpy_scalars_are_numbers_in_config_overrides() -> None:
    import numpy as np

    from tpusim.config import load_config

    cfg = load_config("teaching", {"mxu.rows": np.int64(16), "hbm.latency_ns": np.float64(300.0)})
    assert cfg.mxu.rows == 16 and cfg.hbm.latency_ns == 300.0


def test_out_does_not_overwrite_a_file_that_is_not_earlier_outputs(
    program: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a bad-input campaign: --out notes.txt replaced the user's text file with an .npz archive."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    line = _one_error(["run", str(program), "--out", str(notes)], capsys)
    assert "exists and is not an .npz of outputs" in line
    assert notes.read_text() == "my notes\n"
    out = tmp_path / "o.npz"
    assert main(["run", str(program), "--out", str(out)]) == 0
    assert main(["run", str(program), "--out", str(out)]) == 0  # (an earlier run's outputs are replaced)


@pytest.mark.parametrize("text", ["(f32[4], f32[4])", "()"])
def test_layout_of_a_tuple_is_one_line(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It was an AttributeError traceback (found by a bad-input campaign)."""
    line = _one_error(["layout", text], capsys)
    assert "needs an array shape, not the tuple" in line
