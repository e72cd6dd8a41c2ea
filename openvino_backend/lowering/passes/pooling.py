"""Average pools whose one window covers more than the padded input, clamped to it."""

from __future__ import annotations

import torch
from executorch.exir.pass_base import ExportPass, PassResult

from openvino_backend.lowering.passes.common import EDGE, rewritten
from openvino_backend.ops import whole_input_kernel


class ClampWholeInputPoolPass(ExportPass):
    """``avg_pool(x, kernel larger than the padded input, ceil_mode=True)`` -> the same pool with
    the kernel of the padded input's size.

    A global average written as a huge kernel (Hugging Face's EfficientNet pools its 7x7 map with a
    1280x1280 kernel) gives one window per such dim, which PyTorch averages over the padded input.
    OpenVINO refuses a kernel larger than its input, so the pool stayed on the CPU, where
    ExecuTorch's kernel walks the whole 1280x1280 window for every channel (2.4 s a call). Clamped,
    the window and its divisor are PyTorch's, and OpenVINO runs it.
    """

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        modified = False
        targets = (EDGE.avg_pool2d.default, EDGE.avg_pool3d.default)
        for node in [n for n in graph_module.graph.nodes if n.op == "call_function" and n.target in targets]:
            kernel = whole_input_kernel(node)
            if kernel is None:
                continue
            args = list(node.args)
            stride = args[2] if len(args) > 2 and args[2] else args[1]  # an empty stride means the kernel's
            args[1] = kernel
            if len(args) > 2:
                args[2] = list(stride)
            else:
                args.append(list(stride))
            node.args = tuple(args)
            modified = True
        return rewritten(graph_module, modified)
