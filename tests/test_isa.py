"""The instruction set: frozen values, validation, op groups, and the text form's round trip and errors."""

from __future__ import annotations

import dataclasses

import pytest

from tpusim.isa import (
    ASYNC_SEQUENCER,
    Barrier,
    Branch,
    Const,
    DmaStart,
    Fallback,
    FallbackKernel,
    FusedOp,
    Halt,
    IsaError,
    IsaParseError,
    Jump,
    MemRef,
    MxuLoadWeights,
    MxuMatmul,
    MxuPop,
    Op,
    OpGroup,
    Program,
    Reg,
    ScalarAlu,
    ScalarLoad,
    ScalarStore,
    SemSignal,
    SemWait,
    Space,
    Stream,
    StreamBuilder,
    Symbol,
    VpuBroadcast,
    VpuCopy,
    VpuFused,
    VpuIota,
    VpuMap,
    VpuReduce,
    VpuReshape,
    Window,
    XluTranspose,
    format_instruction,
    instructions,
    mnemonic,
    parse_instruction,
    parse_program,
    print_program,
)
from tpusim.memory import parse_shape


def S(text: str):
    return parse_shape(text)


HBM_A = MemRef(Space.HBM, 0x1000, S("f32[128,256]{1,0:T(8,128)}"))
VM_A = MemRef(Space.VMEM, 0x0, S("f32[128,128]{1,0:T(8,128)}"))
VM_B = MemRef(Space.VMEM, 0x10000, S("bf16[128,128]{1,0:T(8,128)(2,1)}"))
VM_P = MemRef(Space.VMEM, 0x20000, S("pred[128,128]{1,0:T(8,128)(4,1)}"))
VM_R = MemRef(Space.VMEM, 0x30000, S("f32[128]{0:T(128)}"))
SM_I = MemRef(Space.SMEM, 0x40, S("s32[16]{0}"), Window((Reg(2),), (1,)))
STRIDED = Window((1, 2), (127, 126))  # 43 rows at stride 3, 26 lanes at stride 5


def every_instruction() -> list:
    """One instance of every instruction class, most fields set."""
    win = Window((0, Reg(3)), (128, 128), clamp=True)
    return [
        DmaStart(dataclasses.replace(HBM_A, window=win), VM_A, sem=3, hlo="fusion.3"),
        DmaStart(
            VM_A,
            dataclasses.replace(VM_A, address=0x4000, base=Reg(5)),
            sem=1,
            chip=Reg(4),
            dst_core=1,
            dst_sem=2,
            route=(1, 0),
            control=True,
        ),
        SemSignal(2, count=3, core=1, chip=0),
        SemSignal(4, chip=Reg(3), fence=True),
        SemWait(3, count=2),
        Barrier(id=1, scope="system"),
        MxuLoadWeights(1, VM_B, transpose=True),
        MxuMatmul(0, VM_A, acc=128, accumulate=True, precision="bf16_6x", hlo="dot.1"),
        MxuPop(2, VM_A, acc=64),
        VpuMap("add", VM_A, (VM_A, Const(1.5, "f32"))),
        VpuMap("compare", VM_P, (VM_A, Const(float("nan"), "f32")), direction="GE"),
        VpuMap("select", VM_A, (VM_P, VM_A, Reg(7))),
        VpuMap("convert", VM_B, (VM_A,)),
        VpuFused(
            VM_P,
            (VM_A, Const(0.5, "f32"), Reg(2)),
            (FusedOp("multiply", "f32", (0, 1)), FusedOp("compare", "pred", (3, 1), "LT")),
            hlo="fusion.9",
        ),
        VpuReduce("maximum", VM_R, VM_A, (1,), accumulate=True),
        VpuBroadcast(VM_A, VM_R, (0,)),
        VpuBroadcast(VM_A, Const(-0.0, "f32"), ()),
        VpuIota(VM_A, 1),
        VpuCopy(dataclasses.replace(VM_A, shape=S("f32[128,128]{0,1:T(8,128)}")), VM_A),
        VpuCopy(
            MemRef(Space.VMEM, 0, S("f32[43,26]{1,0:T(8,128)}")),
            dataclasses.replace(VM_A, window=STRIDED),
            strides=(3, -5),
        ),
        VpuCopy(
            dataclasses.replace(VM_A, window=STRIDED),
            MemRef(Space.VMEM, 0, S("f32[43,26]{1,0:T(8,128)}")),
            dst_strides=(3, 5),
        ),
        VpuReshape(MemRef(Space.VMEM, 0, S("f32[16384]{0}")), VM_A),
        XluTranspose(VM_A, VM_A, (1, 0)),
        ScalarAlu("add", Reg(1), Reg(1), -4),
        ScalarAlu("mov", Reg(2), 0x10),
        ScalarAlu("chip_id", Reg(3)),
        ScalarLoad(Reg(4), SM_I),
        ScalarStore(MemRef(Space.SMEM, 0, S("s32[]")), Reg(4)),
        Branch("lt", Reg(1), 10, "top"),
        Jump("end"),
        Fallback("sort.1", (VM_A,), (VM_A, VM_R)),
        Halt(),
    ]


