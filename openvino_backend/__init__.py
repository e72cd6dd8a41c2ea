"""Ahead-of-time half of an ExecuTorch OpenVINO backend that never returns stale memory.

Lower with ``OpenvinoPartitioner``; the blobs run on the stock ExecuTorch
runtime (its C++ ``OpenvinoBackend``). A lowered program either computes what
eager PyTorch computes or export fails with an ``OpenvinoExportError`` that
says where and why.
"""

import importlib

# Imported on first use: the command line silences the libraries' import-time output before it
# loads them (``quiet.py``), and ``import openvino_backend`` alone stays cheap.
_EXPORTS = {
    "DEFAULT_RULES": "openvino_backend.boundary",
    "keep_boundary_copies_out": "openvino_backend.boundary",
    "keep_non_default_dim_order_out": "openvino_backend.boundary",
    "keep_unbindable_tensors_out": "openvino_backend.boundary",
    "BackendConflictError": "openvino_backend.diagnostics",
    "CompileSpecError": "openvino_backend.diagnostics",
    "ConversionError": "openvino_backend.diagnostics",
    "CpuKernelError": "openvino_backend.diagnostics",
    "DeviceError": "openvino_backend.diagnostics",
    "DimOrderError": "openvino_backend.diagnostics",
    "EdgeTensorError": "openvino_backend.diagnostics",
    "FusionOrderError": "openvino_backend.diagnostics",
    "OpenvinoExportError": "openvino_backend.diagnostics",
    "OutputTypeError": "openvino_backend.diagnostics",
    "PassError": "openvino_backend.diagnostics",
    "PassthroughOutputError": "openvino_backend.diagnostics",
    "OpenvinoPartitioner": "openvino_backend.partitioner",
    "OpenvinoBackend": "openvino_backend.preprocess",
    "find_passthroughs": "openvino_backend.validate",
    "validate_compiled": "openvino_backend.validate",
    "validate_edge_tensors": "openvino_backend.validate",
    "validate_model": "openvino_backend.validate",
    "validate_output_types": "openvino_backend.validate",
}


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'openvino_backend' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "DEFAULT_RULES",
    "BackendConflictError",
    "CompileSpecError",
    "ConversionError",
    "CpuKernelError",
    "DeviceError",
    "DimOrderError",
    "EdgeTensorError",
    "FusionOrderError",
    "OpenvinoBackend",
    "OpenvinoExportError",
    "OpenvinoPartitioner",
    "OutputTypeError",
    "PassError",
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
