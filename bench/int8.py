"""``python -m bench --int8``: INT8 (PT2E, ``XNNPACKQuantizer``) against the float lowering of the same
model, and against ExecuTorch's XNNPACK backend running the same quantized program.

For each model: latency of the float and the INT8 program at the same input, and of XNNPACK's lowering
of the INT8 model, interleaved, and each one's max abs error against the float eager model (the INT8
programs' also against the quantized eager model, their own reference). On an emulated CPU, whose
times mean nothing, the errors alone.
"""

from __future__ import annotations

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

from bench.harness import cpu_kind, emulated, interleaved, max_error, median, median_ratio, table
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.tools.quantize import quantize_int8
from openvino_backend.tools.verify import LoadedMethod, flatten_outputs, lower_exported
from zoo import ResidualCNN, ResNet18, TransformerEncoder

# name: (model, input)
MODELS = {
    "resnet-18 (224x224)": (ResNet18, lambda: torch.randn(1, 3, 224, 224)),
    "resnet-cnn (64x64)": (ResidualCNN, lambda: torch.randn(1, 3, 64, 64)),
    "transformer (32x128)": (TransformerEncoder, lambda: torch.randn(1, 32, 128)),
}
CALIBRATION_DRAWS = 8
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


def run(reps: int, iterations: int) -> None:
    from openvino_backend.runtime import inference_precision, int8_weight_bits

    timed = not emulated()
    title = (
        f"INT8 (PT2E, XNNPACKQuantizer, {int8_weight_bits()}-bit weights: what this CPU computes exactly) "
        f"vs float and vs XNNPACK, ms per call (median of {reps} x {iterations}); CPU: {cpu_kind()}, "
        f"f32 computed as {inference_precision('CPU')}"
    )
    if not timed:
        title += "\ntimes and speed-ups withheld: the CPU is emulated, its times mean nothing; errors only"
    table(title, [_row(name, build, draw, reps, iterations, timed) for name, (build, draw) in MODELS.items()], HEADERS)


def _row(name: str, build, draw, reps: int, iterations: int, timed: bool) -> tuple:
    torch.manual_seed(0)
    module, x = build().eval(), draw()
    quantized = quantize_int8(module, (x,), [(draw(),) for _ in range(CALIBRATION_DRAWS)])
    programs = {
        kind: LoadedMethod(lower_exported(torch.export.export(model, (x,)), partitioner=partitioner).buffer)
        for kind, model, partitioner in (
            ("float", module, OpenvinoPartitioner()),
            ("int8", quantized, OpenvinoPartitioner()),
            ("xnnpack int8", quantized, XnnpackPartitioner()),
        )
    }
    with torch.no_grad():
        expected, expected_q = flatten_outputs(module(x)), flatten_outputs(quantized(x))
    runs = {kind: (lambda method=method: method([x])) for kind, method in programs.items()}
    times = interleaved(runs, reps, iterations) if timed else {kind: [] for kind in programs}  # F I X F I X ...
    out = {kind: method([x]) for kind, method in programs.items()}
    cells = {kind: f"{median(times[kind], 3)} (err {max_error(out[kind], expected):.2g})" for kind in out}
    speedup = median_ratio(times["float"], times["int8"])
    vs_xnnpack = median_ratio(times["int8"], times["xnnpack int8"])
    return (
        name,
        cells["float"],
        cells["int8"],
        f"{speedup:.2f}x" if speedup is not None else "-",
        cells["xnnpack int8"],
        f"{vs_xnnpack:.2f}" if vs_xnnpack is not None else "-",
        f"{max_error(out['int8'], expected_q):.2g} / {max_error(out['xnnpack int8'], expected_q):.2g}",
        f"{max_error(flatten_outputs(quantized(x)), expected):.2g}",
    )
