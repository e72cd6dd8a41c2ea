"""INT8 (PT2E, ``XNNPACKQuantizer``) against the float lowering of the same model, and against
ExecuTorch's XNNPACK backend running the same quantized program, side by side.

For each model: latency of the float and the INT8 program at the same input,
and of XNNPACK's lowering of the INT8 model, interleaved, and each one's max
abs error against the float eager model (the INT8 programs' also against the
quantized eager model, their own reference).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

from bench.dynamic import _error, _ms
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.tools.quantize import quantize_int8
from openvino_backend.tools.verify import LoadedMethod, flatten_outputs, lower_exported
from zoo import ResidualCNN, ResNet18, TransformerEncoder

MODELS: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], torch.Tensor]]] = {
    "resnet-18 (224x224)": (ResNet18, lambda: torch.randn(1, 3, 224, 224)),
    "resnet-cnn (64x64)": (ResidualCNN, lambda: torch.randn(1, 3, 64, 64)),
    "transformer (32x128)": (TransformerEncoder, lambda: torch.randn(1, 32, 128)),
}
CALIBRATION_DRAWS = 8


def bench_int8(reps: int, iterations: int, *, timed: bool = True) -> list[tuple]:
    """One row per model; with ``timed`` False (an emulated CPU, whose times mean nothing) the
    errors alone, the time columns left empty."""
    rows = []
    for name, (build, draw) in MODELS.items():
        torch.manual_seed(0)
        module, x = build().eval(), draw()
        quantized = quantize_int8(module, (x,), [(draw(),) for _ in range(CALIBRATION_DRAWS)])
        programs = {
            "float": LoadedMethod(
                lower_exported(torch.export.export(module, (x,)), partitioner=OpenvinoPartitioner()).buffer
            ),
            "int8": LoadedMethod(
                lower_exported(torch.export.export(quantized, (x,)), partitioner=OpenvinoPartitioner()).buffer
            ),
            "xnnpack int8": LoadedMethod(
                lower_exported(torch.export.export(quantized, (x,)), partitioner=XnnpackPartitioner()).buffer
            ),
        }
        with torch.no_grad():
            expected, expected_q = flatten_outputs(module(x)), flatten_outputs(quantized(x))
        times: dict[str, list[float]] = {kind: [] for kind in programs}
        for _ in range(reps if timed else 0):  # interleaved: F I F I ...
            for kind, method in programs.items():
                if not times[kind]:
                    _ms(method, [x], 3)  # warm up
                times[kind].append(_ms(method, [x], iterations))
        ms = {kind: f"{statistics.median(t):.3f} " if t else "- " for kind, t in times.items()}
        speedup = (
            f"{statistics.median(f / i for f, i in zip(times['float'], times['int8'], strict=True)):.2f}x"
            if timed
            else "-"
        )
        vs_xnnpack = (
            f"{statistics.median(i / q for i, q in zip(times['int8'], times['xnnpack int8'], strict=True)):.2f}"
            if timed
            else "-"
        )
        int8_out = programs["int8"]([x])
        xnnpack_out = programs["xnnpack int8"]([x])
        rows.append(
            (
                name,
                f"{ms['float']}(err {_error(programs['float']([x]), expected):.2g})",
                f"{ms['int8']}(err {_error(int8_out, expected):.2g})",
                speedup,
                f"{ms['xnnpack int8']}(err {_error(xnnpack_out, expected):.2g})",
                vs_xnnpack,
                f"{_error(int8_out, expected_q):.2g} / {_error(xnnpack_out, expected_q):.2g}",
                f"{_error(flatten_outputs(quantized(x)), expected):.2g}",
            )
        )
    return rows


def _lowered(module: torch.nn.Module, x: torch.Tensor) -> LoadedMethod:
    return LoadedMethod(lower_exported(torch.export.export(module, (x,)), partitioner=OpenvinoPartitioner()).buffer)


HEADERS = (
    "model",
    "float ms (err vs float eager)",
    "int8 ms (err vs float eager)",
    "int8 speedup",
    "xnnpack int8 ms (err vs float eager)",
    "int8 ms ours / xnnpack",
    "int8 err vs quantized eager (ours / xnnpack)",
    "quantized eager err vs float",
)
