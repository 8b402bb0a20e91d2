"""npz conventions of reference runs: keys, narrow types stored exactly, strict dtype checks, the device
axis, seeded random inputs, and ``tpusim run --reference`` end to end."""

from __future__ import annotations

import argparse
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tpusim.compiler.hlo import parse_module
from tpusim.compiler.hlo.reference import TOKEN, evaluate
from tpusim.compiler.hlo.reference.io import (
    InputFileError,
    configure_run_reference,
    load_inputs,
    random_inputs,
    run_reference_command,
    save_outputs,
)
from tpusim.errors import TpusimError

PROGRAM = """
HloModule io_program
ENTRY main {
  x = f32[2,3] parameter(0)
  h = bf16[4] parameter(1)
  pair = (s8[2], pred[2]) parameter(2)
  t = token[] parameter(3)
  f = f8e4m3fn[3] parameter(4)
  hx = f32[4] convert(h)
  s = s8[2] get-tuple-element(pair), index=0
  ROOT r = (f32[2,3], f32[4], s8[2], f8e4m3fn[3]) tuple(x, hx, s, f)
}
"""


@pytest.fixture(scope="module")
def module():  # type: ignore[no-untyped-def]
    return parse_module(PROGRAM)


def _write(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def _good(**changes: np.ndarray) -> dict[str, np.ndarray]:
    arrays = {
        "arg0": np.arange(6, dtype=np.float32).reshape(2, 3),
        "arg1": np.array([1.0, 1.00390625, 1.01171875, -2.0], np.float32),  # stored as float32, rounded to bf16
        "arg2.0": np.array([-3, 4], np.int8),
        "arg2.1": np.array([True, False]),
        "arg4": np.array([0x38, 0x7E, 0x01], np.uint8),  # f8 raw bits: 1.0, 448, the smallest denormal
    }
    arrays.update(changes)
    return arrays


def test_load_inputs_keys_and_narrow_types(tmp_path: Path, module) -> None:  # type: ignore[no-untyped-def]
    (inputs,) = load_inputs(_write(tmp_path / "in.npz", **_good()), module)
    x, h, (s, p), tok, f = inputs
    assert h.dtype == ml_dtypes.bfloat16 and list(h.astype(np.float32)) == [1.0, 1.0, 1.015625, -2.0]  # ties to even
    assert f.dtype == ml_dtypes.float8_e4m3fn and list(f.astype(np.float32)) == [1.0, 448.0, 2.0**-9]
    assert s.dtype == np.int8 and p.dtype == np.bool_ and tok is TOKEN  # a token parameter takes no key
    out = evaluate(module, inputs)
    np.testing.assert_array_equal(out[0], x)
    raw = _good(arg1=np.array([0x3F80, 0x3F81, 0x3F82, 0xC000], np.uint16))  # bf16 as raw bit patterns
    (inputs,) = load_inputs(_write(tmp_path / "raw.npz", **raw), module)
    assert list(inputs[1].astype(np.float32)) == [1.0, 1.0078125, 1.015625, -2.0]


def test_load_inputs_errors_name_file_key_and_expectation(tmp_path: Path, module) -> None:  # type: ignore[no-untyped-def]
    path = _write(tmp_path / "bad.npz", **_good(arg0=np.zeros((2, 3), np.float64)))
    with pytest.raises(InputFileError, match=r"bad\.npz: arg0: dtype float64 cannot be the f32 input; give float32 "
                       r"\(tpusim never converts silently\)$"):  # fmt: skip
        load_inputs(path, module)
    arrays = _good()
    del arrays["arg2.1"]
    path = _write(tmp_path / "missing.npz", **arrays, extra=np.zeros(1))
    with pytest.raises(InputFileError, match=r"missing\.npz: missing arg2\.1; unexpected extra \(the program takes "
                       r"arg0: f32\[2,3\], arg1: bf16\[4\], arg2\.0: s8\[2\], arg2\.1: pred\[2\], "
                       r"arg4: f8e4m3fn\[3\]\)$"):  # fmt: skip
        load_inputs(path, module)
    path = _write(tmp_path / "shape.npz", **_good(arg0=np.zeros((3, 2), np.float32)))
    with pytest.raises(InputFileError, match=r"shape\.npz: arg0 has shape \[3, 2\], expected \[2, 3\] for f32\[2,3\]"):
        load_inputs(path, module)
    with pytest.raises(InputFileError, match=r"arg0 has shape \[2, 3\], expected \[4, 2, 3\] \(a leading axis of 4 "
                       r"devices, then \[2, 3\]\)"):  # fmt: skip
        load_inputs(_write(tmp_path / "in.npz", **_good()), module, num_devices=4)
    with pytest.raises(InputFileError, match=r"nothing\.npz: cannot read an npz file"):
        load_inputs(tmp_path / "nothing.npz", module)


def test_values_that_do_not_fit_a_narrow_type_are_refused(tmp_path: Path, module) -> None:  # type: ignore[no-untyped-def]
    """Found by a campaign of bad inputs: 1000.0 for an f8e4m3fn input (largest finite 448, no inf) became
    NaN and 1e300 for bf16 became inf, silently, where an integer out of range is refused (whose message
    said [0, 9] for an array of nines). Values that round to the nearest representable one stay accepted."""
    path = _write(tmp_path / "f8.npz", **_good(arg4=np.array([1.0, 1000.0, 2.0], np.float32)))
    with pytest.raises(InputFileError, match=r"f8\.npz: arg4: 1000 at index \[1\] does not fit f8e4m3fn \(largest "
                       r"finite value 448\); it would become nan$"):  # fmt: skip
        load_inputs(path, module)
    path = _write(tmp_path / "bf.npz", **_good(arg1=np.array([1.0, 2.0, 1e300, 3.0])))
    with pytest.raises(InputFileError, match=r"arg1: 1e\+300 at index \[2\] does not fit bf16 .* become inf$"):
        load_inputs(path, module)
    (inputs,) = load_inputs(
        _write(tmp_path / "ok.npz", **_good(arg4=np.array([1.0, 440.0, np.inf], np.float32))), module
    )
    assert list(inputs[4].astype(np.float32)[:2]) == [1.0, 448.0] and np.isnan(inputs[4].astype(np.float32)[2])
    narrow = parse_module("HloModule m\nENTRY e {\n  ROOT a = s4[3] parameter(0)\n}\n")
    with pytest.raises(InputFileError, match=r"arg0: values \[9, 9\] do not fit s4 \[-8, 7\]"):
        load_inputs(_write(tmp_path / "s4.npz", arg0=np.full(3, 9, np.int8)), narrow)


def test_random_inputs_are_seeded_and_typed(module) -> None:  # type: ignore[no-untyped-def]
    a = random_inputs(module, seed=0, num_devices=2)
    b = random_inputs(module, seed=0, num_devices=2)
    c = random_inputs(module, seed=1, num_devices=2)
    assert len(a) == 2 and a[0][0].dtype == np.float32 and a[0][1].dtype == ml_dtypes.bfloat16
    assert a[0][2][0].dtype == np.int8 and a[0][4].dtype == ml_dtypes.float8_e4m3fn
    np.testing.assert_array_equal(a[1][0], b[1][0])
    assert not np.array_equal(a[0][0], a[1][0]) and not np.array_equal(a[0][0], c[0][0])
    assert np.all(np.isfinite(a[0][4].astype(np.float32)))


def test_save_outputs_stores_narrow_types_exactly(tmp_path: Path) -> None:
    h = np.array([1.0078125, -3.5], ml_dtypes.bfloat16)
    s4 = np.array([-8, 7], ml_dtypes.int4)
    save_outputs(tmp_path / "o.npz", [h, s4, np.arange(3, dtype=np.uint16)])
    with np.load(tmp_path / "o.npz") as data:
        assert data["out0"].dtype == np.float32 and list(data["out0"]) == [1.0078125, -3.5]
        assert data["out1"].dtype == np.int8 and list(data["out1"]) == [-8, 7]
        assert data["out2"].dtype == np.uint16


def _args(**kw: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure_run_reference(parser)
    ns = parser.parse_args([str(kw.pop("program"))])
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


def test_run_reference_command_end_to_end(tmp_path: Path) -> None:
    text = """
HloModule cli, replica_count=2
sum { a = f32[] parameter(0)
      b = f32[] parameter(1)
      ROOT s = f32[] add(a, b) }
ENTRY main {
  x = f32[3] parameter(0)
  t = token[] after-all()
  r = f32[3] all-reduce(x), replica_groups={}, to_apply=sum
  o = token[] outfeed(r, t)
  id = u32[] replica-id()
  ROOT out = (f32[3], u32[]) tuple(r, id)
}
"""
    program = tmp_path / "cli.hlo"
    program.write_text(text)
    x = np.array([[1, 2, 3], [10, 20, 30]], np.float32)
    np.savez(tmp_path / "in.npz", arg0=x)
    status = run_reference_command(_args(program=program, inputs=tmp_path / "in.npz", out=tmp_path / "o.npz"))
    assert status == 0
    with np.load(tmp_path / "o.npz") as data:
        np.testing.assert_array_equal(data["out0"], np.stack([x.sum(0), x.sum(0)]))  # a leading device axis
        np.testing.assert_array_equal(data["out1"], [0, 1])
        np.testing.assert_array_equal(data["outfeed0"], np.stack([x.sum(0), x.sum(0)]))
    # random inputs, one device: no device axis
    single = tmp_path / "single.hlo"
    single.write_text("HloModule one\nENTRY main {\n  x = bf16[4] parameter(0)\n  ROOT y = bf16[4] add(x, x)\n}\n")
    run_reference_command(_args(program=single, out=tmp_path / "s.npz", seed=3))
    with np.load(tmp_path / "s.npz") as data:
        (x_dev,) = random_inputs(parse_module(single.read_text()), seed=3)[0]
        np.testing.assert_array_equal(data["out0"], (x_dev + x_dev).astype(np.float32))


def test_device_counts_a_run_cannot_hold_are_refused(tmp_path: Path) -> None:
    """A header claiming a billion replicas drew inputs for each under ``--reference`` (3 GB in 30 s), and
    ``replica_count=-1`` / ``num_partitions=0`` were accepted (a campaign of bad inputs)."""
    from tpusim.compiler.hlo import HloVerifyError

    body = "ENTRY main {\n  a = f32[8,128] parameter(0)\n  ROOT n = f32[8,128] negate(a)\n}\n"
    with pytest.raises(HloVerifyError, match=r"header's replica_count must be at least 1, not -1"):
        parse_module(f"HloModule m, replica_count=-1\n{body}")
    with pytest.raises(HloVerifyError, match=r"header's num_partitions must be at least 1, not 0"):
        parse_module(f"HloModule m, num_partitions=0\n{body}")
    big = tmp_path / "big.hlo"
    big.write_text(f"HloModule m, replica_count=1000000000\n{body}")
    args = argparse.Namespace(program=big, out=tmp_path / "o.npz")
    with pytest.raises(
        TpusimError, match=r"m runs on 1,000,000,000 devices: the reference interpreter .* at most 4,096"
    ):
        run_reference_command(args)
