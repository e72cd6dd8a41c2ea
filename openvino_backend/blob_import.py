"""Does the installed OpenVINO keep reading a compiled blob after importing it? Asked, not assumed.

The stock ExecuTorch runtime hands a delegate's blob to ``ov_core_import_model``
and frees it right after ``init`` when the blob sits in a segment (ExecuTorch's
default layout). That is safe only if the import copied what the compiled model
reads. OpenVINO's CPU plugin has done both: 2025.4 copies, 2026.4 keeps reading
constants used as they are (a bias, an embedding table) from the caller's
buffer. Which one the installed OpenVINO does decides how programs must be
written (``program.py``), so it is measured once per process, on OpenVINO's C
API exactly as the runtime calls it: import from a buffer of ours, overwrite
the buffer, infer, compare with the same blob's result before.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import logging
import os
from functools import cache

import numpy as np

from openvino_backend.runtime import openvino_core, openvino_version

logger = logging.getLogger(__name__)

# Constants an op reads as they are, large enough to tell from zeros: what the import may not copy.
_FEATURES, _WIDTH, _ROWS = 16, 256, 4


def openvino_c_library_path() -> str | None:
    """The installed ``openvino`` package's C library (what the runtime's backend dlopens)."""
    spec = importlib.util.find_spec("openvino")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "libs", "libopenvino_c.so*")))
    return found[0] if found else None


class _C:
    """The few calls of OpenVINO's C API the runtime's backend makes, with their status checked."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)

    def __call__(self, name: str, *args: object) -> None:
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise RuntimeError(f"OpenVINO's C API: {name} returned status {status}")


def _probe_blob() -> tuple[bytes, np.ndarray, np.ndarray]:
    """A compiled blob of ``x @ W + bias`` and ``table[x-derived rows]``, an input, and its output."""
    import openvino as ov
    import openvino.opset13 as ops

    rng = np.random.default_rng(0)
    x = ops.parameter([_ROWS, _FEATURES], np.float32, name="x")
    weight = rng.uniform(-1, 1, (_FEATURES, _WIDTH)).astype(np.float32)
    bias = rng.uniform(64, 128, (_WIDTH,)).astype(np.float32)
    table = rng.uniform(64, 128, (_ROWS, _WIDTH)).astype(np.float32)
    linear = ops.add(ops.matmul(x, ops.constant(weight), False, False), ops.constant(bias))
    rows = ops.constant(np.arange(_ROWS)[::-1].copy().astype(np.int32))
    looked_up = ops.gather(ops.constant(table), rows, ops.constant(np.int32(0)))
    model = ov.Model([ops.add(linear, looked_up)], [x], "blob_import_probe")
    compiled = openvino_core().compile_model(model, "CPU")
    sample = rng.uniform(-1, 1, (_ROWS, _FEATURES)).astype(np.float32)
    expected = compiled({0: sample})[0].copy()
    return compiled.export_model().getvalue(), sample, expected


def _run_after_overwrite(library: str, blob: bytes, sample: np.ndarray) -> np.ndarray:
    """Import ``blob`` through the C API from a buffer, zero the buffer, infer ``sample``."""
    c = _C(library)
    buffer = ctypes.create_string_buffer(blob, len(blob))
    core, compiled, request = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    tensors: list[ctypes.c_void_p] = []
    try:
        c("ov_core_create", ctypes.byref(core))
        c("ov_core_import_model", core, buffer, ctypes.c_size_t(len(blob)), b"CPU", ctypes.byref(compiled))
        ctypes.memset(buffer, 0, len(blob))  # what a freed segment may hold by the first call
        c("ov_compiled_model_create_infer_request", compiled, ctypes.byref(request))
        data = ctypes.c_void_p()
        tensors.append(ctypes.c_void_p())
        c("ov_infer_request_get_input_tensor_by_index", request, ctypes.c_size_t(0), ctypes.byref(tensors[-1]))
        c("ov_tensor_data", tensors[-1], ctypes.byref(data))
        ctypes.memmove(data, sample.ctypes.data, sample.nbytes)
        c("ov_infer_request_infer", request)
        tensors.append(ctypes.c_void_p())
        c("ov_infer_request_get_output_tensor_by_index", request, ctypes.c_size_t(0), ctypes.byref(tensors[-1]))
        c("ov_tensor_data", tensors[-1], ctypes.byref(data))
        out = ctypes.cast(data, ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(out, shape=(_ROWS, _WIDTH)).copy()
    finally:
        for tensor in tensors:
            if tensor:
                c.lib.ov_tensor_free(tensor)
        if request:
            c.lib.ov_infer_request_free(request)
        if compiled:
            c.lib.ov_compiled_model_free(compiled)
        if core:
            c.lib.ov_core_free(core)


@cache
def import_copies_blob() -> bool:
    """True if the installed OpenVINO's import copies everything the compiled model reads afterwards.

    Then a blob may be freed once imported, and ExecuTorch's default layout (blobs in segments,
    freed after ``init``) runs from a file; otherwise the blob must live as long as the program.
    """
    library = openvino_c_library_path()
    if library is None:
        logger.warning("no libopenvino_c in the openvino package: blobs are written to outlive their import")
        return False
    blob, sample, expected = _probe_blob()
    got = _run_after_overwrite(library, blob, sample)
    error = float(np.nanmax(np.abs(got - expected))) if np.isfinite(got).all() else float("inf")
    copies = error < 1.0  # the constants are 64-128: reading zeros instead is off by at least 64
    logger.info(
        "OpenVINO %s import %s the blob (max error %.3g after overwriting it)",
        openvino_version(),
        "copies" if copies else "keeps reading",
        error,
    )
    return copies
