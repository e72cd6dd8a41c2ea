"""Ahead-of-time half of an ExecuTorch OpenVINO backend that never returns stale memory.

Lower with ``OpenvinoPartitioner``; the blobs run on the stock ExecuTorch
runtime (its C++ ``OpenvinoBackend``). A lowered program either computes what
eager PyTorch computes or export fails with an ``OpenvinoExportError`` that
says where and why.
"""

from openvino_backend.boundary import (
    DEFAULT_RULES,
    keep_boundary_copies_out,
    keep_non_default_dim_order_out,
    keep_unbindable_tensors_out,
)
from openvino_backend.diagnostics import (
    BackendConflictError,
    ConversionError,
    CpuKernelError,
    DimOrderError,
    EdgeTensorError,
    FusionOrderError,
    OpenvinoExportError,
    OutputTypeError,
    PassthroughOutputError,
)
from openvino_backend.partitioner import OpenvinoPartitioner
from openvino_backend.preprocess import OpenvinoBackend
from openvino_backend.validate import (
    find_passthroughs,
    validate_compiled,
    validate_edge_tensors,
    validate_model,
    validate_output_types,
)

__all__ = [
    "DEFAULT_RULES",
    "BackendConflictError",
    "ConversionError",
    "CpuKernelError",
    "DimOrderError",
    "EdgeTensorError",
    "FusionOrderError",
    "OpenvinoBackend",
    "OpenvinoExportError",
    "OpenvinoPartitioner",
    "OutputTypeError",
    "PassthroughOutputError",
    "find_passthroughs",
    "keep_boundary_copies_out",
    "keep_non_default_dim_order_out",
    "keep_unbindable_tensors_out",
    "validate_compiled",
    "validate_edge_tensors",
    "validate_model",
    "validate_output_types",
]
