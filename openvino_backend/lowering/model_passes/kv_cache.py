"""A KV cache kept as long as what was written to it, and attended over as far as the mask reaches.

A model with a KV cache holds it at its full context length and writes each
call's keys and values into it at their positions (``index_put``, ``index_copy_``);
its attention then reads the whole cache, masked. Kept as an OpenVINO variable
at that length (``lowering/state.py``), every call moves the whole cache (the variable
is copied as it is assigned) and attends over all of it, however few positions
hold tokens: decode at a context of 2048 cost twice decode at 128.

The frontend writes ``index_put`` along an axis other than the first by
transposing the whole cache, scattering whole slices and transposing back:
``grow_caches`` first makes each such write a ``ScatterUpdate`` along the axis,
which moves only the rows written (and, where torch.export's sizes show the
values fill the positions written, takes them as the model gives them,
without the frontend's broadcast to the index count: ``exact_writes``). Then it rewrites each cache longer than one
block that is written along one axis and read only by attention (through
views: unsqueeze, broadcast, reshape, transpose, convert), as its key or
value, with an additive mask:

* the variable starts empty and holds the positions ``[0, L)`` written so far;
  a call appends, from the cache's exported value, the positions it writes
  past ``L`` (or the mask reaches past it), then writes its rows;
* the attention reads positions ``[0, n)``, ``n`` the last position the mask
  leaves unmasked in any row, plus one; the mask is cut to the same ``n``.
  When its key and value caches hold the same positions (below), it reads
  all ``L`` they hold instead, and the mask is cut to ``L``: positions past
  ``n`` are masked in every row either way, and the caches are not copied
  once more to cut them.

Caches of one shape written at the same positions (each layer's, computed by
ops of its own from the same inputs: compared by what they compute) and read
as far as the same reach start empty and grow alike, call after call: one
reading of how many positions they hold, one end, and one set of appended
rows serve them all.

Exact, whatever positions each call writes (a prompt prefilled again from 0, a
gap): positions past ``L`` read as the cache's exported value, as they were,
and a position past ``n`` carries ``-inf`` in every row of the mask, so it
adds exactly nothing to any row's softmax. A cache read any other way keeps
its full length. Which variables are such caches, and which writes are exact,
is found by ``kv_cache_writes.py``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np
import openvino as ov
import openvino.opset3 as opset3
import openvino.opset13 as opset
from openvino.op import assign, util

from openvino_backend.lowering.edge_layout import int_constant
from openvino_backend.lowering.model_passes.kv_cache_writes import (
    BLOCK,
    CacheWrite,
    cache_write,
    constant_value,
    maskable,
    transposed_scatter,
    view_axis,
)

logger = logging.getLogger(__name__)


def grow_caches(model: ov.Model, exact: frozenset[str] = frozenset()) -> int:
    """Rewrite the caches of ``model`` (in place) as the module says; the number of attentions
    rewritten. ``exact`` names the writes whose values need no broadcast (``exact_writes``)."""
    sinks = {sink.get_variable_id(): sink for sink in model.get_sinks() if sink.get_type_name() == "Assign"}
    _freeze_static_shapes(model)
    _scatter_along_axis(model, sinks, exact)
    caches = [
        cache
        for read in model.get_ordered_ops()
        if read.get_type_name() == "ReadValue" and (cache := cache_write(read, sinks, exact)) is not None
    ]
    by_attention: dict[str, list[CacheWrite]] = {}
    attention_nodes: dict[str, ov.Node] = {}
    for cache in caches:
        if len({node.get_friendly_name() for node, _ in cache.attentions}) != 1:
            continue  # read by several attentions (or none): kept whole
        node = cache.attentions[0][0]
        by_attention.setdefault(node.get_friendly_name(), []).append(cache)
        attention_nodes[node.get_friendly_name()] = node
    rewritten = 0
    shared = _Shared()
    for name, found in by_attention.items():
        attention = attention_nodes[name]
        if {index for cache in found for _, index in cache.attentions} != {1, 2} or not maskable(attention):
            continue  # the key or the value comes from elsewhere, at full length
        _rewrite(model, attention, found, shared)
        rewritten += 1
    if rewritten:
        model.validate_nodes_and_infer_types()
        logger.debug("%d attentions read their KV cache as far as their mask reaches", rewritten)
    return rewritten


def _scatter_along_axis(model: ov.Model, sinks: dict[str, ov.Node], exact: frozenset[str]) -> None:
    """Each variable written as the frontend writes ``index_put`` along an axis other than the first
    (the whole variable transposed to bring the axis first, whole slices scattered, transposed back)
    is written along that axis in place: a ``ScatterUpdate`` of the same rows, which moves only
    them. Two transposes of the whole cache on every call, whatever its length, are gone."""
    rewritten = 0
    for read in model.get_ordered_ops():
        readers = list(read.output(0).get_target_inputs()) if read.get_type_name() == "ReadValue" else []
        sink = sinks.get(read.get_variable_id()) if readers else None
        if sink is None or len(readers) != 1 or readers[0].get_index() != 0:
            continue
        cache = transposed_scatter(read, sink, readers[0].get_node(), exact)
        if cache is None:
            continue
        axis = opset.constant(np.array(cache.axis, dtype=np.int64))
        written = opset3.scatter_update(read.output(0), cache.indices, cache.updates, axis)
        for reader in list(cache.written.get_target_inputs()):
            reader.replace_source_output(written.output(0))
        rewritten += 1
    if rewritten:
        model.validate_nodes_and_infer_types()
        logger.debug("%d variable(s) written along their axis in place of a transposed scatter", rewritten)


def _freeze_static_shapes(model: ov.Model) -> None:
    """Replace each ``ShapeOf`` of a tensor whose shape is static by that shape, a constant, and
    each ``ConvertLike`` by a ``Convert`` to the type it reads (the frontend reads a cache's shape to
    normalize negative positions, and its type for the rows written: readers of the cache's type or
    shape only, which would otherwise hold it at its full length)."""
    for node in model.get_ordered_ops():
        if node.get_type_name() == "ConvertLike":
            converted = opset.convert(node.input_value(0), node.get_input_element_type(1))
            for reader in list(node.output(0).get_target_inputs()):
                reader.replace_source_output(converted.output(0))
            continue
        if node.get_type_name() != "ShapeOf" or node.get_input_partial_shape(0).is_dynamic:
            continue
        shape = np.array(node.get_input_partial_shape(0).to_shape(), dtype=node.get_output_element_type(0).to_dtype())
        for reader in list(node.output(0).get_target_inputs()):
            reader.replace_source_output(opset.constant(shape).output(0))


@dataclass
class _Growth:
    """What caches that always hold the same positions share: how many they hold (read from the
    first one's variable), up to where this call grows them, and the rows appended to those
    exported as one value (by that value's type and bits)."""

    held: ov.Output
    end: ov.Output
    rows: dict[tuple[str, bytes], ov.Output] = field(default_factory=dict)
    length: ov.Output = field(init=False)  # ``[L]``: how many positions they hold after this call's growth

    def __post_init__(self) -> None:
        self.length = opset.maximum(self.held, self.end).output(0)


@dataclass
class _Shared:
    """The growth of every cache rewritten in one model, so that what caches have in common is
    computed once: each mask's reach, and the growth of caches of one shape written at the same
    positions and read as far as the same reach. All start empty and grow alike, call after call,
    so they hold the same positions throughout; one set of shape arithmetic serves them all instead
    of a dozen ops per cache on every call."""

    reaches: dict[object, ov.Output] = field(default_factory=dict)
    growths: dict[tuple, _Growth] = field(default_factory=dict)
    signatures: dict[tuple[int, int], tuple | None] = field(default_factory=dict)

    def reach(self, mask: ov.Output) -> ov.Output:
        """``_mask_reach(mask)``, once for masks that compute the same (each layer's may be its own
        ops reading the same inputs)."""
        key = self.signature(mask) or mask
        if key not in self.reaches:
            self.reaches[key] = _mask_reach(mask)
        return self.reaches[key]

    def signature(self, output: ov.Output) -> tuple | None:
        return _signature(output, self.signatures)


def _rewrite(model: ov.Model, attention: ov.Node, caches: list[CacheWrite], shared: _Shared) -> None:
    """Grow ``attention``'s caches and read them as far as its mask reaches. When they all share one
    growth (hold the same positions), the attention reads all they hold and the mask is cut there
    instead: positions past the reach are masked in every row either way, and the caches are not
    copied once more to cut them."""
    mask = attention.input_value(3)
    reach = shared.reach(mask)
    grown = [(cache, *_grown_cache(model, cache, reach, shared)) for cache in caches]
    growths = {id(growth) for _, _, growth in grown}
    whole = len(growths) == 1
    length = grown[0][2].length if whole else reach
    step = int_constant([1])
    for cache, written, _ in grown:
        axis = int_constant([cache.axis])
        narrowed = written if whole else opset.slice(written, int_constant([0]), reach, step, axis).output(0)
        for reader in [r for r in cache.written.get_target_inputs() if r.get_node().get_type_name() != "Assign"]:
            _rebuild(reader, narrowed, cache.axis, length)
    rank = mask.get_partial_shape().rank.get_length()
    cut = opset.slice(mask, int_constant([0]), length, step, int_constant([rank - 1]))
    attention.input(3).replace_source_output(cut.output(0))


def _mask_reach(mask: ov.Output) -> ov.Output:
    """``[n]``: one past the last key position ``mask`` leaves unmasked in any row (at least 1),
    rounded up to a whole block."""
    rank = mask.get_partial_shape().rank.get_length()
    length = mask.get_partial_shape()[rank - 1].get_length()
    infinity = opset.constant(np.array(-math.inf, dtype=mask.get_element_type().to_dtype()))
    unmasked = opset.not_equal(mask, infinity)
    positions = int_constant(list(range(1, length + 1)))
    reached = opset.select(unmasked, positions, int_constant([0]))
    last = opset.reduce_max(reached, int_constant(list(range(rank))), keep_dims=False)
    reach = opset.maximum(opset.reshape(last, int_constant([1]), special_zero=False), int_constant([1]))
    return _whole_blocks(reach.output(0), length)


def _whole_blocks(positions: ov.Output, length: int) -> ov.Output:
    """``positions`` rounded up to a multiple of ``BLOCK``, at most ``length``."""
    block = min(BLOCK, length)
    blocks = opset.divide(opset.add(positions, int_constant([block - 1])), int_constant([block]))
    return opset.minimum(opset.multiply(blocks, int_constant([block])), int_constant([length])).output(0)


def _grown_cache(model: ov.Model, cache: CacheWrite, reach: ov.Output, shared: _Shared) -> tuple[ov.Output, _Growth]:
    """Replace ``cache``'s variable by one holding the positions written so far (at least
    ``[0, reach)``); the cache after this call's write, and its growth."""
    old = model.get_variable_by_id(cache.read.get_variable_id())
    initial = cache.read.input_value(0)  # the buffer's exported value, at full length
    shape = list(cache.read.get_output_partial_shape(0).to_shape())
    axis = cache.axis
    info = util.VariableInfo()
    info.variable_id = old.get_info().variable_id
    info.data_type = old.get_info().data_type
    info.data_shape = ov.PartialShape([-1 if i == axis else d for i, d in enumerate(shape)])
    variable = util.Variable(info)
    nothing = [0 if i == axis else d for i, d in enumerate(shape)]
    empty = opset.constant(np.zeros(nothing, dtype=info.data_type.to_dtype()))
    read = opset.read_value(empty, variable)
    indices = opset.convert(cache.indices, "i64")
    positions = shared.signature(cache.indices)
    key = None if positions is None else (positions, reach, tuple(shape), axis, str(info.data_type))
    growth = shared.growths.get(key) if key is not None else None
    if growth is None:
        held = opset.gather(opset.shape_of(read, "i64"), int_constant([axis]), int_constant([0])).output(0)
        written_end = opset.add(opset.reduce_max(indices, int_constant([0]), keep_dims=True), int_constant([1]))
        # Up to the last position written or read, in whole blocks; nothing when that is below `held`.
        growth = _Growth(held, _whole_blocks(opset.maximum(written_end, reach).output(0), shape[axis]))
        if key is not None:
            shared.growths[key] = growth
    appended = _positions_not_held(initial, shape, axis, growth)  # their exported value
    grown = opset.concat([read.output(0), appended], axis)
    written = opset3.scatter_update(grown, indices, cache.updates, opset.constant(np.array(axis, dtype=np.int64)))
    sink = assign(written, variable)
    sink.input(0).replace_source_output(written.output(0))
    model.remove_sink(cache.sink)
    model.remove_variable(old)
    model.add_variables([variable])
    model.add_sinks([sink])
    return written.output(0), growth


def _positions_not_held(initial: ov.Output, shape: list[int], axis: int, growth: _Growth) -> ov.Output:
    """The exported value of positions ``[held, end)`` along ``axis``. A value that is one number
    throughout (a cache exported as zeros) is that number broadcast to the rows' shape, so the blob
    does not carry a cache-sized constant per cache (context 2048: 94 MB of zeros for SmolLM2-135M);
    the shape comes from slicing a stand-in as long as the axis and one wide elsewhere."""
    step, axes = int_constant([1]), int_constant([axis])
    value = constant_value(initial)
    scalar = opset.constant(value.reshape(-1)[:1].reshape(())) if value is not None and value.size else None
    # numpy has no bf16: a value read back as another type is sliced as it is.
    if scalar is None or scalar.get_output_element_type(0) != initial.get_element_type() or not _one_value(value):
        return opset.slice(initial, growth.held, growth.end, step, axes).output(0)
    bits = (str(initial.get_element_type()), np.ascontiguousarray(value).reshape(-1)[:1].tobytes())
    if bits not in growth.rows:
        stand_in = opset.constant(np.zeros([d if i == axis else 1 for i, d in enumerate(shape)], dtype=np.uint8))
        rows = opset.shape_of(opset.slice(stand_in, growth.held, growth.end, step, axes), "i64")
        target = opset.multiply(rows, int_constant([1 if i == axis else d for i, d in enumerate(shape)]))
        growth.rows[bits] = opset.broadcast(scalar, target).output(0)
    return growth.rows[bits]


def _one_value(value: np.ndarray) -> bool:
    """Whether every element of ``value`` has the first one's bits (so -0.0 and 0.0 differ, and a NaN
    equals its own bits)."""
    flat = np.ascontiguousarray(value).reshape(-1)
    bits = flat.view(f"u{flat.itemsize}") if flat.itemsize in (1, 2, 4, 8) else None
    return bits is not None and bool((bits == bits[0]).all())


def _rebuild(reader: ov.Input, source: ov.Output, axis: int, reach: ov.Output) -> None:
    """Feed ``reader`` (and the views after it, down to the attention) from ``source``, whose
    positions along ``axis`` number ``reach`` rather than the full length. Each view is kept,
    reading ``source``; a broadcast's or reshape's target takes ``reach`` at the positions' axis."""
    node = reader.get_node()
    if node.get_type_name() == "ScaledDotProductAttention":
        reader.replace_source_output(source)
        return
    out_axis = view_axis(node, axis)
    if node.get_type_name() in ("Broadcast", "Reshape"):
        target = list(node.get_output_partial_shape(0).to_shape())
        sized = opset.concat([int_constant(target[:out_axis]), reach, int_constant(target[out_axis + 1 :])], 0)
        node.input(1).replace_source_output(sized.output(0))  # every size given: special_zero is moot
    readers = list(node.output(0).get_target_inputs())
    reader.replace_source_output(source)
    for next_reader in readers:
        _rebuild(next_reader, node.output(0), out_axis, reach)


def _signature(output: ov.Output, memo: dict[tuple[int, int], tuple | None], depth: int = 0) -> tuple | None:
    """What ``output`` computes, as a value equal for outputs that compute the same from the same
    inputs (the frontend converts each layer's positions anew), or None past a few ops."""
    node = output.get_node()
    at = (node.get_instance_id(), output.get_index())
    if at in memo:
        return memo[at]
    kind = node.get_type_name()
    signature: tuple | None
    if kind == "Constant" and math.prod(node.get_output_shape(0)) <= 64:
        data = node.get_data()
        signature = (kind, str(node.get_output_element_type(0)), tuple(node.get_output_shape(0)), data.tobytes())
    elif kind in ("Constant", "Parameter"):
        signature = (kind, node.get_instance_id(), output.get_index())
    elif kind == "ReadValue":
        signature = (kind, node.get_variable_id())
    elif depth > 32:
        signature = None
    else:
        inputs = [_signature(node.input_value(i), memo, depth + 1) for i in range(node.get_input_size())]
        attributes = tuple(sorted((name, str(value)) for name, value in node.get_attributes().items()))
        version = node.get_type_info().version_id
        signature = None if None in inputs else (kind, version, output.get_index(), attributes, *inputs)
    memo[at] = signature
    return signature
