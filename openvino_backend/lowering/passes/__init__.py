"""FX graph rewrites, before converting, that make a partition mean the same thing to OpenVINO, one pass per
module (``model_passes`` rewrites the converted ``ov.Model``)."""

from __future__ import annotations

import torch

from openvino_backend.diagnostics import OpenvinoExportError, pass_failure
from openvino_backend.lowering.passes.attention import RecomposeAttentionPass
from openvino_backend.lowering.passes.dim_order import RevertDimOrderOpsPass
from openvino_backend.lowering.passes.expand import DropSameShapeExpandPass, DropSameShapeViewPass
from openvino_backend.lowering.passes.floor_divide import DecomposeFloorDividePass
from openvino_backend.lowering.passes.matmul import RecomposeMatmulPass
from openvino_backend.lowering.passes.pooling import ClampWholeInputPoolPass
from openvino_backend.lowering.passes.shape_arguments import ConstantShapeArgumentsPass
from openvino_backend.lowering.passes.stored_dequantize import DecomposeStoredDequantizePass

# In order: what the frontend converts.
PASSES = (
    RevertDimOrderOpsPass,
    DecomposeFloorDividePass,
    DecomposeStoredDequantizePass,
    DropSameShapeExpandPass,
    RecomposeMatmulPass,
    RecomposeAttentionPass,
    DropSameShapeViewPass,
    ClampWholeInputPoolPass,
    ConstantShapeArgumentsPass,
)


def prepare_for_frontend(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Dim-order ops back to their aten forms, floor division fixed, stored weights dequantized
    explicitly, batched matmuls and shape arguments in the forms OpenVINO optimizes: what the
    frontend converts."""
    for make_pass in PASSES:
        try:
            result = make_pass()(graph_module)
        except OpenvinoExportError:
            raise
        except Exception as error:
            raise pass_failure(make_pass.__name__, error) from error
        if result is not None and result.graph_module is not None:
            graph_module = result.graph_module
    return graph_module
