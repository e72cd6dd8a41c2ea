"""The OpenVINO runtime as the lowered program meets it: the core and its devices, the
precision a device really computes in (and the error that implies), what the stock ExecuTorch
runtime can bind at a partition edge, and running a compiled partition the way it binds it.

On CPUs with AMX (or AVX512-BF16) OpenVINO's CPU plugin runs f32 models in
bf16 unless told otherwise, and the ExecuTorch runtime imports blobs with no
properties, so a compile-time hint never reaches it. Comparisons and warnings
derive their numbers from the precision actually used, never from hope.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

import openvino as ov
import torch

from openvino_backend.lowering.edge_layout import DimOrder, inverse

logger = logging.getLogger(__name__)

_OV_TO_TORCH = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f64": torch.float64,
}


def openvino_version() -> str:
    """``2026.4.1``, without the build suffix."""
    return ov.get_version().split("-")[0]


@cache
def openvino_core() -> ov.Core:
    """One Core per process: creating one loads the plugins, which dominates small exports."""
    return ov.Core()


# Devices that stand for others: "AUTO", "HETERO:GPU,CPU", "MULTI:CPU,GPU", "BATCH:GPU(4)".
VIRTUAL_DEVICES = frozenset({"AUTO", "HETERO", "MULTI", "BATCH"})


_idle = threading.local()


@contextmanager
def torch_workers_idle() -> Iterator[None]:
    """PyTorch runs single-threaded inside this block, so its OpenMP workers sleep while OpenVINO's
    threads compute.

    ExecuTorch's Python binding copies a program's outputs with PyTorch, and an LLM's logits are
    large enough for PyTorch to split the copy across its OpenMP workers, which then spin, waiting
    for more work (libgomp's default unless ``OMP_WAIT_POLICY=PASSIVE`` was set before PyTorch
    loaded), on the cores OpenVINO's next call needs. PyTorch's thread count is OpenMP's, which
    belongs to the calling thread: other Python threads keep theirs. Reentrant.
    """
    depth = getattr(_idle, "depth", 0)
    if depth == 0:
        _idle.saved = torch.get_num_threads()
        if _idle.saved > 1:
            torch.set_num_threads(1)
    _idle.depth = depth + 1
    try:
        yield
    finally:
        _idle.depth -= 1
        if _idle.depth == 0 and _idle.saved > 1:
            torch.set_num_threads(_idle.saved)


def missing_devices(device: str) -> list[str]:
    """The physical devices ``device`` names that OpenVINO does not find on this machine."""
    available = openvino_core().available_devices
    families = {name.split(".")[0] for name in available}
    virtual, _, listed = device.partition(":")
    names = [n.split("(")[0].strip() for n in listed.split(",") if n.strip()] if virtual in VIRTUAL_DEVICES else []
    if virtual not in VIRTUAL_DEVICES:
        names = [device]
    return [n for n in names if n not in available and not ("." not in n and n in families)]


@cache
def default_precision(device: str = "CPU") -> torch.dtype:
    """The floating dtype ``device`` computes f32 models in by default, on this machine."""
    try:
        hint = openvino_core().get_property(device, "INFERENCE_PRECISION_HINT")
    except RuntimeError:  # a device without the property computes in the model's type
        return torch.float32
    return _OV_TO_TORCH.get(hint.to_string(), torch.float32)


def inference_precision(device: str = "CPU", target: str | None = None) -> torch.dtype:
    """The floating dtype f32 models are computed in: ``target`` (``"f32"``, ``"bf16"``, ``"f16"``,
    the precision of the machine the program will run on) or else this machine's default."""
    return _OV_TO_TORCH[target] if target is not None else default_precision(device)


@cache
def supported_precisions(device: str = "CPU") -> tuple[str, ...]:
    """The inference precisions ``device`` can compute in on this machine, f32 first."""
    try:
        capabilities = set(openvino_core().get_property(device, "OPTIMIZATION_CAPABILITIES"))
    except RuntimeError:
        return ("f32",)
    found = [name for name, capability in (("bf16", "BF16"), ("f16", "FP16")) if capability in capabilities]
    return ("f32", *found)


# Signed weights OpenVINO's INT8 kernels multiply exactly where the CPU has no VNNI: AVX2's u8 x s8
# multiply-add (vpmaddubsw) sums pairs into 16 bits, which saturate past 2 * 255 * 64.
EXACT_AVX2_WEIGHT_BITS = 7
_VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


@cache
def has_vnni() -> bool:
    """Whether this CPU multiplies u8 by s8 into 32-bit sums (VNNI or AMX), as PyTorch's cpuinfo reads
    CPUID (which an emulated CPU answers for itself; ``/proc/cpuinfo`` describes the host)."""
    capabilities = torch.cpu.get_capabilities()
    return any(capabilities.get(flag, False) for flag in _VNNI_FLAGS)


