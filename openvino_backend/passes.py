"""Graph rewrites that make a partition mean the same thing to OpenVINO."""

from __future__ import annotations

import math

import torch
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass, PassResult
from executorch.exir.passes.memory_format_ops_pass import MemoryFormatOpsMap, get_memory_format
from torch.fx.experimental.symbolic_shapes import statically_known_true

from openvino_backend.diagnostics import OpenvinoExportError, pass_failure

_EDGE = exir_ops.edge.aten
_QUANT = exir_ops.edge.quantized_decomposed


def _retraced(export_pass: ExportPass, graph_module: torch.fx.GraphModule, modified: bool) -> PassResult:
    """The pass's result: ``graph_module`` as it is, or retraced so new nodes get their ``meta["val"]``."""
    if not modified:
        return PassResult(graph_module, False)
    graph_module.recompile()
    return PassResult(ExportPass.call(export_pass, graph_module).graph_module, True)


def _rewritten(graph_module: torch.fx.GraphModule, modified: bool) -> PassResult:
    """The result of a pass that rewrote ``graph_module`` in place: what it left unread removed."""
    if modified:
        graph_module.graph.eliminate_dead_code()
        graph_module.recompile()
    return PassResult(graph_module, modified)


class RevertDimOrderOpsPass(ExportPass):
    """Dim-order ops back to their memory-format forms, which the frontend translates.

    What ExecuTorch's ``DimOrderOpsRevertPass`` does, in place: that pass is an
    ``ExportPass`` that re-traces the whole graph to rename a few ops, the
    largest cost of converting a large partition. The values, and so every
    ``meta["val"]``, stay as they are.
    """

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        modified = False
        for node in graph_module.graph.nodes:
            if node.op != "call_function" or node.target not in MemoryFormatOpsMap:
                continue
            target = MemoryFormatOpsMap[node.target]
            first = node.args[0]
            rank = len(first) if isinstance(first, (list, tuple)) else first.meta["val"].dim()
            kwargs = dict(node.kwargs)
            kwargs["memory_format"] = get_memory_format(kwargs.pop("dim_order", list(range(rank))))
            accepted = {argument.name for argument in target._schema.arguments}
            node.target = target
            node.kwargs = {name: value for name, value in kwargs.items() if name in accepted}
            modified = True
        if modified:
            graph_module.recompile()
        return PassResult(graph_module, modified)


class DecomposeFloorDividePass(ExportPass):
    """``div(a, b, rounding_mode="floor")`` -> ``floor(div(a, b))``.

    OpenVINO rounds a "floor" division toward zero; PyTorch rounds toward
    negative infinity, so the two disagree whenever the quotient is negative.
    Integer operands are divided in float32 (exact for |values| < 2**24) and
    cast back, since OpenVINO's integer division truncates as well.
    """

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        graph = graph_module.graph
        modified = False
        for node in list(graph.find_nodes(op="call_function", target=_EDGE.div.Tensor_mode)):
            if node.kwargs.get("rounding_mode") != "floor":
                continue
            a, b = node.args[:2]
            dtype = node.meta["val"].dtype
            with graph.inserting_before(node):
                if dtype.is_floating_point:
                    quotient = graph.call_function(_EDGE.div.Tensor, (a, b))
                    replacement = graph.call_function(_EDGE.floor.default, (quotient,))
                else:
                    a_f, b_f = (
                        graph.call_function(_EDGE._to_copy.default, (x,), {"dtype": torch.float32}) for x in (a, b)
                    )
                    quotient = graph.call_function(_EDGE.div.Tensor, (a_f, b_f))
                    floored = graph.call_function(_EDGE.floor.default, (quotient,))
                    replacement = graph.call_function(_EDGE._to_copy.default, (floored,), {"dtype": dtype})
            node.replace_all_uses_with(replacement)
            graph.erase_node(node)
            modified = True
        return _retraced(self, graph_module, modified)


