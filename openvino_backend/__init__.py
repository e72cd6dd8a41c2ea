"""Ahead-of-time half of an ExecuTorch OpenVINO backend that never returns stale memory.

Lower with ``OpenvinoPartitioner``; the blobs run on the stock ExecuTorch
runtime (its C++ ``OpenvinoBackend``). A lowered program either computes what
eager PyTorch computes or export fails with an ``OpenvinoExportError`` that
says where and why.
"""

import importlib

# Imported on first use: the command line silences the libraries' import-time output before it
# loads them (``tools/quiet.py``), and ``import openvino_backend`` alone stays cheap.
_EXPORTS = {
    "DEFAULT_RULES": "openvino_backend.partition.edge_rules",
    "keep_boundary_copies_out": "openvino_backend.partition.edge_rules",
    "keep_non_default_dim_order_out": "openvino_backend.partition.edge_rules",
    "keep_unbindable_tensors_out": "openvino_backend.partition.edge_rules",
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
    "OpenvinoPartitioner": "openvino_backend.partition.partitioner",
    "OpenvinoBackend": "openvino_backend.lowering.preprocess",
    "PartitionReport": "openvino_backend.partition.report",
    "Rejection": "openvino_backend.partition.view",
    "quantize_int8": "openvino_backend.tools.quantize",
    "ProgramLayoutError": "openvino_backend.program",
    "check_program": "openvino_backend.program",
    "to_executorch": "openvino_backend.program",
    "torch_workers_idle": "openvino_backend.runtime",
    "find_passthroughs": "openvino_backend.lowering.validate",
    "validate_compiled": "openvino_backend.lowering.validate",
    "validate_edge_tensors": "openvino_backend.lowering.validate",
    "validate_model": "openvino_backend.lowering.validate",
    "validate_output_types": "openvino_backend.lowering.validate",
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
    "PartitionReport",
    "PassthroughOutputError",
    "ProgramLayoutError",
    "Rejection",
    "check_program",
    "find_passthroughs",
    "keep_boundary_copies_out",
    "keep_non_default_dim_order_out",
    "keep_unbindable_tensors_out",
    "quantize_int8",
    "to_executorch",
    "validate_compiled",
    "validate_edge_tensors",
    "validate_model",
    "validate_output_types",
]
