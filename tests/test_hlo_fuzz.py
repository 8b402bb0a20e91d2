"""Mutation fuzzing of the HLO front end: real modules with characters and tokens deleted, duplicated,
swapped or inserted must either parse (and then round-trip through the printer) or fail with an
HloParseError or HloVerifyError, never with any other exception."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpusim.compiler.hlo import HloParseError, HloVerifyError, parse_module, print_module

SAMPLES = Path(__file__).parent / "hlo_samples"
SOURCES = [
    (SAMPLES / name).read_text()
    for name in (
        "jax_mlp_short.hlo",
        "jax_attention_debug.hlo",
        "jax_linalg_tpu.hlo",
        "jax_collectives_optimized.hlo",
        "tpu_scheduled.hlo",
        "constants.hlo",
        "legacy_forms.hlo",
        "xla_forms.hlo",
    )
]
TOKEN = re.compile(r"%?[A-Za-z_][A-Za-z0-9_.\-]*|-?\d+(?:\.\d+)?|\s+|\"(?:[^\"\\]|\\.)*\"|.", re.S)
ALPHABET = "{}()[],=%:;.-_\"'/*<>?0123456789 \nabcfsuxTSE"
# NOTE: hypothesis runs derandomized so the suite is deterministic; raise TPUSIM_FUZZ_EXAMPLES to search longer.
EXAMPLES = int(os.environ.get("TPUSIM_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _check(text: str) -> None:
    try:
        module = parse_module(text, "fuzz.hlo")
    except (HloParseError, HloVerifyError) as err:
        str(err)  # formatting the message must not fail either
        return
    assert parse_module(print_module(module), "fuzz.printed.hlo", verify=False) == module


@st.composite
def char_mutations(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(SOURCES))
    for _ in range(draw(st.integers(1, 3))):
        if not text:
            break
        i = draw(st.integers(0, len(text) - 1))
        n = draw(st.integers(1, 4))
        kind = draw(st.sampled_from(["delete", "duplicate", "swap", "insert"]))
        if kind == "delete":
            text = text[:i] + text[i + n :]
        elif kind == "duplicate":
            text = text[: i + n] + text[i : i + n] + text[i + n :]
        elif kind == "swap":
            j = draw(st.integers(0, len(text) - 1))
            a, b = sorted((i, j))
            text = text[:a] + text[b : b + 1] + text[a + 1 : b] + text[a : a + 1] + text[b + 1 :]
        else:
            text = text[:i] + draw(st.text(alphabet=ALPHABET, min_size=1, max_size=n)) + text[i:]
    return text


@st.composite
def token_mutations(draw: st.DrawFn) -> str:
    tokens = TOKEN.findall(draw(st.sampled_from(SOURCES)))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(tokens) - 1))
        kind = draw(st.sampled_from(["delete", "duplicate", "swap", "replace"]))
        if kind == "delete":
            del tokens[i]
        elif kind == "duplicate":
            tokens.insert(i, tokens[i])
        elif kind == "swap":
            j = draw(st.integers(0, len(tokens) - 1))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        else:
            tokens[i] = tokens[draw(st.integers(0, len(tokens) - 1))]
    return "".join(tokens)


@FUZZ
@given(char_mutations())
def test_character_mutations(text):
    _check(text)


@FUZZ
@given(token_mutations())
def test_token_mutations(text):
    _check(text)


@FUZZ
@given(st.sampled_from(SOURCES), st.integers(0, 10**6))
def test_truncations(text, cut):
    _check(text[: cut % (len(text) + 1)])


@pytest.mark.parametrize("text", SOURCES)
def test_unmutated_sources_round_trip(text):
    _check(text)
