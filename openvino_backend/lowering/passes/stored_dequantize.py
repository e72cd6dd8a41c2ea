"""Stored (folded) quantized weights dequantized explicitly."""

from __future__ import annotations

import torch
from executorch.exir.pass_base import ExportPass, PassResult

from openvino_backend.lowering.passes.common import EDGE, QUANT, retraced


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
        targets = (QUANT.dequantize_per_tensor.default, QUANT.dequantize_per_channel.default)
        modified = False
        for node in [n for n in graph.nodes if n.op == "call_function" and n.target in targets]:
            source = node.args[0]
            if isinstance(source, torch.fx.Node) and source.op == "call_function" and "quantize" in str(source.target):
                continue  # a quantize/dequantize pair: the frontend's FakeQuantize
            dtype = node.kwargs.get("out_dtype") or torch.float32
            with graph.inserting_before(node):
                value = graph.call_function(EDGE._to_copy.default, (source,), {"dtype": dtype})
                if node.target == QUANT.dequantize_per_tensor.default:
                    scale, zero_point = node.args[1:3]
                    if zero_point:  # sub.Tensor with a number: OpenVINO's frontend has no sub.Scalar
                        value = graph.call_function(EDGE.sub.Tensor, (value, zero_point))
                    value = graph.call_function(EDGE.mul.Scalar, (value, scale))
                else:
                    scales, zero_points, axis = node.args[1:4]
                    shape = [1] * source.meta["val"].dim()
                    shape[axis] = -1
                    if zero_points is not None:
                        zero = graph.call_function(EDGE._to_copy.default, (zero_points,), {"dtype": dtype})
                        zero = graph.call_function(EDGE.view_copy.default, (zero, shape))
                        value = graph.call_function(EDGE.sub.Tensor, (value, zero))
                    scale = graph.call_function(EDGE._to_copy.default, (scales,), {"dtype": dtype})
                    scale = graph.call_function(EDGE.view_copy.default, (scale, shape))
                    value = graph.call_function(EDGE.mul.Tensor, (value, scale))
            node.replace_all_uses_with(value)
            graph.erase_node(node)
            modified = True
        return retraced(self, graph_module, modified)
