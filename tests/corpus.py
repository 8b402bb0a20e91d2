"""The XLA:TPU corpus (``tests/data/corpus/``, made by ``scripts/make_corpus.py``): its programs, their seeded
inputs and JAX's outputs, read with numpy alone.

>>> names = program_names()
>>> "decoder_block_bf16" in names
True
>>> p = load("einsum_heads_bf16")
>>> [a.shape for a in p.inputs()], p.outputs[0].shape
([(4, 256, 512), (512, 8, 64)], (4, 256, 8, 64))
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np

CORPUS_DIR = Path(__file__).resolve().parent / "data" / "corpus"
CHIPS = {"v5e": "tpu_v5e", "v6e": "tpu_v6e"}
"""XLA's topology name -> tpusim's config of that chip."""

SAMPLES = 16384  # scripts/make_corpus.py: SAMPLES


def program_names() -> list[str]:
    return sorted(p.parent.name for p in CORPUS_DIR.glob("*/program.json"))


def sample_positions(size: int, samples: int = SAMPLES) -> np.ndarray:
    """The flat positions of an output the corpus keeps (``scripts/make_corpus.py``: ``sample_positions``)."""
    if size <= samples:
        return np.arange(size, dtype=np.int64)
    regular = np.linspace(0, size - 1, samples // 2).astype(np.int64)
    drawn = np.random.default_rng(size).choice(size, samples // 2, replace=False).astype(np.int64)
    return np.unique(np.concatenate([regular, drawn]))


@dataclass(frozen=True)
class Output:
    """One output of a program as JAX computed it: its shape and dtype, samples and whole-array facts."""

    shape: tuple[int, ...]
    dtype: str
    samples: np.ndarray
    facts: dict[str, Any]

    def sample(self, value: np.ndarray) -> np.ndarray:
        """The elements of ``value`` (an output of this shape) at the sampled positions."""
        return np.asarray(value).reshape(-1)[sample_positions(int(np.prod(self.shape, dtype=np.int64)))]


@dataclass(frozen=True)
class CorpusProgram:
    name: str
    meta: dict[str, Any]
    outputs: tuple[Output, ...]

    @property
    def folder(self) -> Path:
        return CORPUS_DIR / self.name

    def hlo(self, form: str) -> Path:
        """``unoptimised`` or a chip (``v5e``, ``v6e``): the HLO file of that form."""
        return self.folder / f"{form}.hlo.gz"

    def inputs(self) -> list[np.ndarray]:
        """The seeded inputs (``scripts/make_corpus.py``: ``draw_inputs``)."""
        rng = np.random.default_rng(self.meta["seed"])
        out = []
        for a in self.meta["args"]:
            shape = tuple(a["shape"])
            if a["kind"] == "normal":
                value = rng.normal(a["mean"], a["std"], shape).astype(np.float32).astype(a["dtype"])
            else:
                value = rng.integers(a["low"], a["high"], shape).astype(a["dtype"])
            out.append(np.asarray(value))
        return out

    def xla_seconds(self, chip: str) -> float:
        """XLA:TPU's estimate for the program on ``chip`` (ConcatBitcast-corrected; loops unrolled)."""
        facts = self.meta["xla"][chip]
        return float(facts.get("unrolled_optimal_seconds", facts["optimal_seconds"]))


@cache
def load(name: str) -> CorpusProgram:
    folder = CORPUS_DIR / name
    meta = json.loads((folder / "program.json").read_text())
    with np.load(folder / "outputs.npz") as npz:
        # bfloat16 and the float8 types are stored as unsigned integers of their width (or as raw bytes)
        outputs = tuple(
            Output(tuple(o["shape"]), o["dtype"], _typed(npz[f"out{i}"], o["dtype"]), o)
            for i, o in enumerate(meta["outputs"])
        )
    return CorpusProgram(name, meta, outputs)


def _typed(stored: np.ndarray, dtype: str) -> np.ndarray:
    want = np.dtype(dtype)
    return stored if stored.dtype == want else stored.view(want)