def sample_program() -> Program:
    ins = every_instruction()
    stream = Stream(0, tuple(ins), (("top", 0), ("end", len(ins))))
    other = Stream(1, (SemWait(0), Halt()), chip=None)
    pushes = (SemWait(0), DmaStart(VM_A, VM_A, sem=1, chip=1), SemSignal(2))
    async_sequencer = Stream(0, pushes, sequencer=ASYNC_SEQUENCER)
    kernel = FallbackKernel("sort.1", "HloModule m\n\nENTRY e {\n  ROOT p = f32[2] parameter(0)\n}", 10, 0.25, 1.0, 7)
    syms = (Symbol("x", HBM_A), Symbol("buf", VM_A, chip=0, core=1))
    return Program((stream, other, async_sequencer), syms, (kernel,), "round trip")


def test_round_trip_program_text():
    p = sample_program()
    text = print_program(p)
    q = parse_program(text)
    assert q == p
    assert print_program(q) == text
    # hlo names survive although they are not part of equality
    assert [i.hlo for i in q.streams[0].instructions] == [i.hlo for i in p.streams[0].instructions]


def test_the_mnemonic_is_the_first_word_of_the_text():
    """Reports take an instruction's mnemonic without printing it (printing every instruction was a third of
    a sweep point's time)."""
    for ins in every_instruction():
        assert mnemonic(ins) == format_instruction(ins).split(None, 1)[0], ins


def test_every_instruction_class_is_covered_and_grouped():
    classes = {type(i) for i in every_instruction()}
    assert classes == set(instructions.Instruction.__args__)  # type: ignore[attr-defined]
    groups = [g for g in vars(OpGroup).values() if isinstance(g, frozenset)]
    for cls in classes:
        assert cls.op in Op
        # every op is in exactly one of the primary groups
        primary = [
            g
            for g in (
                OpGroup.DMA,
                OpGroup.SYNC,
                OpGroup.MXU,
                OpGroup.VPU,
                OpGroup.XLU,
                OpGroup.SCALAR,
                OpGroup.CONTROL,
                OpGroup.FALLBACK,
            )
            if cls.op in g
        ]
        assert len(primary) == 1, cls
    assert all(g <= set(Op) for g in groups)


def test_instructions_are_frozen_and_hashable():
    ins = every_instruction()
    assert len(set(ins)) == len(ins)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ins[0].sem = 4  # type: ignore[misc]
    # the HLO name is not part of an instruction's meaning
    assert dataclasses.replace(ins[0], hlo="other") == ins[0]