def int8_weight_bits(device: str = "CPU") -> int:
    """The widest signed weights (8 or 7 bits) ``device``'s INT8 kernels compute exactly on this
    machine: 8 with VNNI or AMX, 7 on AVX2-only CPUs (``docs/int8.md`` has the measurement)."""
    if device.split(":")[0].split(".")[0] not in ("CPU", "AUTO", "HETERO", "MULTI"):
        return 8
    return 8 if has_vnni() else EXACT_AVX2_WEIGHT_BITS


def no_vnni_note() -> str:
    """What an INT8 error on a CPU without VNNI means, and what to do."""
    return (
        "this CPU has no VNNI (AVX512-VNNI, AVX-VNNI or AMX): OpenVINO's AVX2 INT8 kernels saturate 16-bit "
        "pair sums when weights use more than 7 bits; quantize with 7-bit weights "
        "(quantize_int8(..., weight_bits=7), or weight_qmin=-63, weight_qmax=63 in the quantizer's config)"
    )


def warn_if_int8_not_portable(weight_ranges: list[tuple[int, int]], device: str) -> None:
    """Log that 8-bit weights delegated here compute wrongly on CPUs without VNNI."""
    wide = [r for r in weight_ranges if max(-r[0], r[1]) > 2 ** (EXACT_AVX2_WEIGHT_BITS - 1)]
    if not wide:
        return
    if int8_weight_bits(device) < 8:
        logger.warning(
            "%d INT8 weight tensor(s) use 8 bits (range %s) and this CPU has no VNNI, where OpenVINO's INT8 "
            "kernels saturate with them: stored weights are dequantized at export, so their layers compute in "
            "floating point (exact, without INT8's speed). For INT8 speed on such CPUs quantize with 7-bit "
            "weights (quantize_int8(..., weight_bits=7), or weight_qmin=-63, weight_qmax=63).",
            len(wide),
            f"[{wide[0][0]}, {wide[0][1]}]",
        )
        return
    logger.warning(
        "%d INT8 weight tensor(s) use 8 bits (range %s): OpenVINO computes them exactly on this CPU (VNNI) "
        "but not on CPUs without VNNI (AVX2 only), where its INT8 kernels saturate and the program "
        "returns wrong values. For such targets quantize with 7-bit weights "
        "(quantize_int8(..., weight_bits=7), or weight_qmin=-63, weight_qmax=63).",
        len(wide),
        f"[{wide[0][0]}, {wide[0][1]}]",
    )


def precision_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bf16"``: OpenVINO's name for a precision."""
    return next(name for name, known in _OV_TO_TORCH.items() if known == dtype)


