"""``replica_groups=`` in every form XLA prints, expanded to explicit device groups.

* lists: ``{{0,1},{2,3}}`` (``{}`` for none);
* iota (``IotaReplicaGroupList``): ``[2,4]<=[8]``, ``[2,4]<=[4,2]T(1,0)``: ``arange(prod).reshape(...)
  .transpose(T).reshape(groups, size)``;
* mesh axes (``MeshAxesReplicaGroupList::ToString`` in xla/hlo/ir/replica_group.cc): ``mesh[x=2,y=4] {y}``,
  sub-axes ``mesh[a=8] {a:(2)2}``, explicit devices ``mesh[x=2,y=2], device_ids=(3,2,1,0) {x}``.
"""

from __future__ import annotations

import re
from math import prod

import numpy as np

from tpusim.compiler.hlo.ir import Instruction, ReplicaGroups
from tpusim.compiler.hlo.lexer import SourceText, int_tuple
from tpusim.semantics import groups

__all__ = ["instruction_groups", "instruction_mode", "read_replica_groups"]

_IOTA_GROUPS = re.compile(r"\[(\d+(?:,\d+)*)\]<=\[(\d+(?:,\d+)*)\](?:T\((\d+(?:,\d+)*)\))?")
# Axis names are printed quoted by recent XLA (mesh['axis_0'=2,'axis_1'=4] {'axis_0'}), bare by others.
_AXIS_NAME = r"""(?:'([^'\n]*)'|"([^"\n]*)"|([A-Za-z_]\w*))"""
_MESH = re.compile(rf"mesh\[\s*({_AXIS_NAME}\s*=\s*\d+(?:\s*,\s*{_AXIS_NAME}\s*=\s*\d+)*)\s*\]")
_MESH_AXIS = re.compile(rf"\s*{_AXIS_NAME}\s*=\s*(\d+)\s*,?")
_MESH_DEVICES = re.compile(
    r"\s*,\s*device_ids=\(\s*(?:\[(\d+(?:,\d+)*)\](?:T\((\d+(?:,\d+)*)\))?|(\d+(?:\s*,\s*\d+)*))\s*\)"
)
_AXIS_REF = re.compile(rf"\s*{_AXIS_NAME}(?::\((\d+)\)(\d+))?\s*")
MAX_DEVICES = 1 << 20
"""The most devices the iota and mesh forms may describe (they are expanded to explicit lists; the largest
TPU pods have about 9,000 chips)."""


def _check_devices(src: SourceText, pos: int, count: int, what: str) -> None:
    if count > MAX_DEVICES:
        raise src.error(pos, f"{what} describe {count} devices; tpusim expands at most {MAX_DEVICES:,}")


def read_replica_groups(src: SourceText, pos: int) -> tuple[ReplicaGroups, int]:
    start = src.skip_ws(pos)
    text = src.text
    if text.startswith("{", start):
        groups, end = src.int_lists(start, "replica groups like {{0,1},{2,3}}")
        return ReplicaGroups(groups, text[start:end]), end
    m = _IOTA_GROUPS.match(text, start)
    if m:
        shape, reshape = int_tuple(m.group(1)), int_tuple(m.group(2))
        perm = int_tuple(m.group(3)) if m.group(3) else tuple(range(len(reshape)))
        if len(shape) != 2:
            raise src.error(start, f"iota replica groups need [groups,size], found {len(shape)} dimensions")
        if sorted(perm) != list(range(len(reshape))):
            raise src.error(start, f"T{perm} is not a permutation of the {len(reshape)} reshape dimensions")
        if prod(shape) != prod(reshape):
            raise src.error(start, f"[{m.group(1)}] and <=[{m.group(2)}] hold different numbers of devices")
        _check_devices(src, start, prod(reshape), "the replica groups")
        ids = np.arange(prod(reshape)).reshape(reshape).transpose(perm).reshape(shape)
        return ReplicaGroups(tuple(tuple(int(v) for v in row) for row in ids), m.group(0)), m.end()
    m = _MESH.match(text, start)
    if m:
        return _mesh_groups(src, start, m)
    expected = "expected replica groups like {{0,1},{2,3}}, [2,2]<=[4] or mesh[x=2] {x}"
    raise src.error(start, f"{expected}, found {src.found(start)}")


