"""Graph rewrites that make a partition mean the same thing to OpenVINO."""

from __future__ import annotations

import torch
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass, PassResult
from executorch.exir.passes.memory_format_ops_pass import DimOrderOpsRevertPass

_EDGE = exir_ops.edge.aten
_QUANT = exir_ops.edge.quantized_decomposed


def _retraced(export_pass: ExportPass, graph_module: torch.fx.GraphModule, modified: bool) -> PassResult:
    """The pass's result: ``graph_module`` as it is, or retraced so new nodes get their ``meta["val"]``."""
    if not modified:
        return PassResult(graph_module, False)
    graph_module.recompile()
    return PassResult(ExportPass.call(export_pass, graph_module).graph_module, True)


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


def prepare_for_frontend(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Dim-order ops back to their aten forms, floor division fixed, stored weights dequantized
    explicitly: what the frontend converts."""
    for make_pass in (DimOrderOpsRevertPass, DecomposeFloorDividePass, DecomposeStoredDequantizePass):
        result = make_pass()(graph_module)
        if result is not None and result.graph_module is not None:
            graph_module = result.graph_module
    return graph_module