# The precisions a CPU computes f32 models in, as the inference_precision compile spec names them.
PRECISIONS = ("f32", "bf16", "f16")


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the gap between 1 and the next representable number."""
    return torch.finfo(dtype).eps / 2


def effective_dtype(dtype: torch.dtype, device: str = "CPU", target: str | None = None) -> torch.dtype:
    """The dtype ``device`` computes a ``dtype`` tensor in (at the ``target`` precision if given)."""
    if not dtype.is_floating_point:
        return dtype
    hint = inference_precision(device, target)
    return hint if torch.finfo(hint).eps > torch.finfo(dtype).eps else dtype


@dataclass(frozen=True)
class Tolerance:
    """``|actual - expected| <= atol + rtol * |expected|``, elementwise."""

    atol: float
    rtol: float

    @classmethod
    def for_output(
        cls,
        dtype: torch.dtype,
        device: str = "CPU",
        *,
        terms: int = 1,
        scale: float = 1.0,
        ops: int = 4,
        target: str | None = None,
    ) -> Tolerance:
        """The error a correct result can carry in ``device``'s precision.

        Every rounding contributes at most ``u`` (the unit roundoff) relative
        error; ``ops`` roundings in sequence give ``ops * u``; a sum of
        ``terms`` values of magnitude ``scale`` adds ``sqrt(terms) * u * scale``
        of absolute error (random-walk accumulation, which is what blocked
        dot products show). Exact dtypes get zero tolerance.
        """
        if not dtype.is_floating_point:
            return cls(0.0, 0.0)
        u = unit_roundoff(effective_dtype(dtype, device, target))
        return cls(atol=ops * u * scale * math.sqrt(terms), rtol=ops * u)

    def check(self, actual: torch.Tensor, expected: torch.Tensor) -> bool:
        if actual.shape != expected.shape or actual.dtype != expected.dtype:
            return False
        if not expected.dtype.is_floating_point:
            return torch.equal(actual, expected)
        return torch.allclose(actual, expected, atol=self.atol, rtol=self.rtol, equal_nan=True)


def warn_if_reduced(dtypes: set[torch.dtype], device: str, target: str | None = None) -> None:
    """Log that ``device`` computes these dtypes in a lower precision."""
    hint = inference_precision(device, target)
    lowered = sorted(str(d) for d in dtypes if d.is_floating_point and effective_dtype(d, device, target) != d)
    if not lowered:
        return
    u = unit_roundoff(hint)
    logger.warning(
        "OpenVINO on %s computes %s partitions in %s by default (INFERENCE_PRECISION_HINT), "
        "and the ExecuTorch runtime imports blobs without properties, so the lowered program "
        "runs in %s: expect relative errors near %.1e per op, growing with reduction length "
        "(~1e-2 on a 64x64 matmul). To run in f32, give the CPU plugin "
        "INFERENCE_PRECISION_HINT=f32 in the plugins.xml beside libopenvino.so on the target.",
        device,
        ", ".join(lowered),
        hint,
        hint,
        u,
    )


# Scalar types the ExecuTorch OpenVINO runtime binds (convert_to_openvino_type).
RUNTIME_DTYPES = frozenset(
    {
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    }
)


def unbindable(val: object) -> str | None:
    """Why the runtime cannot bind ``val`` at the partition edge, or None."""
    if not isinstance(val, torch.Tensor):
        return None
    if val.dtype not in RUNTIME_DTYPES:
        return f"as {val.dtype}, which the OpenVINO runtime cannot bind"
    if val.dim() == 0:
        # create_ov_tensor builds an ov_shape of the tensor's rank, and OpenVINO's
        # C API refuses rank 0: the delegate fails with error 0x1 at run time.
        return "as a 0-d tensor, which the OpenVINO runtime cannot bind (error 0x1 at run time)"
    if any(isinstance(d, int) and d == 0 for d in val.shape):
        # OpenVINO's C API refuses a tensor over no memory: error 0x1 at run time.
        return f"as an empty tensor {tuple(val.shape)}, which the OpenVINO runtime cannot bind (error 0x1 at run time)"
    return None


def unbindable_output(val: object) -> str | None:
    """Why the runtime cannot hand ``val`` back as a partition output, or None."""
    if isinstance(val, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return "as a scalar, which the OpenVINO runtime cannot return (it expects a tensor: error 0x12)"
    if (why := unbindable(val)) is not None:
        return why
    if isinstance(val, torch.Tensor) and not all(isinstance(d, int) for d in val.shape):
        # ExecuTorch plans a dynamic output at its upper bound and the OpenVINO
        # runtime never resizes it: the program would return the wrong shape.
        return f"with dynamic shape {tuple(val.shape)}, which the OpenVINO runtime does not resize"
    return None


def run_like_runtime(
    compiled: ov.CompiledModel, feeds: Sequence[object], expected: Sequence[torch.Tensor]
) -> tuple[list[torch.Tensor], bool]:
    """Infer as the stock runtime does: inputs bound first, then output buffers it planned.

    Output buffers start with values no correct result has (NaN, or each
    expected value plus one), so an output OpenVINO never writes shows.
    Returns the outputs and whether an input buffer changed.
    """
    request = compiled.create_infer_request()
    given = [_as_tensor(x) for x in feeds]
    kept = [x.clone() for x in given]
    for index, x in enumerate(given):
        request.set_input_tensor(index, ov.Tensor(x.numpy(), shared_memory=True))
    outputs = [_not_a_result(want) for want in expected]
    for index, out in enumerate(outputs):
        request.set_output_tensor(index, ov.Tensor(out.numpy(), shared_memory=True))
    request.infer()
    overwritten = any(not torch.equal(a, b) for a, b in zip(given, kept, strict=True))
    return outputs, overwritten


def as_bound(value: object, order: DimOrder | None) -> object:
    """``value`` as the runtime binds it: its logical sizes over memory laid out in ``order``."""
    if order is None or not isinstance(value, torch.Tensor):
        return value
    return value.permute(order).contiguous().reshape(value.shape)


def from_bound(value: torch.Tensor, order: DimOrder | None, shape: Sequence[int]) -> torch.Tensor:
    """The logical tensor whose memory, laid out in ``order``, the runtime bound as ``value``."""
    if order is None:
        return value
    return value.reshape([shape[d] for d in order]).permute(inverse(order))


def _as_tensor(value: object) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().contiguous().clone()
    return torch.tensor([int(value)], dtype=torch.int64)  # the runtime binds an int input as i64[1]


def _not_a_result(want: torch.Tensor) -> torch.Tensor:
    if want.dtype == torch.bool:
        return ~want.contiguous()
    if want.dtype.is_floating_point and not want.isnan().any():
        return torch.full_like(want, math.nan, memory_format=torch.contiguous_format)
    return (want + 1).contiguous()
