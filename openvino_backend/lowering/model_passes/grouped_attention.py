"""Grouped-query attention without its keys and values repeated per query head.

A model with fewer key/value heads than query heads repeats each key and value
head for its group of query heads before the attention (``repeat_interleave``,
or ``unsqueeze`` -> ``expand`` -> ``reshape``); OpenVINO's attention takes as
many key as query heads, so the frontend's graph copies the whole key and value
(with a KV cache: the whole cache read) ``r`` times on every call.

The same attention, without the copy: each key/value head ``k`` serves query
heads ``k*r .. k*r + r - 1``, so the query ``[B, H, L, D]`` read as
``[B, Hk, r*L, D]`` (a reshape: heads are outer to positions) puts the ``r``
query heads of group ``k`` one after another as ``r*L`` query rows against key
head ``k``. Row ``g*L + l`` is query head ``k*r + g`` at position ``l``: it
needs the mask's row ``l``, so the mask is repeated ``r`` times along its rows
(once for all the layers that share it). Every row's
scores, softmax and weighted sum are the ones the repeated form computes, and
the result read back as ``[B, H, L, D]`` is the same tensor.

Rewritten only when both key and value are such a repetition of the same
``Hk`` heads by the same ``r``, with static head counts, and the mask has no
per-head dim (a causal attention, whose mask is built from the row index, is
left as it is).
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as opset

from openvino_backend.lowering.edge_layout import int_constant


def ungroup_attention(model: ov.Model) -> int:
    """Rewrite, in place, each attention reading repeated key/value heads to read them once; how
    many were rewritten."""
    rewritten = 0
    masks: dict[tuple[ov.Output, int], ov.Output] = {}  # layers sharing a mask share its grouped form
    for node in model.get_ordered_ops():
        if node.get_type_name() != "ScaledDotProductAttention" or node.get_attributes().get("causal", False):
            continue
        key, value = _repeated_heads(node.input_value(1)), _repeated_heads(node.input_value(2))
        if key is None or value is None or key[1:] != value[1:]:
            continue
        (keys, heads, group), values = key, value[0]
        query = node.input_value(0)
        shape = query.get_partial_shape()
        if shape.rank.is_dynamic or shape.rank.get_length() != 4 or shape[1] != ov.Dimension(heads * group):
            continue
        inputs = [opset.reshape(query, int_constant([0, heads, -1, 0]), special_zero=True).output(0), keys, values]
        if node.get_input_size() > 3:
            source = node.input_value(3)
            known = (source, group)
            mask = masks.get(known) if known in masks else _rows_per_group(source, group)
            if mask is None:
                continue
            masks[known] = mask
            inputs.append(mask)
        inputs += [node.input_value(i) for i in range(4, node.get_input_size())]
        attention = opset.scaled_dot_product_attention(*inputs, causal=False)
        attention.set_friendly_name(node.get_friendly_name())
        result = opset.reshape(attention, int_constant([0, heads * group, -1, 0]), special_zero=True)
        node.output(0).replace(result.output(0))
        rewritten += 1
    if rewritten:
        model.validate_nodes_and_infer_types()
    return rewritten


def _repeated_heads(value: ov.Output) -> tuple[ov.Output, int, int] | None:
    """``(x, Hk, r)`` when ``value`` is ``x [B, Hk, L, D]`` with each head repeated ``r`` times in
    place (``Reshape(Broadcast(Unsqueeze(x, 2)))`` to ``[B, Hk*r, L, D]``), else None."""
    reshape = value.get_node()
    if reshape.get_type_name() != "Reshape":
        return None
    broadcast = reshape.input_value(0).get_node()
    if broadcast.get_type_name() != "Broadcast":
        return None
    unsqueeze = broadcast.input_value(0).get_node()
    if unsqueeze.get_type_name() != "Unsqueeze":
        return None
    axes = unsqueeze.input_value(1).get_node()
    if axes.get_type_name() != "Constant" or [int(a) % 5 for a in np.atleast_1d(axes.get_data())] != [2]:
        return None
    source = unsqueeze.input_value(0)
    before, after = source.get_partial_shape(), broadcast.get_output_partial_shape(0)
    out = reshape.get_output_partial_shape(0)
    if before.is_dynamic or after.is_dynamic or out.is_dynamic or before.rank.get_length() != 4:
        return None
    (b, heads, length, width), repeated, merged = before.to_shape(), after.to_shape(), out.to_shape()
    group = repeated[2]
    if list(repeated) != [b, heads, group, length, width] or list(merged) != [b, heads * group, length, width]:
        return None
    return (source, heads, group) if group > 1 else None


def _rows_per_group(mask: ov.Output, group: int) -> ov.Output | None:
    """The additive or boolean ``mask`` of an attention over ``[B, H, L, D]`` queries as the mask of
    the grouped attention over ``[B, Hk, group*L, D]``: its rows repeated ``group`` times. None if
    the mask differs per head.

    A mask with one row for all queries broadcasts over the grouped rows as it did over the others.
    A mask whose row count is only known at run time has ``L`` rows, or one row when ``L`` is 1; if
    it had one row for more queries, the grouped attention's rows would not match and OpenVINO would
    refuse the call: an error, never a value computed with the wrong mask row."""
    shape = mask.get_partial_shape()
    if shape.rank.is_dynamic:
        return None
    rank = shape.rank.get_length()
    if rank >= 3 and shape[rank - 3] != ov.Dimension(1):
        return None  # a mask per head (or one whose head dim is unknown)
    if rank < 2 or shape[rank - 2] == ov.Dimension(1):
        return mask
    repeats = [1] * rank
    repeats[rank - 2] = group
    return opset.tile(mask, int_constant(repeats)).output(0)
