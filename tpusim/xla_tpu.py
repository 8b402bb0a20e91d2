"""XLA's own TPU compiler as tpusim's second front door: the program a TPU would really run, compiled offline.

``libtpu`` (Google's TPU runtime and compiler, ``pip install 'jax[tpu]'``; its licence is Google's terms, not
an open-source one, so tpusim never requires it) compiles for a TPU topology with no TPU attached (JAX's
deviceless ahead-of-time path). :func:`compile_with_xla` hands it an HLO module (JAX's unoptimised lowering,
for example) and returns the module XLA:TPU would execute: its fusions, tiled layouts, VMEM ``S(1)``
buffers, prefetches and schedule, with XLA's per-fusion ``estimated_cycles`` in its text, and XLA's
``cost_analysis()`` of the whole program. tpusim then simulates that module as given
(:mod:`tpusim.compiler.canonical` reads XLA:TPU's own forms).

``optimal_seconds`` is XLA's cost model, not a measurement of a TPU. Two corrections are applied to it:
each ``ConcatBitcast`` custom-call counts -1 s in XLA's figure and is added back; a ``while`` body counts
once (not corrected here: compare loops against an unrolled compile).

>>> chip_topology("tpu_v5e", 1), chip_topology("tpu_v5p", 4)
('v5e:1x1', 'v5p:2x2x1')
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from tpusim.config import ChipConfig
from tpusim.errors import TpusimError

__all__ = ["LibtpuMissingError", "XlaCompileError", "XlaCompiled", "chip_topology", "compile_with_xla"]

# XLA's topology name per shipped chip: (generation, rank of its ICI grid).
_CHIPS = {"tpu_v5e": ("v5e", 2), "tpu_v6e": ("v6e", 2), "tpu_v5p": ("v5p", 3)}
_INSTALL = (
    "XLA's TPU compiler comes with libtpu, which tpusim does not install (its licence is Google's terms): "
    "pip install 'jax[tpu]' (the libtpu version your jax pins), or use compiler='tpusim'"
)


class LibtpuMissingError(TpusimError):
    """``compiler="xla"`` without libtpu installed."""


class XlaCompileError(TpusimError):
    """XLA:TPU refused to compile the module, or cannot compile for the chip."""


@dataclass(frozen=True)
class XlaCompiled:
    """What XLA:TPU made of a module.

    Attributes:
        text: the compiled module's HLO text (``is_scheduled=true``).
        topology: the XLA topology it was compiled for, ``v5e:1x1`` ...
        flops, bytes_accessed: from XLA's ``cost_analysis()``.
        optimal_seconds: XLA's estimate of the program's time, each ``ConcatBitcast`` added back.
        concat_bitcasts: how many ``ConcatBitcast`` custom-calls the text has (each -1 s in XLA's raw figure).
    """

    text: str
    topology: str
    flops: float
    bytes_accessed: float
    optimal_seconds: float
    concat_bitcasts: int


def chip_topology(config: ChipConfig | str, chips: int, shape: tuple[int, ...] | None = None) -> str:
    """XLA's topology name for ``chips`` chips of ``config`` (a grid ``shape``, or the smallest that holds
    them: ``2x2`` for 4 v5e chips, ``2x2x1`` for 4 v5p ones).

    Raises:
        XlaCompileError: a chip XLA's TPU compiler has no topology for in tpusim's table.
    """
    name = config if isinstance(config, str) else config.name
    if name not in _CHIPS:
        raise XlaCompileError(
            f"compiler='xla' compiles for the TPU chips XLA knows ({', '.join(sorted(_CHIPS))}); config {name!r} is "
            "none of them (a config derived from one compiles with compiler='tpusim')"
        )
    generation, rank = _CHIPS[name]
    if shape is None:
        shape = _grid(chips, rank)
    if prod(shape) != chips:
        raise XlaCompileError(f"a {'x'.join(map(str, shape))} grid does not hold {chips} chips")
    shape = tuple(shape) + (1,) * (rank - len(shape))
    return f"{generation}:{'x'.join(map(str, shape))}"


def _grid(chips: int, rank: int) -> tuple[int, ...]:
    dims = [1] * rank
    i = 0
    while prod(dims) < chips:
        dims[i % rank] *= 2
        i += 1
    if prod(dims) != chips:
        raise XlaCompileError(f"{chips} chips do not make a power-of-two grid; give the topology")
    return tuple(dims)


def compile_with_xla(
    hlo_text: str, config: ChipConfig | str, chips: int = 1, shape: tuple[int, ...] | None = None
) -> XlaCompiled:
    """Compile HLO text with XLA:TPU for ``chips`` chips of ``config``, offline.

    Raises:
        LibtpuMissingError: libtpu is not installed (the message says how to install it).
        XlaCompileError: XLA refused the module or the chip (its message included).
    """
    topology = chip_topology(config, chips, shape)
    jax, devices = _topology_devices(topology)
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import ir

    try:
        hlo = jax._src.lib.hlo.hlo_module_from_text(hlo_text)
        stablehlo = xla_client._xla.mlir.hlo_to_stablehlo(hlo.as_serialized_hlo_module_proto())
        with jax_mlir.make_ir_context():
            module = ir.Module.parse(stablehlo)
            options = xla_client.CompileOptions()
            build = options.executable_build_options
            build.num_replicas, build.num_partitions = 1, len(devices)
            if len(devices) > 1:
                build.use_spmd_partitioning = True
                # JAX lowers with Shardy by default: its shardings travel as xla.sdy.* attributes and
                # custom calls, which XLA refuses unless its Shardy partitioner is on
                build.use_shardy_partitioner = "xla.sdy." in hlo_text
                ids = np.asarray([[d.id for d in devices]], dtype=np.int32)  # one replica, a partition per chip
                build.device_assignment = xla_client.DeviceAssignment.create(ids)
            exe = devices[0].client.compile(
                module, executable_devices=xla_client.DeviceList(tuple(devices)), compile_options=options
            )
        options = _print_options()
        module = exe.hlo_modules()[0]
        text = module.to_string(options) if options is not None else module.to_string()
        cost = exe.cost_analysis()
    except Exception as err:  # XLA's errors are RuntimeErrors of many kinds: say whose they are
        raise XlaCompileError(f"XLA:TPU did not compile the module for {topology}: {err}") from None
    cost = cost[0] if isinstance(cost, list) else cost
    concats = text.count('custom_call_target="ConcatBitcast"')
    return XlaCompiled(
        text=text,
        topology=topology,
        flops=float(cost.get("flops", 0.0)),
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        optimal_seconds=float(cost.get("optimal_seconds", 0.0)) + concats,
        concat_bitcasts=concats,
    )


def _print_options() -> Any:
    """XLA's print options with every constant's value (by default large ones print as ``{...}``, which no
    parser can read back)."""
    try:
        from jaxlib import _hlo  # type: ignore[attr-defined]  # (where jaxlib 0.10 keeps its HLO bindings)
    except ImportError:  # pragma: no cover  (another jaxlib: the default options)
        return None
    options = _hlo.HloPrintOptions()
    options.print_large_constants = True
    return options


_TOPOLOGIES: dict[str, Any] = {}


def _topology_devices(topology: str) -> tuple[Any, list[Any]]:
    """JAX and the devices of a deviceless TPU topology (libtpu's compile-only client)."""
    try:
        import jax
        from jax.experimental import topologies
    except ImportError:  # pragma: no cover  (the test extra installs jax)
        raise LibtpuMissingError("compiler='xla' needs JAX; " + _INSTALL) from None
    try:
        import libtpu  # noqa: F401  (only to tell whether it is installed)
    except ImportError:
        raise LibtpuMissingError(_INSTALL) from None
    if topology not in _TOPOLOGIES:
        # libtpu looks for a TPU host when it starts; a deviceless compile needs none
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        try:
            _TOPOLOGIES[topology] = topologies.get_topology_desc(
                platform="tpu", topology_name=topology, chips_per_host_bounds=(1, 1, 1), num_slices=1
            )
        except Exception as err:
            raise XlaCompileError(f"libtpu has no topology {topology}: {err}") from None
    return jax, list(_TOPOLOGIES[topology].devices)