class DecomposeStoredDequantizePass(ExportPass):
    """``dequantize(q)`` of a stored integer tensor -> ``(float(q) - zero_point) * scale``.

    OpenVINO's frontend translates a dequantize as the second half of a
    quantize/dequantize pair (a FakeQuantize). ``convert_pt2e(fold_quantize=True)``,
    the default, stores weights already quantized, so their dequantize has no
    quantize before it, and the frontend passes the int8 tensor through as it
    is. Written as Convert -> Subtract -> Multiply it is OpenVINO's own
    pattern for compressed weights, which its low-precision transformations
    fold into INT8 kernels, and the weights stay int8 in the blob.
    """

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        graph = graph_module.graph
        targets = (_QUANT.dequantize_per_tensor.default, _QUANT.dequantize_per_channel.default)
        modified = False
        for node in [n for n in graph.nodes if n.op == "call_function" and n.target in targets]:
            source = node.args[0]
            if isinstance(source, torch.fx.Node) and source.op == "call_function" and "quantize" in str(source.target):
                continue  # a quantize/dequantize pair: the frontend's FakeQuantize
            dtype = node.kwargs.get("out_dtype") or torch.float32
            with graph.inserting_before(node):
                value = graph.call_function(_EDGE._to_copy.default, (source,), {"dtype": dtype})
                if node.target == _QUANT.dequantize_per_tensor.default:
                    scale, zero_point = node.args[1:3]
                    if zero_point:
                        value = graph.call_function(_EDGE.sub.Scalar, (value, zero_point))
                    value = graph.call_function(_EDGE.mul.Scalar, (value, scale))
                else:
                    scales, zero_points, axis = node.args[1:4]
                    shape = [1] * source.meta["val"].dim()
                    shape[axis] = -1
                    if zero_points is not None:
                        zero = graph.call_function(_EDGE._to_copy.default, (zero_points,), {"dtype": dtype})
                        zero = graph.call_function(_EDGE.view_copy.default, (zero, shape))
                        value = graph.call_function(_EDGE.sub.Tensor, (value, zero))
                    scale = graph.call_function(_EDGE._to_copy.default, (scales,), {"dtype": dtype})
                    scale = graph.call_function(_EDGE.view_copy.default, (scale, shape))
                    value = graph.call_function(_EDGE.mul.Tensor, (value, scale))
            node.replace_all_uses_with(value)
            graph.erase_node(node)
            modified = True
        return _retraced(self, graph_module, modified)


class ConstantShapeArgumentsPass(ExportPass):
    """Symbolic sizes in ``view_copy`` and ``expand_copy`` written as -1 where that means the same.

    A size computed from a symbolic dim (``view_copy(x, [9*s, 4, 16])``)
    reaches OpenVINO as a run-time input or a shape subgraph: the Reshape's
    target is data, OpenVINO loses the static dims around it ([?,?,?,?]
    where [1,4,?,16] is known) and re-infers shapes on every call. A view with
    one symbolic dim gets ``-1`` there (the element count fixes it, as long as
    it cannot be zero); an expand gets ``-1`` wherever it keeps the input's
    size. The targets are then constants.
    """

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        modified = False
        for node in graph_module.graph.find_nodes(op="call_function", target=_EDGE.view_copy.default):
            shape = node.meta["val"].shape
            symbolic = [i for i, d in enumerate(shape) if not isinstance(d, int)]
            if len(symbolic) != 1 or not statically_known_true(node.meta["val"].numel() > 0):
                continue
            size = [-1 if isinstance(d, torch.SymInt) else d for d in shape]
            if size != list(node.args[1]):
                node.args = (node.args[0], size, *node.args[2:])
                modified = True
        for node in graph_module.graph.find_nodes(op="call_function", target=_EDGE.expand_copy.default):
            source = node.args[0].meta["val"].shape
            size = list(node.args[1])
            offset = len(size) - len(source)
            kept = [i for i in range(offset, len(size)) if _same_size(size[i], source[i - offset])]
            for i in kept:
                size[i] = -1
            if kept:
                node.args = (node.args[0], size, *node.args[2:])
                modified = True
        return _rewritten(graph_module, modified)


class RecomposeMatmulPass(ExportPass):
    """``view(bmm(view(expand(a)), view(expand(b))))`` -> ``matmul(a, b)``.

    PyTorch decomposes a batched ``matmul`` into expands that materialize the
    broadcast batch, reshapes to 3-d, ``bmm`` and a reshape back. OpenVINO's
    MatMul broadcasts batch dims itself; given the decomposed form it runs
    five ops instead of one, and its attention fusions do not see the MatMul
    -> Softmax -> MatMul chain. A weight expanded to a batch (``linear`` of a
    3-d view with a dynamic dim) stays a matrix, which OpenVINO runs as one
    fully connected layer instead of a copy of the weight per batch element.
    The rewrite applies only where the result's shape is exactly
    ``matmul``'s (the batch dims broadcast, the matrix dims untouched by the
    expands).
    """

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        graph = graph_module.graph
        modified = False
        for node in list(graph.find_nodes(op="call_function", target=_EDGE.bmm.default)):
            if len(node.users) != 1:
                continue
            (out,) = node.users
            if out.target != _EDGE.view_copy.default:
                continue
            out_batch = out.meta["val"].shape[:-2]
            sources = [_batched_source(operand, out_batch) for operand in node.args[:2]]
            if any(source is None for source in sources) or all(s.meta["val"].dim() < 3 for s in sources):
                continue  # two matrices: the bmm's own batch is the only one
            a, b = (source.meta["val"] for source in sources)
            try:
                batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
            except RuntimeError:
                continue
            if not _same_shape((*batch, a.shape[-2], b.shape[-1]), out.meta["val"].shape):
                continue
            with graph.inserting_before(out):
                # The frontend has no rule for aten.matmul; it translates bmm as MatMul, which
                # broadcasts batch dims. This graph is only ever read by the frontend.
                matmul = graph.call_function(_EDGE.bmm.default, tuple(sources))
            matmul.meta.update(out.meta)
            out.replace_all_uses_with(matmul)
            modified = True
        return _rewritten(graph_module, modified)


