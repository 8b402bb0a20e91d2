"""The program verifier catches what a lowering bug would leave behind, naming the instruction."""

import pytest

from tpusim.compiler.verify import ProgramVerifyError, verify_program
from tpusim.config import load_config
from tpusim.isa import DmaStart, Halt, MemRef, Program, Reg, ScalarAlu, SemWait, Space, VpuMap
from tpusim.memory import parse_shape

CFG = load_config("teaching")
BLOCK = parse_shape("f32[8,8]{1,0:T(8,8)}")
HBM = MemRef(Space.HBM, 0, BLOCK)  # type: ignore[arg-type]
VMEM = MemRef(Space.VMEM, 0, BLOCK)  # type: ignore[arg-type]
VMEM2 = MemRef(Space.VMEM, 256, BLOCK)  # type: ignore[arg-type]


def _program(*instructions) -> Program:  # type: ignore[no-untyped-def]
    return Program.single(instructions)


def test_a_correct_program_passes() -> None:
    verify_program(
        _program(
            DmaStart(src=HBM, dst=VMEM, sem=0),
            SemWait(sem=0),
            VpuMap(fn="negate", dst=VMEM2, srcs=(VMEM,)),
            DmaStart(src=VMEM2, dst=HBM, sem=1),
            SemWait(sem=1),
            Halt(),
        ),
        CFG,
    )


def test_reading_vmem_nobody_wrote() -> None:
    with pytest.raises(
        ProgramVerifyError, match=r"^instruction 0 `vpu.negate .*`: reads vmem\[0x0\] before anything wrote it"
    ):
        verify_program(_program(VpuMap(fn="negate", dst=VMEM2, srcs=(VMEM,))), CFG)


def test_a_dma_nobody_waits_for() -> None:
    with pytest.raises(
        ProgramVerifyError, match=r"^instruction 0 `dma.start .*`: signals semaphore 3 but nothing waits"
    ):
        verify_program(_program(DmaStart(src=HBM, dst=VMEM, sem=3), Halt()), CFG)


def test_waiting_for_more_than_was_signalled() -> None:
    with pytest.raises(ProgramVerifyError, match=r"waits for 2 signals on semaphore 0 but only 1 are outstanding"):
        verify_program(_program(DmaStart(src=HBM, dst=VMEM, sem=0), SemWait(sem=0, count=2)), CFG)


def test_out_of_bounds_and_misaligned_operands() -> None:
    far = MemRef(Space.VMEM, CFG.vmem.bytes, BLOCK)  # type: ignore[arg-type]
    with pytest.raises(ProgramVerifyError, match=r"vmem operand ends at byte 65792, past the 65536-byte memory"):
        verify_program(_program(DmaStart(src=HBM, dst=far, sem=0), SemWait(sem=0)), CFG)
    odd = MemRef(Space.VMEM, 4, BLOCK)  # type: ignore[arg-type]
    with pytest.raises(ProgramVerifyError, match=r"VMEM operand at 0x4 is not aligned to 256 bytes"):
        verify_program(_program(DmaStart(src=HBM, dst=odd, sem=0), SemWait(sem=0)), CFG)


def test_registers_are_set_before_use() -> None:
    with pytest.raises(ProgramVerifyError, match=r"reads register s2 before anything set it"):
        verify_program(_program(ScalarAlu(fn="add", dst=Reg(1), a=Reg(2), b=1)), CFG)
