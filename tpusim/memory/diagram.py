"""Memory-layout diagrams in the style of XLA's tiled-layout document (Figures 1 and 2 of
https://openxla.org/xla/tiled_layout).

The logical array is drawn as a grid, each element labelled with its linear position in memory;
first-level tiles get colours (thick borders between them), second-level tiles get red outlines,
padding is drawn as grey cells, and the linear memory is a strip underneath in address order, each
slot coloured by the tile of the element it holds. Big arrays are cut to their first tiles and the
picture says so. :func:`layout_summary` gives the same facts as JSON-ready data.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from tpusim.errors import LayoutError, TpusimError
from tpusim.memory.shape import AnyShape, Shape
from tpusim.memory.shape_text import parse_shape

__all__ = ["MAX_DRAWN_CELLS", "MAX_POSITIONS", "DrawingBudgetError", "layout_diagram", "layout_summary"]

MAX_POSITIONS = 1 << 20  # most elements whose linear positions layout_summary lists
MAX_DRAWN_CELLS = 1 << 18  # most grid cells layout_diagram draws (max_rows x max_cols): about 6 s and 350 MB


class DrawingBudgetError(TpusimError):
    """A diagram asked to draw more grid cells than it can draw in bounded time and memory."""


_PALETTE = [
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
    "#bc80bd", "#ccebc5", "#ffed6f", "#a6cee3", "#b2df8a", "#fdbf6f", "#cab2d6", "#d9d9d9",
]  # fmt: skip
_PADDING = "#f4f4f4"
_LABEL_LIMIT = 640  # cells; beyond this, numbers would not be readable


def _as_array_shape(shape: AnyShape | str) -> Shape:
    if isinstance(shape, str):
        shape = parse_shape(shape)
    if not isinstance(shape, Shape):
        raise LayoutError(f"a layout diagram needs an array shape, not the tuple {shape}")
    if shape.element_type.kind == "token":
        raise LayoutError("a token has no memory layout to draw")
    return shape


@dataclass(frozen=True)
class _Grid:
    """The logical array as a 2-D grid of (possibly padded) cells."""

    rows: int  # rows of the padded logical grid (all but the last dimension flattened)
    cols: int
    shown_rows: int
    shown_cols: int
    index: np.ndarray  # (shown_rows, shown_cols, rank) logical indices (may exceed dims in padding)
    padding: np.ndarray  # bool (shown_rows, shown_cols)
    linear: np.ndarray  # slot of each cell
    tiles: list[np.ndarray]  # tile id per level, per cell


def _padded_logical_dims(shape: Shape) -> tuple[int, ...]:
    """Logical dimension sizes including the first level's tile padding (when it maps back cleanly)."""
    geo = shape.geometry
    if not geo.levels or geo.levels[0].merges or geo.levels[0].prepended:
        return shape.dimensions
    padded = geo.levels[0].padded_dims
    out = list(shape.dimensions)
    for position, dim in enumerate(geo.physical_permutation):
        out[dim] = padded[position]
    return tuple(out)


def _grid(shape: Shape, max_rows: int, max_cols: int) -> _Grid:
    dims = shape.dimensions if shape.rank else (1,)
    padded = _padded_logical_dims(shape) if shape.rank else (1,)
    rows, cols = prod(padded[:-1]), padded[-1]
    shown_rows, shown_cols = _first_tiles(shape, rows, cols, max_rows, max_cols)
    r, c = np.meshgrid(np.arange(shown_rows), np.arange(shown_cols), indexing="ij")
    lead = np.stack(np.unravel_index(r, padded[:-1]), axis=-1) if len(padded) > 1 else np.zeros((*r.shape, 0), int)
    index = np.concatenate([lead, c[..., None]], axis=-1).astype(np.int64)
    padding = np.any(index >= np.asarray(dims), axis=-1)
    if shape.rank == 0:
        index = index[..., :0]
    geo = shape.geometry
    linear = geo.linear_index(index)
    tiles = [geo.tile_index(index, level) for level in range(len(geo.levels))]
    return _Grid(rows, cols, shown_rows, shown_cols, index, padding, linear, tiles)


