"""An attention's scale applied to its queries, not by OpenVINO to its keys.

OpenVINO's CPU plugin runs a ``ScaledDotProductAttention`` with a ``scale``
input as a fused attention that multiplies the *keys* by the scale and then
transposes them: two passes over every key on every call. With a KV cache
that is every position held, per layer, per token: at position 1000 of
SmolLM2-135M, about 3.4 of 25 ms of a decode step. The queries are one row
per token; scaled there, with the attention's own scale set to 1, the plugin
reads the keys as they are.

``softmax(q k^T * s)`` and ``softmax((q * s) k^T)`` are the same in exact
arithmetic; in floating point the scale is rounded into the queries instead of
into the keys (or the scores), one rounding either way.
"""

from __future__ import annotations

import math

import numpy as np
import openvino as ov
import openvino.opset13 as opset


def scale_queries(model: ov.Model) -> int:
    """Move, in place, each attention's scale onto its queries; how many attentions were changed."""
    changed = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "ScaledDotProductAttention" or node.get_input_size() < 4:
            continue
        queries = node.input_value(0)
        kind = queries.get_element_type()
        if not kind.is_real():
            continue
        if node.get_input_size() >= 5:
            scale = node.input_value(4)
            if _is_one(scale):
                continue
            factor = scale if scale.get_element_type() == kind else opset.convert(scale, kind).output(0)
        else:  # the default scale, 1 / sqrt(head size), needs the head size
            width = queries.get_partial_shape()[queries.get_partial_shape().rank.get_length() - 1]
            if width.is_dynamic:
                continue
            factor = opset.convert(opset.constant(np.float32(1 / math.sqrt(width.get_length()))), kind).output(0)
        one = opset.convert(opset.constant(np.float32(1.0)), kind).output(0)
        causal = bool(node.get_attributes().get("causal", False))
        inputs = [opset.multiply(queries, factor).output(0), *(node.input_value(i) for i in (1, 2, 3))]
        scaled = opset.scaled_dot_product_attention(*inputs, one, causal=causal)
        scaled.set_friendly_name(node.get_friendly_name())
        node.output(0).replace(scaled.output(0))
        changed += 1
    if changed:
        model.validate_nodes_and_infer_types()
    return changed


def _is_one(value: ov.Output) -> bool:
    node = value.get_node()
    while node.get_type_name() == "Convert":
        node = node.input_value(0).get_node()
    return node.get_type_name() == "Constant" and bool(np.all(node.get_data() == 1))


# Ops through which a query is a linear function of the projection's output: the value a scale
# multiplies is moved through them. ``_LINEAR_IN_DATA`` move or pick elements of their first
# input (the others are indices, shapes, axes); ``Concat``, ``Add`` and ``Subtract`` need every
# input linear; a ``Multiply`` or ``Divide`` one factor (the dividend), the other not depending on it.
_LINEAR_IN_DATA = {
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "StridedSlice",
    "Slice",
    "Gather",
    "Split",
    "VariadicSplit",
    "Broadcast",
    "Tile",
    "Negative",
}
_VIEWS = {"Reshape", "Transpose", "Squeeze", "Unsqueeze"}
_ANCESTOR_BUDGET = 64


def hoist_query_scales(model: ov.Model) -> int:
    """Move, in place, each attention's query scale (``q * s``, ``s`` one constant) back onto the
    projection the query comes from, where OpenVINO's CPU plugin applies it inside its matmul; how
    many scales were moved.

    Between the projection and the attention, a query goes through a reshape into heads, rotary
    embeddings (``x * cos + rotate_half(x) * sin``) and a transpose: every op there is linear in the
    projection's output ``p``, so ``f(p) * s == f(p * s)``. ``p * s`` is a post-op of the matmul
    computing ``p``, not an op of its own on every call. A scale that is a power of two (``1 / 8``
    for heads of 64 or 256) moves exactly: multiplying by it rounds nothing. Any other scale moves
    one rounding from after the rotary embedding to the matmul's output, where the plugin still
    holds it in f32.

    Moved only when every value on the way is read by nothing but the way itself (a rotated key,
    say, also written to a cache, keeps its scale where it is).
    """
    moved = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "ScaledDotProductAttention":
            continue
        query = node.input_value(0).get_node()
        # The scales on the query's own chain (views of it, products of it with constants: with
        # PyTorch's decomposed attention, the root of its scale; the attention's own joins it) each
        # scale all of it: their product, applied once at the projection, replaces them.
        products, scale, link = [], 1.0, query
        while True:
            if (split := _scalar_product(link)) is not None:
                products.append(link)
                scale *= split[1]
                parent = split[0]
            elif link.get_type_name() in _VIEWS:
                parent = link.input_value(0)
            else:
                break
            if len(parent.get_target_inputs()) != 1:
                break
            link = parent.get_node()
        if not products:
            continue
        source = _projection(query, node)
        if source is None:
            continue
        factor = opset.constant(np.array(scale, dtype=source.get_element_type().to_dtype()))
        readers = list(source.get_target_inputs())
        product = opset.multiply(source, factor)
        for reader in readers:
            reader.replace_source_output(product.output(0))
        for link in products:
            (kept,) = [v for v in link.input_values() if _constant_value(v) is None]
            link.output(0).replace(kept)
        moved += 1
    if moved:
        model.validate_nodes_and_infer_types()
    return moved


