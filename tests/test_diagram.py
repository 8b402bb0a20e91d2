"""Layout diagrams render as real images and carry the facts the figures of XLA's tiled-layout
document show (https://openxla.org/xla/tiled_layout)."""

import json

import matplotlib.image as mpimg
import numpy as np
import pytest

from tpusim.errors import LayoutError
from tpusim.memory.diagram import layout_diagram, layout_summary


def _texts(fig) -> list[str]:  # type: ignore[no-untyped-def]
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_figure1_labels_every_element_with_its_linear_position(tmp_path) -> None:  # type: ignore[no-untyped-def]
    fig = layout_diagram("f32[3,5]{1,0:T(2,2)}")
    texts = _texts(fig)
    # The 15 elements and the 9 padding cells of the padded [4,6] grid, each with its slot number.
    for slot in range(24):
        assert str(slot) in texts
    # The memory strip names the logical element each slot holds, and the padding.
    assert "2,3" in texts and texts.count("pad") == 9
    path = tmp_path / "figure1.png"
    fig.savefig(path, dpi=60)
    pixels = mpimg.imread(path)
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    # Several distinct tile colours are drawn, not a blank canvas.
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 20


def test_figure2_outlines_second_level_tiles_in_red() -> None:
    fig = layout_diagram("f32[4,8]{1,0:T(2,4)(2,1)}")
    grid_axes = fig.axes[0]
    colours = [tuple(np.round(c.get_colors()[0][:3], 2)) for c in grid_axes.collections]
    assert (0.84, 0.15, 0.16) in colours  # red (2,1) outlines besides the black tile borders
    assert "31" in _texts(fig)


def test_big_arrays_are_cut_and_say_so() -> None:
    fig = layout_diagram("bf16[1024,1024]{1,0:T(8,128)(2,1)}")
    assert "first tiles only" in fig.get_suptitle()
    assert _texts(fig) == []  # far too many cells to label


def test_tuple_shapes_are_refused() -> None:
    with pytest.raises(LayoutError, match="needs an array shape, not the tuple"):
        layout_diagram("(f32[2], s32[])")


def test_summary_is_json_ready() -> None:
    summary = layout_summary("f32[3,5]{1,0:T(2,2)}")
    assert json.loads(json.dumps(summary)) == summary
    assert summary["linear_positions"][2][3] == 17
    assert summary["physical_shape"] == [2, 3, 2, 2]
    assert summary["byte_size"] == 96 and summary["padding_fraction"] == pytest.approx(9 / 24)