def _first_tiles(shape: Shape, rows: int, cols: int, max_rows: int, max_cols: int) -> tuple[int, int]:
    """How much of the grid to show: whole first-level tiles where they fit the budget."""
    geo = shape.geometry
    tile_rows, tile_cols = 1, 1
    if geo.levels and shape.rank >= 1 and not geo.levels[0].merges:
        tile = geo.levels[0].tile
        last = geo.physical_permutation[-1] == shape.rank - 1 if shape.rank else True
        tile_cols = tile[-1] if last else 1
        tile_rows = tile[-2] if len(tile) >= 2 and last else 1
    shown_rows = rows if rows <= max_rows else max(tile_rows, max_rows // tile_rows * tile_rows)
    shown_cols = cols if cols <= max_cols else max(tile_cols, max_cols // tile_cols * tile_cols)
    return min(shown_rows, rows, max(max_rows, 1)), min(shown_cols, cols, max(max_cols, 1))


def _colours(tile_ids: np.ndarray, padding: np.ndarray) -> np.ndarray:
    rgb = np.array([to_rgb(c) for c in _PALETTE])
    out = rgb[tile_ids % len(_PALETTE)]
    out[padding] = to_rgb(_PADDING)
    return out


def _edges(ids: np.ndarray) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """Line segments between neighbouring cells whose ids differ (cell (r, c) spans [c, c+1] x [r, r+1])."""
    segments: list[tuple[tuple[float, float], tuple[float, float]]] = []
    rr, cc = np.nonzero(ids[1:, :] != ids[:-1, :])
    segments += [((c, r + 1), (c + 1, r + 1)) for r, c in zip(rr.tolist(), cc.tolist())]
    rr, cc = np.nonzero(ids[:, 1:] != ids[:, :-1])
    segments += [((c + 1, r), (c + 1, r + 1)) for r, c in zip(rr.tolist(), cc.tolist())]
    return segments


def layout_diagram(
    shape: AnyShape | str, *, max_rows: int = 16, max_cols: int = 256, strip_width: int | None = None
) -> Figure:
    """Draw how ``shape``'s layout places its elements in memory.

    Args:
        shape: an array shape or shape string, e.g. ``"f32[3,5]{1,0:T(2,2)}"``.
        max_rows: most rows of the logical grid to draw (the rest is cut, at tile boundaries).
        max_cols: most columns to draw (``max_rows x max_cols`` at most ``MAX_DRAWN_CELLS``).
        strip_width: slots per row of the memory strip (default: the grid's column count, at most 64).

    Returns:
        A matplotlib Figure (not attached to pyplot; save it with ``fig.savefig(path)``).
    """
    if max_rows < 1 or max_cols < 1 or max_rows * max_cols > MAX_DRAWN_CELLS:
        raise DrawingBudgetError(
            f"max_rows={max_rows}, max_cols={max_cols}: each must be at least 1 and together at most "
            f"{MAX_DRAWN_CELLS:,} cells"
        )
    shape = _as_array_shape(shape)
    geo = shape.geometry
    grid = _grid(shape, max_rows, max_cols)
    level0 = grid.tiles[0] if grid.tiles else np.zeros_like(grid.linear)
    cells = grid.shown_rows * grid.shown_cols
    cut = grid.shown_rows < grid.rows or grid.shown_cols < grid.cols

    labelled = cells <= _LABEL_LIMIT
    cell_in = 0.42 if labelled else max(0.05, 14.0 / max(grid.shown_cols, 1))

    # The memory strip: the first slots in address order (as many as the grid shows, at most 16 rows).
    width = strip_width or max(1, min(64 if labelled else 128, grid.shown_cols if grid.shown_cols > 1 else cells))
    shown_slots = int(min(geo.element_slots, max(cells, 1), width * (16 if not labelled else 64)))
    strip_rows = -(-shown_slots // width)
    slot_index, slot_valid = geo.logical_index(np.arange(strip_rows * width))
    slot_tiles = (
        geo.tile_index(np.where(slot_valid[:, None], slot_index, 0), 0)
        if geo.levels
        else np.zeros(slot_valid.shape, int)
    )
    slot_tiles = slot_tiles.reshape(strip_rows, width)
    slot_pad = (~slot_valid).reshape(strip_rows, width)
    beyond = (np.arange(strip_rows * width) >= shown_slots).reshape(strip_rows, width)

    fig_w = max(7.5, min(18.0, max(grid.shown_cols, width) * cell_in + 1.5))
    grid_h = grid.shown_rows * cell_in
    strip_h = strip_rows * cell_in
    fig = Figure(figsize=(fig_w, grid_h + strip_h + 2.2), layout="constrained")
    ax_grid, ax_strip = fig.subplots(2, 1, height_ratios=[max(grid_h, 0.4), max(strip_h, 0.4)])

    ax_grid.imshow(_colours(level0, grid.padding), extent=(0, grid.shown_cols, grid.shown_rows, 0), aspect="equal")
    ax_grid.add_collection(LineCollection(_edges(level0), colors="black", linewidths=1.6))
    if len(grid.tiles) > 1:
        red = LineCollection(_edges(grid.tiles[1]), colors="#d62728", linewidths=1.0 if labelled else 0.3)
        ax_grid.add_collection(red)
    if labelled:
        for (r, c), slot in np.ndenumerate(grid.linear):
            pad = bool(grid.padding[r, c])
            ax_grid.text(c + 0.5, r + 0.5, str(slot), ha="center", va="center", fontsize=7,
                         color="#9a9a9a" if pad else "black", style="italic" if pad else "normal")  # fmt: skip
    _axis_ticks(ax_grid, shape, grid, cell_in)
    ax_grid.set_title("logical array: each element labelled with its position in memory", fontsize=9, loc="left")

    colours = _colours(slot_tiles, slot_pad)
    colours[beyond] = (1.0, 1.0, 1.0)
    ax_strip.imshow(colours, extent=(0, width, strip_rows, 0), aspect="equal")
    ax_strip.add_collection(LineCollection(_edges(np.where(beyond, -1, 0)), colors="black", linewidths=0.8))
    if shown_slots <= 256 and labelled:
        flat_index, flat_valid = slot_index.reshape(len(slot_valid), shape.rank), slot_valid
        for slot in range(shown_slots):
            label = ",".join(map(str, flat_index[slot])) if flat_valid[slot] else ""
            ax_strip.text(slot % width + 0.5, slot // width + 0.5, label or "pad", ha="center", va="center",
                          fontsize=6, color="black" if label else "#9a9a9a")  # fmt: skip
    ax_strip.set_xticks([])
    rows = range(0, strip_rows, max(1, int(np.ceil(0.16 / cell_in))))
    ax_strip.set_yticks([r + 0.5 for r in rows], [str(r * width) for r in rows], fontsize=7)
    ax_strip.set_title(
        f"memory in address order, slots 0-{shown_slots - 1} of {geo.element_slots}"
        + (" (each holds the logical index shown)" if labelled else ""),
        fontsize=9,
        loc="left",
    )
    summary = (
        f"{shape}\ntiled shape {list(geo.tiled_dims)}    {geo.byte_size} bytes    "
        f"{geo.element_bits} bits per slot    padding {geo.padding_fraction:.1%}"
    )
    if cut:
        shown, total = f"{grid.shown_rows}x{grid.shown_cols}", f"{grid.rows}x{grid.cols}"
        summary += f"\nshowing the first {shown} cells of {total} (first tiles only)"
    fig.suptitle(summary, fontsize=10)
    return fig


def _axis_ticks(ax: Any, shape: Shape, grid: _Grid, cell_in: float) -> None:
    ax.set_xlim(0, grid.shown_cols)
    ax.set_ylim(grid.shown_rows, 0)
    step_c = max(1, grid.shown_cols // 16)
    ax.set_xticks(
        [c + 0.5 for c in range(0, grid.shown_cols, step_c)], [str(c) for c in range(0, grid.shown_cols, step_c)]
    )
    step_r = max(1, int(np.ceil(0.16 / cell_in)))
    labels = [",".join(map(str, grid.index[r, 0, :-1])) or "0" for r in range(0, grid.shown_rows, step_r)]
    ax.set_yticks([r + 0.5 for r in range(0, grid.shown_rows, step_r)], labels)
    ax.tick_params(labelsize=7, length=0)
    ax.set_xlabel(f"dimension {max(shape.rank - 1, 0)}", fontsize=8)
    ax.set_ylabel(
        "dimensions " + ",".join(map(str, range(shape.rank - 1))) if shape.rank > 2 else "dimension 0", fontsize=8
    )


def layout_summary(shape: AnyShape | str, *, max_positions: int = MAX_POSITIONS) -> dict[str, Any]:
    """JSON-ready facts about a layout: shape, tiled shape, byte size, padding fraction and the linear
    position of every element as a nested list with the logical shape.

    An array of more than ``max_positions`` elements gets ``"linear_positions": null`` and
    ``"linear_positions_truncated": true`` (the other facts are still given): listing them would take
    memory in proportion to the array."""
    shape = _as_array_shape(shape)
    geo = shape.geometry
    cut = prod(shape.dimensions) > max_positions
    return {
        "shape": str(shape),
        "element_type": shape.element_type.name,
        "dimensions": list(shape.dimensions),
        "minor_to_major": list(shape.effective_layout.minor_to_major),
        "tiles": [list(lvl.tile) for lvl in geo.levels],
        "physical_shape": list(geo.tiled_dims),
        "element_slots": geo.element_slots,
        "bits_per_slot": geo.element_bits,
        "byte_size": geo.byte_size,
        "padding_fraction": geo.padding_fraction,
        "linear_positions": None if cut else geo.linear_map().tolist(),
        "linear_positions_truncated": cut,
    }
