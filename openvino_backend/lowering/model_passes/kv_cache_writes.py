"""Finding a KV cache in a converted model: what ``kv_cache.py`` rewrites.

A cache is an OpenVINO variable (``lowering/state.py``) longer than one block,
written along one axis (``CacheWrite``: a ``ScatterUpdate`` along the axis, or
the frontend's ``index_put`` along it, two whole transposes around a
``ScatterNDUpdate``) and read only by attention, as its key or value, through
views that keep its positions along one axis (``view_axis``). Which of the
partition's ``index_put`` writes give values that fill the positions they write
is read from the FX graph, where torch.export's sizes show it (``exact_writes``).
The rewrite is ``kv_cache.py``'s: the only ops built here read a write found in
the frontend's form as a write along its axis (its positions flattened, its
values in the cache's layout).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import openvino as ov
import openvino.opset13 as opset
import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from openvino_backend.lowering.edge_layout import int_constant
from openvino_backend.lowering.passes.common import EDGE, same_shape

# Lengths come in whole blocks of positions: OpenVINO's CPU plugin prepares its kernels anew for each
# new shape, and a length growing by one each token would make every call a new shape.
BLOCK = 128
# Ops a cache may pass through on its way to the attention, each keeping its positions along one axis.
VIEWS = frozenset({"Unsqueeze", "Broadcast", "Reshape", "Transpose", "Convert"})


@dataclass
class CacheWrite:
    """A variable written along ``axis`` at ``indices`` with ``updates``; ``written`` is its new value."""

    read: ov.Node
    sink: ov.Node
    axis: int
    indices: ov.Output
    updates: ov.Output
    written: ov.Output
    attentions: list[tuple[ov.Node, int]] = field(default_factory=list)  # (SDPA, input 1 or 2) reached


def exact_writes(graph_module: torch.fx.GraphModule) -> frozenset[str]:
    """The ``index_put`` nodes of ``graph_module`` whose values have the shape of the region they
    write, leading ones aside (one index tensor, its length the values' size along its axis), as torch.export's
    symbolic sizes prove: for those, the frontend's broadcast of the values to the index count
    copies them unchanged. A prompt's keys written at its positions are such a write: both sizes
    are the prompt's length, which the converted graph alone cannot show."""
    exact = set()
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node.target not in (EDGE.index_put.default, torch.ops.aten.index_put.default):
            continue
        if len(node.args) < 3:
            continue
        cache, indices, values = node.args[:3]
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        present = [(axis, index) for axis, index in enumerate(indices) if index is not None]
        if accumulate or len(present) != 1 or not all(isinstance(n, torch.fx.Node) for n in (cache, values)):
            continue
        axis, index = present[0]
        shapes = [getattr(n.meta.get("val"), "shape", None) for n in (cache, index, values)]
        if any(shape is None for shape in shapes) or len(shapes[1]) != 1:
            continue
        if index.meta["val"].dtype in (torch.bool, torch.uint8):
            continue  # a mask selects as many positions as it holds True, not its length
        region = (*shapes[0][:axis], shapes[1][0], *shapes[0][axis + 1 :])
        extra = len(region) - len(shapes[2])  # values broadcast as NumPy does: aligned to the right
        ones = all(statically_known_true(size == 1) for size in region[: max(extra, 0)])
        if extra >= 0 and ones and same_shape(tuple(shapes[2]), region[extra:]):
            exact.add(node.name)
    return frozenset(exact)


def cache_write(read: ov.Node, sinks: dict[str, ov.Node], exact: frozenset[str]) -> CacheWrite | None:
    """``read``'s variable as a cache written along one axis and read by attention only, or None."""
    sink = sinks.get(read.get_variable_id())
    readers = list(read.output(0).get_target_inputs())
    if sink is None or len(readers) != 1 or readers[0].get_index() != 0:
        return None
    write = readers[0].get_node()
    shape = read.get_output_partial_shape(0)
    if shape.is_dynamic:
        return None
    if write.get_type_name() == "ScatterUpdate":
        axis = constant_value(write.input_value(3))
        if axis is None:
            return None
        axis = int(axis) % shape.rank.get_length()
        cache = CacheWrite(read, sink, axis, write.input_value(1), write.input_value(2), write.output(0))
    else:
        cache = transposed_scatter(read, sink, write, exact)
        if cache is None:
            return None
    if shape.to_shape()[cache.axis] <= BLOCK:
        return None  # one block: read whole either way
    if cache.indices.get_partial_shape().rank.get_length() != 1 or sink.input_value(0) != cache.written:
        return None  # several positions per row, or the variable's new value is not the write's
    readers = [r for r in cache.written.get_target_inputs() if r.get_node().get_type_name() != "Assign"]
    if not readers or not all(_reaches_attention(r, cache.axis, cache.attentions) for r in readers):
        return None
    return cache


def transposed_scatter(read: ov.Node, sink: ov.Node, inner: ov.Node, exact: frozenset[str]) -> CacheWrite | None:
    """The frontend's ``index_put`` along axis ``a``: ``Transpose(P)`` bringing ``a`` first,
    ``ScatterNDUpdate`` of whole slices, ``Transpose(P^-1)``; as a write along ``a``. The values of
    a write in ``exact`` are taken as the model gives them, before the frontend transposes them
    and broadcasts them to the index count (a no-op there), and its positions before they become
    ``[N, 1]``."""
    order = _permutation(inner)
    readers = list(inner.output(0).get_target_inputs())
    if order is None or len(readers) != 1 or readers[0].get_index() != 0:
        return None
    scatter = readers[0].get_node()
    indices = scatter.input_value(1).get_partial_shape()
    if (
        scatter.get_type_name() != "ScatterNDUpdate"
        or indices.rank.is_dynamic
        or indices.rank.get_length() != 2
        or indices[1] != ov.Dimension(1)
    ):
        return None
    outer = list(scatter.output(0).get_target_inputs())
    if len(outer) != 1 or _permutation(outer[0].get_node()) != sorted(range(len(order)), key=order.__getitem__):
        return None
    axis, rest = order[0], order[1:]
    written = outer[0].get_node().output(0)
    given = _given_values(scatter, order, exact)
    if given is not None:
        return CacheWrite(read, sink, axis, *given, written)
    # The updates come as [N, *the other axes in P's order]; put N at `axis`, the others in order.
    to_natural = [0 if dim == axis else 1 + rest.index(dim) for dim in range(len(order))]
    updates = opset.transpose(scatter.input_value(2), int_constant(to_natural)).output(0)
    indices = opset.reshape(scatter.input_value(1), int_constant([-1]), special_zero=False).output(0)
    return CacheWrite(read, sink, axis, indices, updates, written)


def _given_values(scatter: ov.Node, order: list[int], exact: frozenset[str]) -> tuple[ov.Output, ov.Output] | None:
    """The positions (1-D) and values (in the cache's layout and type) of the frontend's
    ``index_put`` scatter, read before it reshapes, transposes and broadcasts them: when the
    ``index_put`` is in ``exact`` and its ops are the frontend's (``[Convert] <- Broadcast <-
    Transpose(order)`` for the values, ``Unsqueeze`` of a 1-D tensor for the positions)."""
    updates = scatter.input_value(2).get_node()
    converted = updates.get_type_name() == "Convert"
    broadcast = updates.input_value(0).get_node() if converted else updates
    transpose = broadcast.input_value(0).get_node() if broadcast.get_type_name() == "Broadcast" else None
    unsqueeze = scatter.input_value(1).get_node()
    if (
        transpose is None
        or broadcast.get_friendly_name().split("/")[0] not in exact
        or _permutation(transpose) != order
        or unsqueeze.get_type_name() != "Unsqueeze"
        or unsqueeze.get_input_partial_shape(0).rank != ov.Dimension(1)
    ):
        return None
    values = transpose.input_value(0)
    if values.get_element_type() != scatter.get_output_element_type(0):
        values = opset.convert(values, scatter.get_output_element_type(0)).output(0)
    return unsqueeze.input_value(0), values


def _reaches_attention(reader: ov.Input, axis: int, found: list[tuple[ov.Node, int]]) -> bool:
    """Whether ``reader`` (of a tensor whose positions lie along ``axis``) passes them through views
    to an attention's key or value, positions along its keys' axis; each attention reached is added
    to ``found``."""
    node, index = reader.get_node(), reader.get_index()
    kind = node.get_type_name()
    if kind == "ScaledDotProductAttention":
        rank = node.get_input_partial_shape(index).rank.get_length()
        if index in (1, 2) and axis == rank - 2:
            found.append((node, index))
            return True
        return False
    next_axis = view_axis(node, axis) if kind in VIEWS and index == 0 else None
    if next_axis is None:
        return False
    readers = list(node.output(0).get_target_inputs())
    return bool(readers) and all(_reaches_attention(r, next_axis, found) for r in readers)


def view_axis(node: ov.Node, axis: int) -> int | None:
    """Where the positions along input ``axis`` of the view ``node`` lie in its output, or None
    when ``node`` mixes them with another axis (or its shapes are not static)."""
    kind = node.get_type_name()
    source = node.get_input_partial_shape(0)
    target = node.get_output_partial_shape(0)
    if source.is_dynamic or target.is_dynamic:
        return None
    source, target = source.to_shape(), target.to_shape()
    if kind == "Convert":
        return axis
    if kind == "Transpose":
        order = _permutation(node)
        return order.index(axis) if order is not None else None
    if kind == "Unsqueeze":
        axes = constant_value(node.input_value(1))
        if axes is None:
            return None
        inserted = {int(a) % len(target) for a in np.atleast_1d(axes)}
        kept = [i for i in range(len(target)) if i not in inserted]
        return kept[axis]
    if kind == "Broadcast":
        mode = node.get_attributes().get("mode")
        if mode not in ("numpy", "bidirectional") or constant_value(node.input_value(1)) is None:
            return None
        moved = axis + len(target) - len(source)
        return moved if target[moved] == source[axis] else None
    if kind == "Reshape":
        if constant_value(node.input_value(1)) is None or 0 in target:
            return None
        before = math.prod(source[:axis])
        for out_axis in range(len(target)):
            if math.prod(target[:out_axis]) == before and target[out_axis] == source[axis]:
                return out_axis
        return None
    return None


def maskable(attention: ov.Node) -> bool:
    """An attention with an additive float mask over its keys, not causal by attribute."""
    if attention.get_input_size() < 4 or attention.get_attributes().get("causal", False):
        return False
    mask = attention.get_input_partial_shape(3)
    keys = attention.get_input_partial_shape(1)
    return (
        attention.get_input_element_type(3).is_real()
        and mask.rank.is_static
        and keys.rank.is_static
        and mask[mask.rank.get_length() - 1].is_static
        and mask[mask.rank.get_length() - 1] == keys[keys.rank.get_length() - 2]
    )


def _permutation(node: ov.Node) -> list[int] | None:
    """The constant order of a Transpose, or None."""
    if node.get_type_name() != "Transpose":
        return None
    order = constant_value(node.input_value(1))
    return [int(v) for v in np.atleast_1d(order)] if order is not None else None


def constant_value(output: ov.Output) -> np.ndarray | None:
    """The value of ``output`` when it is computed from constants alone (a few ops deep), else None."""
    node = output.get_node()
    if node.get_type_name() == "Constant":
        return node.get_data()
    if node.get_type_name() in ("Parameter", "ReadValue") or node.get_input_size() == 0 or node.get_output_size() != 1:
        return None
    inputs = [constant_value(node.input_value(i)) for i in range(node.get_input_size())]
    if any(value is None for value in inputs):
        return None
    result = [ov.Tensor(node.get_output_element_type(0), node.get_output_partial_shape(0).to_shape())]
    if node.get_output_partial_shape(0).is_dynamic or not node.evaluate(result, [ov.Tensor(v) for v in inputs]):
        return None
    return result[0].data.copy()