class RecomposeAttentionPass(ExportPass):
    """Decomposed attention with a dynamic dim -> OpenVINO's ScaledDotProductAttention.

    PyTorch decomposes ``scaled_dot_product_attention`` into a MatMul of the
    scaled query and key, the mask added, ``_safe_softmax`` and a MatMul by the
    value. ``_safe_softmax`` guards rows whose scores are all ``-inf``: they
    give 0, where a softmax gives NaN. The guard reads the scores a second
    time, and with dynamic dims OpenVINO's CPU plugin then runs every op of
    the chain on its own; given one ScaledDotProductAttention it runs one fused
    kernel. OpenVINO's kernel gives NaN for a fully masked row, so the guard is
    kept, computed from the mask: ``where(all(mask == -inf, -1), 0, attention)``.
    The two are the same whenever the query and key are finite (a row whose
    scores are all ``-inf`` only because the query or the key holds an infinity
    gives NaN here, 0 in PyTorch). Static partitions are left as they are:
    OpenVINO fuses the decomposed chain itself when the shapes are known.
    """

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        graph = graph_module.graph
        modified = False
        for node in list(graph.find_nodes(op="call_function", target=_EDGE.where.self)):
            match = _decomposed_attention(node)
            if match is None:
                continue
            query, key_t, value, mask, out = match
            # New values get their meta["val"] made from sizes already known: evaluating ops on the
            # program's fake tensors could add guards to its shape environment (and specialize a dim).
            with graph.inserting_before(out):
                rank = key_t.meta["val"].dim()
                swapped = [*range(rank - 2), rank - 1, rank - 2]
                key = _node(graph, _EDGE.permute_copy.default, (key_t, swapped), like=key_t, sizes=swapped)
                # The scale is already in the query and key: PyTorch scales both before the MatMul.
                result = _node(graph, _EDGE.scaled_dot_product_attention.default, (query, key, value, mask), like=out)
                result.kwargs = {"scale": 1.0}
                if mask is not None:
                    rows = [*range(mask.meta["val"].dim() - 1)]
                    masked = _node(graph, _EDGE.eq.Scalar, (mask, -math.inf), like=mask, dtype=torch.bool)
                    kept = _node(graph, _EDGE.logical_not.default, (masked,), like=masked)
                    kept = _node(graph, _EDGE.any.dim, (kept, -1, True), like=masked, sizes=rows, keepdim=True)
                    empty = _node(graph, _EDGE.logical_not.default, (kept,), like=kept)
                    zeros = _node(graph, _EDGE.full_like.default, (result, 0), like=out)
                    result = _node(graph, _EDGE.where.self, (empty, zeros, result), like=out)
            out.replace_all_uses_with(result)
            modified = True
        return _rewritten(graph_module, modified)


def _decomposed_attention(where: torch.fx.Node) -> tuple | None:
    """``where`` as the guard of a decomposed attention with a dynamic dim in float32: its query,
    transposed key, value, additive mask (or None) and the MatMul by the value; None otherwise."""
    condition, zeros, softmax = where.args
    if not all(isinstance(n, torch.fx.Node) for n in (condition, zeros, softmax)) or len(where.users) != 1:
        return None
    (out,) = where.users
    if (
        softmax.target != _EDGE._softmax.default
        or softmax.args[2]
        or zeros.target != _EDGE.full_like.default
        or zeros.args[1:] != (0,)
        or zeros.args[0] is not softmax
        or out.target != _EDGE.bmm.default
        or out.args[0] is not where
    ):
        return None
    scores = softmax.args[0]
    val = scores.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != torch.float32 or val.dim() < 3:
        return None
    if softmax.args[1] not in (-1, val.dim() - 1) or all(isinstance(d, int) for d in val.shape):
        return None
    if _guarded_scores(condition, softmax.args[1]) is not scores:
        return None
    if set(softmax.users) != {where, zeros} or len(scores.users) != 2:
        return None
    matmul, mask = scores, None
    if scores.target == _EDGE.add.Tensor and not scores.kwargs:
        matmul, mask = scores.args
        if not (isinstance(matmul, torch.fx.Node) and matmul.target == _EDGE.bmm.default):
            mask, matmul = matmul, mask
        if not _is_mask(mask, val) or len(matmul.users) != 1:
            return None
    if not isinstance(matmul, torch.fx.Node) or matmul.target != _EDGE.bmm.default:
        return None
    query, key_t = matmul.args
    value = out.args[1]
    shapes = [n.meta["val"].shape for n in (query, key_t, value)]
    if any(len(shape) != val.dim() for shape in shapes) or not all(
        _same_shape(shape[:-2], val.shape[:-2]) for shape in shapes
    ):
        return None  # OpenVINO's kernel broadcasts no batch dim the MatMuls did
    return query, key_t, value, mask, out


