"""Bad multi-chip input fails with a clear error: groups that do not partition the devices, a collective not
every chip reaches (a deadlock naming chips and instruction, not a hang), topologies that do not fit."""

from __future__ import annotations

import numpy as np
import pytest

import tpusim
from tpusim.api import InputError
from tpusim.compiler.errors import CompileError
from tpusim.devices.core import DeadlockError
from tpusim.errors import ConfigError

SUM = "sum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n"


def _all_reduce(groups: str, header: str = "replica_count=8", reducer: str = SUM) -> str:
    return (
        f"HloModule ar, {header}\n{reducer}ENTRY main {{\n  x = f32[8,128] parameter(0)\n"
        f"  ROOT r = f32[8,128] all-reduce(x), replica_groups={groups}, to_apply=sum\n}}\n"
    )


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ("{{0,1,2,3},{3,4,5,6,7}}", r"^r \(all-reduce\): device 3 is in two groups of replica_groups=\{\{0,1,2,3\},"),
        ("{{0,1},{2,3}}", r"^r \(all-reduce\): replica_groups=\{\{0,1\},\{2,3\}\} leave devices 4, 5, 6, 7 out"),
        ("{{0,1,2},{3,4,5,6,7}}", r"^r \(all-reduce\): replica_groups=.* have groups of different sizes \[3, 5\]"),
        ("{{0,9}}", r"^r \(all-reduce\): .*names id 9, but the run has only 8 .*\(the run has 8 replicas x 1"),
    ],
)
def test_mismatched_replica_groups(groups: str, message: str) -> None:
    with pytest.raises(CompileError, match=message):
        tpusim.simulate(_all_reduce(groups), chips=8)


def test_mismatched_permute_pairs_and_shapes() -> None:
    permute = (
        "HloModule cp, replica_count=4\nENTRY main {\n  x = f32[8,128] parameter(0)\n"
        "  ROOT r = f32[8,128] collective-permute(x), source_target_pairs={{0,1},{2,1}}\n}\n"
    )
    with pytest.raises(CompileError, match=r"^r \(collective-permute\): id 1 is the target of several"):
        tpusim.simulate(permute, chips=4)
    gather = (
        "HloModule ag, replica_count=4\nENTRY main {\n  x = f32[4,32] parameter(0)\n"
        "  ROOT r = f32[4,96] all-gather(x), replica_groups={}, dimensions={1}\n}\n"
    )
    with pytest.raises(CompileError, match=r"^r \(all-gather\): .*dimension 1 .*96.* 4 x 32"):
        tpusim.simulate(gather, chips=4)


def test_ragged_all_to_all_on_many_chips_is_refused() -> None:
    """A fallback would run it on one chip's bytes: a wrong answer, so it is an error instead."""
    text = (
        "HloModule ragged, replica_count=2\nENTRY main {\n  x = f32[4] parameter(0)\n  o = f32[4] parameter(1)\n"
        "  i = s32[2] parameter(2)\n  s = s32[2] parameter(3)\n  oo = s32[2] parameter(4)\n  r = s32[2] parameter(5)\n"
        "  ROOT a = f32[4] ragged-all-to-all(x, o, i, s, oo, r), replica_groups={{0,1}}\n}\n"
    )
    with pytest.raises(CompileError, match=r"^a \(ragged-all-to-all\): has no lowering for a run of several chips"):
        tpusim.simulate(text, chips=2, timing_only=True)


def test_unsupported_reduction_is_an_error_not_a_silent_fallback() -> None:
    sub = "sum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] subtract(a, b)\n}\n"
    with pytest.raises(CompileError, match=r"^r \(all-reduce\): the reduction sum \(root subtract\) is not one"):
        tpusim.simulate(_all_reduce("{}", reducer=sub), chips=8)


def test_a_collective_only_some_chips_reach_is_a_deadlock() -> None:
    """Chip 0 alone takes the branch holding the all-reduce: it waits for its neighbours' handshake, which
    never comes; the run stops with every blocked chip and the HLO instruction named."""
    text = f"""HloModule partial, replica_count=4
{SUM}
reduced {{
  p = f32[8,128] parameter(0)
  ROOT allreduce = f32[8,128] all-reduce(p), replica_groups={{}}, to_apply=sum
}}
skip {{
  p = f32[8,128] parameter(0)
  ROOT c = f32[8,128] negate(p)
}}
ENTRY main {{
  x = f32[8,128] parameter(0)
  id = u32[] replica-id()
  zero = u32[] constant(0)
  first = pred[] compare(id, zero), direction=EQ
  ROOT out = f32[8,128] conditional(first, x, x), true_computation=reduced, false_computation=skip
}}
"""
    with pytest.raises(DeadlockError) as err:
        tpusim.simulate(text, chips=4, topology="4")
    message = str(err.value)
    assert message.startswith("deadlock: no event is left to run but a core has instructions left")
    assert "chip 0 core 0" in message and "allreduce" in message and "sem.wait" in message
    assert "chip 1" not in message  # the others finished their streams


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"chips": 8, "topology": "2x2"}, ConfigError, r"^topology 2x2 holds 4 chips, not the 8 chips of the run$"),
        ({"topology": "32"}, ConfigError, r"^topology 32: \[32\] does not fit the largest slice \[16, 16\]"),
        ({"topology": "2x2x2"}, ConfigError, r"^topology 2x2x2: \[2, 2, 2\] has 3 axes but the chips connect in 2"),
        ({"topology": "2xfour"}, ConfigError, r"^topology '2xfour' must look like 8, 2x4 or 4x4x4"),
        ({"chips": 4}, CompileError, r"replica_count x num_partitions = 8 devices, but the system has 4 chips"),
    ],
)
def test_topologies_that_do_not_fit(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        tpusim.simulate(_all_reduce("{}"), **kwargs)


def test_inputs_need_the_chip_axis_and_devices_need_chips() -> None:
    no_axis = r"^input 0 \(x\) has shape \(8, 128\); with 8 chips it needs a leading chip axis: \(8, 8, 128\)$"
    with pytest.raises(InputError, match=no_axis):
        tpusim.simulate(_all_reduce("{}"), [np.zeros((8, 128), np.float32)], chips=8)
    with pytest.raises(InputError, match=r"^ar runs on 8 devices \(replica_count x num_partitions\); simulate it"):
        tpusim.simulate(_all_reduce("{}"), [np.zeros((8, 128), np.float32)])
