"""The ``tpusim run ... --check`` commands of examples/README.md for the f32 programs pass as written, at the
default precision too (the page once said they fail without ``--matmul-precision highest``). The bf16
examples' checks run in tests/test_e2e_programs.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tpusim.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "examples" / "README.md"


def _check_commands() -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", PAGE.read_text(), re.S)
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("tpusim run ") and "_f32.hlo --check" in line]


def test_the_page_has_the_f32_examples_at_default_precision() -> None:
    commands = _check_commands()
    f32 = {p.stem for p in (ROOT / "examples").glob("*_f32.hlo")}
    assert f32 and all(any(f"examples/{n}.hlo --check" == c.split(" ", 2)[2] for c in commands) for n in f32)


@pytest.mark.parametrize("command", _check_commands())
def test_check_commands_pass(command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)
    status = main(shlex.split(command)[1:])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "check against the reference interpreter:" in out and "MISMATCH" not in out
