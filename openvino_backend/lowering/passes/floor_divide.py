"""Floor division as PyTorch computes it."""

from __future__ import annotations

import torch
from executorch.exir.pass_base import ExportPass, PassResult

from openvino_backend.lowering.passes.common import EDGE, retraced


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
        for node in list(graph.find_nodes(op="call_function", target=EDGE.div.Tensor_mode)):
            if node.kwargs.get("rounding_mode") != "floor":
                continue
            a, b = node.args[:2]
            dtype = node.meta["val"].dtype
            with graph.inserting_before(node):
                if dtype.is_floating_point:
                    quotient = graph.call_function(EDGE.div.Tensor, (a, b))
                    replacement = graph.call_function(EDGE.floor.default, (quotient,))
                else:
                    a_f, b_f = (
                        graph.call_function(EDGE._to_copy.default, (x,), {"dtype": torch.float32}) for x in (a, b)
                    )
                    quotient = graph.call_function(EDGE.div.Tensor, (a_f, b_f))
                    floored = graph.call_function(EDGE.floor.default, (quotient,))
                    replacement = graph.call_function(EDGE._to_copy.default, (floored,), {"dtype": dtype})
            node.replace_all_uses_with(replacement)
            graph.erase_node(node)
            modified = True
        return retraced(self, graph_module, modified)
