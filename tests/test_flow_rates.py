"""The fair-share solver's two fillings agree to the bit: networks of many flows are filled on arrays
(``_rates_arrays``), small ones by the loop; both must give every flow the same rate, since the cycles a run
reports follow from them (a 256-chip all-reduce reports the same simulated time either way)."""

from __future__ import annotations

import random

import pytest

import tpusim.devices.flows as flows_module
from tpusim.devices.flows import _MANY, Flow, FlowNetwork, Resource, _rates_arrays


def _network(seed: int, flows: int) -> list[Flow]:
    rng = random.Random(seed)
    resources = [Resource(f"r{k}", rng.choice([1.0, 2.0, 16.0, 64.0, 0.5 + rng.random()])) for k in range(40)]
    out = []
    for _ in range(flows):
        uses = [(r, rng.choice([1.0, 1.0, 2.0, 1.0 + rng.random()])) for r in rng.sample(resources, rng.randint(1, 4))]
        cap = rng.choice([float("inf"), 8.0, rng.random() * 4 + 0.1])
        out.append(Flow(rng.random() * 1e6, uses, cap, None))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_array_filling_equals_the_loop_to_the_bit(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    flows = _network(seed, _MANY + 40 * (seed % 4))
    net = FlowNetwork(env=None)
    net.active = flows
    net.sigs = {f.sig: 1 for f in flows}  # (several resource sets: the general filling)
    assert len(net.sigs) > 1
    monkeypatch.setattr(flows_module, "_MANY", 10**9)  # the loop, however many flows
    net._rates()
    loop = [f.rate for f in flows]
    assert _rates_arrays(flows).tolist() == loop
    assert all(r > 0 for r in loop)


def _finishes(seed: int, many: int, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """``(flow, cycle its last byte moved)`` of a network whose flows start over time (some at once)."""
    from tpusim.devices.engine import make_env

    monkeypatch.setattr(flows_module, "_MANY", many)
    rng = random.Random(seed)
    env = make_env()
    net = FlowNetwork(env)
    flows = _network(seed, 160)
    done: list[tuple[int, int]] = []
    for k, f in enumerate(flows):
        f.on_done = lambda cycle, k=k: done.append((k, cycle))
    starts = sorted(rng.choice([0, 0, rng.randint(0, 40_000)]) for _ in flows)

    def feed():
        for f, at in zip(flows, starts):
            if at > env.now:
                yield env.timeout(at - env.now)
            net.add(f, at)

    env.process(feed())
    env.run()
    return done


@pytest.mark.parametrize("seed", range(4))
def test_a_network_of_many_flows_finishes_them_as_the_loops_do(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """From _MANY active flows the network keeps bytes left and rates in arrays; flows starting and ending
    over time cross that threshold both ways, and every flow ends at the same cycle as with the loops."""
    arrays = _finishes(seed, 48, monkeypatch)
    loops = _finishes(seed, 10**9, monkeypatch)
    assert len(arrays) == 160 and arrays == loops