def test_brief_example_line_parses():
    text = (
        "dma.start hbm[0x1000] f32[128,256]{1,0:T(8,128)}[0:128,0:128] -> vmem[0x0] "
        "f32[128,128]{1,0:T(8,128)} sem=3 @fusion.3"
    )
    ins = parse_instruction(text)
    assert isinstance(ins, DmaStart)
    assert ins.src.window == Window((0, 0), (128, 128))
    assert ins.hlo == "fusion.3"
    assert format_instruction(ins) == text


@pytest.mark.parametrize(
    ("text", "message", "column"),
    [
        ("vpu.frobnicate vmem[0x0] f32[4]", "unknown instruction 'vpu.frobnicate'", 1),
        ("sem.wait sem=3 bogus=1", "unknown keyword 'bogus'", 16),
        ("dma.start hbm[0x0] f32[4,4] -> vmem[0x0] f32[4,5]", "differ in size", 1),
        ("dma.start hbm[0x0] f33[4] -> vmem[0x0] f32[4]", "unknown element type 'f33'", 20),
        ("dma.start hbm[0x0] f32[4][0:5] -> vmem[0x0] f32[5]", "window [0:5] is 5 wide in dimension 0", 11),
        ("dma.start hbm[0x0] f32[4][2:4] -> vmem[0x0] f32[3][2:4]", "ends at 4 in dimension 0, past the size 3", 35),
        ("dma.start hbm[0x0] f32[4][2:4] -> vmem[0x0] f32[8][6:8]", "", 11),
        ("dma.start tcm[0x0] f32[4] -> vmem[0x0] f32[4]", "unknown memory space 'tcm'", 11),
        ("mxu.matmul vmem[0x0] f32[8,8] acc=0", "mxu.matmul needs mxu=", 1),
        ("s.add s1 <- s2, 3, 4", "takes at most 2 operands", 20),
        ("vpu.fused vmem[0x0] f32[4] <- vmem[0x0] f32[4] ops=[exp:f32(0)]", "unknown VPU function 'exp'", 53),
        ("vpu.add vmem[0x0] f32[4] <- vmem[0x0] f32[4]", "vpu.add takes 2 sources, not 1", 1),
    ],
)
def test_instruction_errors_name_line_and_column(text, message, column):
    if not message:  # a well-formed line for contrast
        assert format_instruction(parse_instruction(text)) == text
        return
    with pytest.raises(IsaParseError) as e:
        parse_instruction(text)
    assert message in e.value.message
    assert e.value.column == column
    assert "^" in str(e.value)