def _mesh_groups(src: SourceText, start: int, m: re.Match[str]) -> tuple[ReplicaGroups, int]:
    """``mesh[x=2,y=4] {y}`` (XLA's MeshAxesReplicaGroupList::ToString): one group per combination of the
    other axes, devices ordered by the listed axes; ``a:(p)s`` is the size-s sub-axis after p devices."""
    names, sizes = [], []
    for item in _MESH_AXIS.finditer(m.group(1)):
        names.append(next(g for g in item.groups()[:3] if g is not None))
        sizes.append(int(item.group(4)))
    total = prod(sizes)
    _check_devices(src, start, total, "the mesh axes")
    devices = np.arange(total)
    pos = m.end()
    d = _MESH_DEVICES.match(src.text, pos)
    if d:
        if d.group(3):
            listed = np.array(int_tuple(d.group(3).replace(" ", "")))
            if sorted(listed.tolist()) != list(range(total)):
                raise src.error(pos, f"device_ids must be a permutation of 0..{total - 1}")
            devices = listed
        else:
            reshape = int_tuple(d.group(1))
            perm = int_tuple(d.group(2)) if d.group(2) else tuple(range(len(reshape)))
            if prod(reshape) != total or sorted(perm) != list(range(len(reshape))):
                raise src.error(pos, f"device_ids {d.group(0).strip()} do not describe {total} devices")
            devices = np.arange(total).reshape(reshape).transpose(perm).reshape(-1)
        pos = d.end()
    pos = src.expect(pos, "{", "to start the mesh axes of the replica groups")
    refs: list[tuple[int, int | None, int | None]] = []
    while True:
        a = _AXIS_REF.match(src.text, pos)
        name = next((g for g in a.groups()[:3] if g is not None), None) if a else None
        if a is None or name is None or name not in names:
            raise src.error(pos, f"expected a mesh axis ({', '.join(names)}), found {src.found(pos)}")
        axis = names.index(name)
        pre = int(a.group(4)) if a.group(4) else None
        size = int(a.group(5)) if a.group(5) else None
        if size is not None and (pre is None or sizes[axis] % (pre * size)):
            raise src.error(pos, f"sub-axis {a.group(0).strip()} does not divide axis {names[axis]}={sizes[axis]}")
        refs.append((axis, pre, size))
        pos = a.end()
        if src.text.startswith(",", pos):
            pos += 1
            continue
        pos = src.expect(pos, "}", "or ',' after a mesh axis")
        break
    try:
        groups = _mesh_axes_groups(sizes, devices, refs)
    except ValueError as err:
        raise src.error(start, str(err)) from None
    return ReplicaGroups(groups, src.text[start:pos]), pos


def _mesh_axes_groups(
    sizes: list[int], devices: np.ndarray, refs: list[tuple[int, int | None, int | None]]
) -> tuple[tuple[int, ...], ...]:
    """Split each referenced mesh axis at its sub-axes (major to minor: pre-size, size, rest), move the
    grouped pieces, in the order listed, to the minor end, and read one group per row
    (MeshAxesReplicaGroupList::flattened_replica_groups)."""
    by_axis: dict[int, list[tuple[int, int | None, int | None]]] = {}
    for k, (axis, pre, size) in enumerate(refs):
        by_axis.setdefault(axis, []).append((k, pre, size))
    dims: list[int] = []
    grouped = [0] * len(refs)
    for axis, full in enumerate(sizes):
        items = by_axis.get(axis, [])
        if not items or (len(items) == 1 and items[0][1] is None):
            if items:
                grouped[items[0][0]] = len(dims)
            dims.append(full)
            continue
        prefix = 1
        for k, pre, size in sorted(items, key=lambda t: t[1] or 0):
            if pre is None or size is None or pre % prefix:
                raise ValueError(f"the sub-axes of mesh axis {axis} overlap or mix with the whole axis")
            if pre != prefix:
                dims.append(pre // prefix)
                prefix = pre
            grouped[k] = len(dims)
            dims.append(size)
            prefix *= size
        if full % prefix:
            raise ValueError(f"the sub-axes of mesh axis {axis} do not divide its size {full}")
        if prefix != full:
            dims.append(full // prefix)
    rest = [i for i in range(len(dims)) if i not in grouped]
    array = devices.reshape(dims).transpose(rest + grouped)
    group_size = int(np.prod([dims[i] for i in grouped]))
    return tuple(tuple(int(v) for v in row) for row in array.reshape(-1, group_size))


def instruction_mode(instr: Instruction) -> str:
    """The group mode of collective ``instr`` (:func:`tpusim.semantics.groups.group_mode`)."""
    return groups.group_mode(
        instr.opcode, instr.attr("channel_id") is not None, bool(instr.attr("use_global_device_ids"))
    )


def instruction_groups(instr: Instruction, replicas: int, partitions: int) -> list[list[int]]:
    """The device groups collective ``instr`` works in on a run of ``replicas`` x ``partitions`` devices.

    Raises:
        GroupError: a group names an id the run does not have.
    """
    rg = instr.attr("replica_groups")
    listed = rg.groups if isinstance(rg, ReplicaGroups) else ()
    return groups.participant_groups(instruction_mode(instr), listed, replicas, partitions)