def _scalar_product(node: ov.Node) -> tuple[ov.Output, float] | None:
    """``(x, s)`` when ``node`` is ``x * s`` of real values, ``s`` a one-element constant."""
    if node.get_type_name() != "Multiply" or not node.get_output_element_type(0).is_real():
        return None
    for index in (0, 1):
        value = _constant_value(node.input_value(1 - index))
        if value is not None and value.size == 1:
            return node.input_value(index), float(value.reshape(()))
    return None


def _constant_value(value: ov.Output) -> np.ndarray | None:
    node = value.get_node()
    while node.get_type_name() == "Convert":
        node = node.input_value(0).get_node()
    return node.get_data() if node.get_type_name() == "Constant" else None


def _projection(query: ov.Node, attention: ov.Node) -> ov.Output | None:
    """The output of the matmul (with its bias, if any) of which ``query`` is a linear function
    read by nothing else on the way, nearest first; None if there is none."""
    ancestors: list[ov.Node] = []
    seen = {query.get_instance_id()}
    frontier = [query]
    while frontier and len(ancestors) < _ANCESTOR_BUDGET:
        node = frontier.pop(0)
        ancestors.append(node)
        for value in node.input_values():
            parent = value.get_node()
            if parent.get_instance_id() not in seen and parent.get_type_name() not in ("Constant", "Parameter"):
                seen.add(parent.get_instance_id())
                frontier.append(parent)
    for node in ancestors:
        if node.get_type_name() != "MatMul":
            continue
        source = node.output(0)
        readers = list(source.get_target_inputs())
        if len(readers) == 1:  # a bias added to the matmul is part of the projection
            reader = readers[0].get_node()
            other = reader.input_value(1 - readers[0].get_index()) if reader.get_input_size() == 2 else None
            if reader.get_type_name() == "Add" and other is not None and _constant_value(other) is not None:
                source = reader.output(0)
        if _linear_between(source, query, ancestors, attention):
            return source
    return None


def _linear_between(source: ov.Output, query: ov.Node, ancestors: list[ov.Node], attention: ov.Node) -> bool:
    """Every value from ``source`` to ``query`` is linear in ``source`` and read only on the way
    (``query`` by ``attention``)."""
    start = source.get_node().get_instance_id()
    known = {node.get_instance_id() for node in ancestors}
    if start not in known:
        return False
    region = {start}
    grown = True
    while grown:  # the ancestors reading the region join it
        grown = False
        for node in ancestors:
            ident = node.get_instance_id()
            if ident not in region and any(v.get_node().get_instance_id() in region for v in node.input_values()):
                region.add(ident)
                grown = True
    if query.get_instance_id() not in region:
        return False
    for node in ancestors:
        ident = node.get_instance_id()
        if ident not in region:
            continue
        readers = [reader for out in node.outputs() for reader in out.get_target_inputs()]
        if not all(_reads_only_within(reader, region, attention) for reader in readers):
            return False
        if ident == start:
            continue
        if not all(out.get_element_type().is_real() for out in node.outputs()):
            return False
        inside = [value.get_node().get_instance_id() in region for value in node.input_values()]
        kind = node.get_type_name()
        if kind in _LINEAR_IN_DATA:
            ok = inside[0] and not any(inside[1:])
        elif kind in ("Concat", "Add", "Subtract"):
            ok = all(inside)
        elif kind == "Multiply":
            ok = sum(inside) == 1
        elif kind == "Divide":
            ok = inside == [True, False]
        elif kind == "Convert":
            ok = node.input_value(0).get_element_type().is_real()
        else:
            ok = False
        if not ok:
            return False
    return True


def _reads_only_within(reader: ov.Input, region: set[int], attention: ov.Node) -> bool:
    """``reader`` is on the way, the attention, or reads only a shape or a type (which no scale
    changes)."""
    node = reader.get_node()
    ident = node.get_instance_id()
    if ident in region or ident == attention.get_instance_id():
        return True
    return node.get_type_name() == "ShapeOf" or (node.get_type_name() == "ConvertLike" and reader.get_index() == 1)