def _guarded_scores(condition: torch.fx.Node, dim: int) -> torch.fx.Node | None:
    """``x`` if ``condition`` is ``not(any(not(x == -inf), dim, keepdim))``: all of a row ``-inf``."""
    chain = [_EDGE.logical_not.default, _EDGE.any.dim, _EDGE.logical_not.default, _EDGE.eq.Scalar]
    node = condition
    for target in chain:
        if not isinstance(node, torch.fx.Node) or node.target != target or len(node.users) != 1:
            return None
        if target == _EDGE.any.dim and (node.args[1] != dim or node.args[2:] != (True,)):
            return None
        if target == _EDGE.eq.Scalar:
            return node.args[0] if node.args[1] == -math.inf else None
        node = node.args[0]
    return None


def _is_mask(mask: object, scores: torch.Tensor) -> bool:
    """An additive float mask that broadcasts to the scores without growing them."""
    val = mask.meta.get("val") if isinstance(mask, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dtype != scores.dtype or not 1 <= val.dim() <= scores.dim():
        return False
    try:
        return _same_shape(tuple(torch.broadcast_shapes(val.shape, scores.shape)), tuple(scores.shape))
    except RuntimeError:
        return False


def _node(
    graph: torch.fx.Graph,
    target: object,
    args: tuple,
    *,
    like: torch.fx.Node,
    sizes: list[int] | None = None,
    keepdim: bool = False,
    dtype: torch.dtype | None = None,
) -> torch.fx.Node:
    """A new node whose ``meta["val"]`` is ``like``'s value (its dims picked by ``sizes``, a
    trailing 1 if ``keepdim``, in ``dtype``), made without evaluating ``target``."""
    node = graph.call_function(target, args)
    val = like.meta["val"]
    shape = [val.shape[i] for i in sizes] if sizes is not None else list(val.shape)
    if sizes is None and dtype is None and not keepdim:
        node.meta["val"] = val
        return node
    node.meta["val"] = val.new_empty([*shape, 1] if keepdim else shape, dtype=dtype or val.dtype)
    return node


def _batched_source(operand: torch.fx.Node, batch: tuple) -> torch.fx.Node | None:
    """The tensor a ``bmm`` operand was flattened from (before any expand), if the flattened
    dims are exactly ``batch`` and the matrix dims are untouched."""
    if not isinstance(operand, torch.fx.Node) or operand.target != _EDGE.view_copy.default:
        return None
    source = operand.args[0]
    while isinstance(source, torch.fx.Node) and source.target == _EDGE.clone.default:  # the same values
        source = source.args[0]
    if not isinstance(source, torch.fx.Node) or not _same_shape(source.meta["val"].shape[:-2], batch):
        return None  # the batch elements would pair up differently
    if source.target == _EDGE.expand_copy.default:
        expanded = source.args[0]
        if expanded.meta["val"].dim() >= 2 and _same_shape(
            expanded.meta["val"].shape[-2:], source.meta["val"].shape[-2:]
        ):
            source = expanded
    shape = source.meta["val"].shape
    if len(shape) < 2 or not _same_shape(shape[-2:], operand.meta["val"].shape[-2:]):
        return None
    return source


def _same_shape(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b, strict=True))


def _same_size(entry: object, size: int | torch.SymInt) -> bool:
    """True if ``entry`` (an expand's size argument) is the symbolic ``size`` itself."""
    value = entry.meta.get("val") if isinstance(entry, torch.fx.Node) else None
    return isinstance(value, torch.SymInt) and isinstance(size, torch.SymInt) and value.node.expr == size.node.expr


def prepare_for_frontend(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Dim-order ops back to their aten forms, floor division fixed, stored weights dequantized
    explicitly, batched matmuls and shape arguments in the forms OpenVINO optimizes: what the
    frontend converts."""
    for make_pass in (
        RevertDimOrderOpsPass,
        DecomposeFloorDividePass,
        DecomposeStoredDequantizePass,
        RecomposeMatmulPass,
        RecomposeAttentionPass,
        ConstantShapeArgumentsPass,
    ):
        try:
            result = make_pass()(graph_module)
        except OpenvinoExportError:
            raise
        except Exception as error:
            raise pass_failure(make_pass.__name__, error) from error
        if result is not None and result.graph_module is not None:
            graph_module = result.graph_module
    return graph_module
