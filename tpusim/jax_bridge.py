"""JAX as a front end: the program ``jax.jit(fn)`` would hand a TPU, and ``fn``'s arguments and results mapped
onto that program's parameters and outputs.

``jax.jit(fn)(*args)`` accepts more than the lowered HLO's parameters spell out, and :func:`lower_for_tpu`
accepts the same:

- arguments the program does not use: JAX drops them when lowering (the module has fewer parameters), so
  only the kept ones are passed, in order;
- constants JAX hoists out of the program as extra leading parameters (``jax_use_simplified_jaxpr_constants``)
  are passed too;
- Python scalars, weakly typed values and arrays JAX canonicalises (``float64`` without x64): each value is
  converted to its parameter's element type, as ``jax.jit`` does;
- typed PRNG keys (``jax.random.key(0)``): passed as their key data (``u32[..., 2]`` for threefry), and key
  results are wrapped back into keys;
- pytrees of all of these (dicts, lists, nested tuples, ``None`` leaves, registered nodes) in and out.

>>> import jax.numpy as jnp, numpy as np
>>> program = lower_for_tpu(lambda x, unused, s: x * s, (jnp.ones(4), jnp.zeros(2), 2))
>>> len(program.leaves)  # unused is not a parameter
2
>>> [v.dtype.name for v in program.inputs([np.float32, np.int32])]  # the Python int as the program's s32
['float32', 'int32']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpusim.errors import TpusimError

__all__ = ["JaxProgram", "lower_for_tpu"]


class JaxLoweringError(TpusimError):
    """The lowered program and ``fn``'s arguments or results could not be matched up."""


@dataclass(frozen=True)
class JaxProgram:
    """What :func:`lower_for_tpu` gives: the HLO text and how ``fn``'s values map onto it.

    Attributes:
        hlo: the module's HLO text (JAX's TPU lowering).
        leaves: one value per entry parameter, in parameter order (hoisted constants, then the kept
            argument leaves; key arrays as their key data), not yet converted to the parameters' types.
        out_tree: the structure of ``fn``'s result.
        out_dtypes: the dtype of each result leaf as JAX declares it (a PRNG key type for key results).
    """

    hlo: str
    leaves: tuple[Any, ...]
    out_tree: Any
    out_dtypes: tuple[Any, ...]

    def inputs(self, dtypes: Sequence[Any]) -> list[np.ndarray]:
        """The parameters' values, each converted to its parameter's element type (``dtypes``, one per
        parameter), as ``jax.jit`` converts Python scalars, weakly typed values and canonicalised arrays."""
        if len(dtypes) != len(self.leaves):
            raise JaxLoweringError(
                f"the lowered program takes {len(dtypes)} parameters but {len(self.leaves)} values map onto them"
            )
        return [np.asarray(np.asarray(v), dtype=d) for v, d in zip(self.leaves, dtypes)]

    def outputs(self, values: Sequence[np.ndarray]) -> Any:
        """The program's flat outputs in ``fn``'s structure; key results wrapped back into PRNG keys."""
        import jax

        if len(values) != len(self.out_dtypes):
            raise JaxLoweringError(
                f"the lowered program has {len(values)} outputs but the function returns {len(self.out_dtypes)} arrays"
            )
        leaves = [
            jax.random.wrap_key_data(jax.numpy.asarray(v), impl=_key_impl(d)) if _is_key(d) else v
            for v, d in zip(values, self.out_dtypes)
        ]
        return jax.tree.unflatten(self.out_tree, leaves)


def _is_key(dtype: Any) -> bool:
    import jax

    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _key_impl(dtype: Any) -> Any:
    """The PRNG implementation of a key dtype (``key<fry>``), as ``jax.random.wrap_key_data`` takes it."""
    impl = getattr(dtype, "_impl", None)  # NOTE: jax has no public accessor from a key dtype to its impl
    if impl is None:
        raise JaxLoweringError(f"cannot tell the PRNG implementation of key type {dtype}")
    return impl


def _leaf_value(leaf: Any) -> Any:
    """A leaf as the lowered program receives it: key arrays as their key data, anything else as is."""
    import jax

    if _is_key(getattr(leaf, "dtype", None)):
        return jax.random.key_data(leaf)
    return leaf


def _parameter_count(hlo: str) -> int:
    from tpusim.compiler.hlo import parse_module

    return len(parse_module(hlo).entry_computation.parameters)


def _hlo_text(lowered: Any) -> str:
    """The lowered module as HLO text with its source locations (``metadata`` naming each op's JAX primitive and
    a stack frame of the user's code), so that reports name ``model.py:42`` rather than ``dot_general.14``."""
    try:
        return str(lowered.as_text(dialect="hlo", debug_info=True))
    except TypeError:  # a JAX without the keyword
        return str(lowered.as_text(dialect="hlo"))


def lower_for_tpu(fn: Callable[..., Any], args: Sequence[Any]) -> JaxProgram:
    """Lower ``fn(*args)`` as ``jax.jit(fn)`` would for a TPU and map ``args`` onto the module's parameters.

    The kept arguments and hoisted constants are read from JAX's lowering (``kept_var_idx``, ``const_args``:
    jax has no public accessor for them); if a JAX version lacks them, the function is lowered again with
    ``keep_unused=True`` (every argument a parameter), which changes the program only by unused parameters.
    """
    import jax

    args = tuple(args)
    leaves = [_leaf_value(leaf) for leaf in jax.tree.leaves(args)]
    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",))
    hlo = _hlo_text(lowered)
    out_dtypes = tuple(getattr(o, "dtype", None) for o in jax.tree.leaves(lowered.out_info))
    lowering = getattr(lowered, "_lowering", None)
    compile_args = getattr(lowering, "compile_args", None)
    kept = compile_args.get("kept_var_idx") if isinstance(compile_args, dict) else None
    consts = getattr(lowering, "const_args", None)
    if kept is not None and consts is not None:
        every = [*(_leaf_value(c) for c in consts), *leaves]
        values = [every[i] for i in sorted(kept)]
    else:
        values = leaves
        if _parameter_count(hlo) != len(values):
            lowered = jax.jit(fn, keep_unused=True).trace(*args).lower(lowering_platforms=("tpu",))
            hlo = _hlo_text(lowered)
    return JaxProgram(hlo, tuple(values), lowered.out_tree, out_dtypes)
