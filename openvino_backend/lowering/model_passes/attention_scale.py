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
    data = _constant_value(value)
    return data is not None and bool(np.all(data == 1))


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
    """Move, in place, each attention's query scale (``q * s``, ``s`` one constant) back into the
    constants of the projection the query comes from; how many scales were moved.

    Between the projection and the attention, a query goes through a reshape into heads, rotary
    embeddings (``x * cos + rotate_half(x) * sin``) and a transpose: every op there is linear in the
    projection's output ``p = x W^T + b``, so ``f(p) * s == f(x (s W)^T + s b)``. The scale goes
    into the projection's constants: its weights (for compressed weights, their dequantization
    scales, so they stay compressed) and its bias. Not an op on every call, not even a post-op: the
    CPU plugin folds a scalar multiply after a matmul into its weights, decompressing them.

    A scale that is a power of two (``1 / 8`` for heads of 64 or 256) moves exactly: multiplying by
    it rounds nothing. Any other moves one rounding of each query value (in the inference precision,
    bf16 where the CPU computes in bf16) to one f32 rounding of each weight or dequantization scale;
    a constant stored narrower than f32 takes a power of two only.

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
        scale = _snapped(scale)
        source = _projection(query, node)
        folds = None if source is None else _foldable_constants(source.get_node(), scale)
        if folds is None:
            continue
        for reader, value in folds:
            scaled = (value.astype(np.float64) * scale).astype(value.dtype)
            reader.replace_source_output(opset.constant(scaled).output(0))
        for link in products:
            (kept,) = [v for v in link.input_values() if _constant_value(v) is None]
            link.output(0).replace(kept)
        moved += 1
    if moved:
        model.validate_nodes_and_infer_types()
    return moved


def _snapped(scale: float) -> float:
    """``scale``, or the power of two it is within a few f32 roundings of: PyTorch's decomposed
    attention scales the query by the root of its scale, rounded to f32, and the attention's own
    scale is the same root; their product is ``1/8`` for heads of 64 but for those roundings."""
    power = 2.0 ** round(math.log2(abs(scale))) if scale else 0.0
    return math.copysign(power, scale) if power and abs(abs(scale) / power - 1) <= 2.0**-21 else scale


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
    """The data of the constant ``value`` is, through converts; None if it is computed."""
    node = value.get_node()
    while node.get_type_name() == "Convert":
        node = node.input_value(0).get_node()
    return node.get_data() if node.get_type_name() == "Constant" else None


def _foldable_constants(source: ov.Node, scale: float) -> list[tuple[ov.Input, np.ndarray]] | None:
    """The constants of the projection ``source`` (a matmul, or a bias added to one) that ``scale``
    can be multiplied into, each with the input reading it; None if one is missing or shared."""
    folds = []
    matmul = source
    if source.get_type_name() == "Add":
        index = 0 if source.input_value(0).get_node().get_type_name() == "MatMul" else 1
        if (bias := _scalable(source.input(1 - index), scale)) is None:
            return None
        folds.append(bias)
        matmul = source.input_value(index).get_node()
    constant = [i for i in (0, 1) if _weights(matmul, i)]
    if len(constant) != 1:
        return None
    reader = matmul.input(constant[0])
    wide = True  # every value on the way in f32 or wider: a scale that rounds is rounded once, in f32
    while True:  # down views and converts of the weights to the constant, or the scale dequantizing them
        node = reader.get_source_output().get_node()
        if len(reader.get_source_output().get_target_inputs()) != 1:
            return None
        wide = wide and reader.get_element_type() in (ov.Type.f32, ov.Type.f64)
        real_convert = node.get_type_name() == "Convert" and node.input_value(0).get_element_type().is_real()
        if node.get_type_name() in _VIEWS or real_convert:
            reader = node.input(0)
            continue
        if node.get_type_name() == "Multiply":  # the integers' scale, the smaller real constant
            held = [
                (value.size, i)
                for i in (0, 1)
                if (value := _constant_value(node.input_value(i))) is not None and value.dtype.kind == "f"
            ]
            if not held:
                return None
            reader = node.input(min(held)[1])
        fold = _scalable(reader, scale, wide=wide)
        return None if fold is None else [*folds, fold]


def _weights(matmul: ov.Node, index: int) -> bool:
    """``matmul``'s input ``index`` is a constant or computed from constants alone (compressed
    weights)."""
    pending, seen = [matmul.input_value(index).get_node()], set()
    while pending:
        node = pending.pop()
        if node.get_type_name() == "Parameter" or len(seen) > 16:
            return False
        seen.add(node.get_instance_id())
        pending += [v.get_node() for v in node.input_values() if v.get_node().get_instance_id() not in seen]
    return True


def _scalable(reader: ov.Input, scale: float, *, wide: bool = True) -> tuple[ov.Input, np.ndarray] | None:
    """``reader``'s constant, when ``scale`` can be multiplied into it: a real constant read only
    there (through converts), in f32 (or f16, or read through a value narrower than f32 (not
    ``wide``), when ``scale`` is a power of two and so rounds nothing)."""
    value = reader.get_source_output()
    node = value.get_node()
    while node.get_type_name() == "Convert" and len(value.get_target_inputs()) == 1:
        reader = node.input(0)
        value = reader.get_source_output()
        node = value.get_node()
    if node.get_type_name() != "Constant" or len(value.get_target_inputs()) != 1:
        return None
    data = node.get_data()
    exact = math.frexp(scale)[0] == 0.5
    if not exact and not (wide and data.dtype in (np.float32, np.float64)):
        return None
    if data.dtype not in (np.float16, np.float32, np.float64):
        return None
    return reader, data


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