def test_program_errors_have_line_numbers():
    text = 'program "p"\nstream core=0 chip=*\n  s.mov s1 <- 0\n  br.lt s1, 3 -> nowhere\n'
    with pytest.raises(IsaParseError, match="undefined label 'nowhere'") as e:
        parse_program(text, source="p.isa")
    assert str(e.value).startswith("ISA parse error at p.isa:2:1")
    with pytest.raises(IsaParseError) as e:
        parse_program('program "p"\nstream core=0\n  s.mov s1 <- 0\n  halt extra\n')
    assert (e.value.line, e.value.column) == (4, 8)
    with pytest.raises(IsaParseError, match="not closed by a '>>>' line"):
        parse_program('program "p"\nfallback k fixed_cycles=1 <<<\nHloModule m\n')


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: DmaStart(HBM_A, VM_A), r"source window \(128, 256\) and destination window \(128, 128\) differ"),
        (lambda: DmaStart(VM_A, VM_B), "source type f32 and destination type bf16 differ"),
        (lambda: DmaStart(VM_A, VM_A, chip=1, route=(0, 2)), r"route \(0, 2\) is not an order of axes"),
        (lambda: DmaStart(VM_A, VM_A, route=(1, 0)), "a route is for a remote write"),
        (lambda: MxuMatmul(0, HBM_A), "MXU left operand must be in vmem, not hbm"),
        (lambda: VpuMap("compare", VM_P, (VM_A, VM_A)), "needs a direction"),
        (lambda: VpuReduce("add", VM_A, VM_A, (1,)), r"reducing \(128, 128\) over \(1,\) gives \(128,\)"),
        (lambda: XluTranspose(VM_A, VM_A, (0, 0)), "not a permutation"),
        (lambda: VpuCopy(VM_R, VM_A), r"vpu.copy source \(128, 128\) and destination \(128,\) differ"),
        (lambda: VpuCopy(VM_A, VM_A, strides=(2,)), "1 strides for a rank-2 block"),
        (lambda: VpuCopy(VM_A, VM_A, strides=(0, 1)), "strides .* must not be 0"),
        (
            lambda: VpuCopy(MemRef(Space.VMEM, 0, S("f32[43,26]")), VM_A, strides=(3, 5)),
            r"source \(128, 128\) must span \(127, 126\): \(43, 26\) elements at strides \(3, 5\)",
        ),
        (
            lambda: VpuCopy(VM_A, MemRef(Space.VMEM, 0, S("f32[43,26]")), dst_strides=(3, 1)),
            r"destination \(128, 128\) must span \(127, 26\): \(43, 26\) elements at dst_strides \(3, 1\)",
        ),
        (
            lambda: VpuCopy(VM_A, VM_A, strides=(1, 1), dst_strides=(1, 1)),
            "strides or dst_strides, not both",
        ),
        (lambda: ScalarAlu("add", Reg(1), Reg(2)), "s.add takes 2 operands, not 1"),
        (lambda: VpuFused(VM_A, (VM_A,), (FusedOp("add", "f32", (0, 1)),)), r"step 0 \(add:f32\(0,1\)\) uses value 1"),
        (
            lambda: VpuFused(VM_A, (VM_A,), (FusedOp("negate", "bf16", (0,)),)),
            "ends in bf16 but the destination is f32",
        ),
        (lambda: FusedOp("tanh", "f32", (0, 1)), "tanh takes 1 operands, not 2"),
        (lambda: ScalarLoad(Reg(1), VM_A), "s.load reads one element"),
        (lambda: MemRef(Space.VMEM, -4, S("f32[4]")), "address -0x4 is negative"),
        (lambda: Window((0,), (1, 2)), "1 offsets but 2 sizes"),
        (lambda: Symbol("bad name", VM_A), "symbol name 'bad name' must match"),
        (lambda: Program((Stream(0, (Jump("x"),)),)), "jumps to undefined label 'x'"),
        (lambda: Program((Stream(0, (Fallback("k", (), (VM_A,)),)),)), "undefined fallback kernel 'k'"),
        (lambda: Program((Stream(0, ()), Stream(0, ()))), "two streams for core 0"),
    ],
)
def test_bad_instructions_are_rejected(build, message):
    with pytest.raises(IsaError, match=message):
        build()


def test_stream_builder_and_labels():
    b = StreamBuilder(core=0)
    b.emit(ScalarAlu("mov", Reg(1), 0))
    b.label("loop")
    b.emit(ScalarAlu("add", Reg(1), Reg(1), 1), Branch("lt", Reg(1), 4, "loop"))
    b.label("done")
    s = b.build()
    assert s.target("loop") == 1 and s.target("done") == 3
    text = print_program(Program((s,)))
    assert "loop:\n  s.add s1 <- s1, 1\n" in text and text.endswith("done:\n")


def test_constants_print_exactly():
    for v in (1.5, -0.0, float("inf"), 1e-45, 3.4028234663852886e38):
        c = Const(v, "f32")
        back = parse_instruction(f"vpu.add vmem[0x0] f32[4] <- vmem[0x0] f32[4], {c}").srcs[1]
        assert back == c and str(back) == str(c)
    assert Const(float("nan"), "bf16") == Const(float("nan"), "bf16")
    assert Const(0.0, "f32") != Const(-0.0, "f32")
    with pytest.raises(IsaError, match="must be an integer"):
        Const(1.5, "s32")
