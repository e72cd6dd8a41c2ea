"""What OpenVINO's CPU plugin computes for one quantized layer, against exact integer sums
(``python -m bench.int8_exact``; run it natively and under an emulated AVX2-only CPU).

A convolution 64->32 3x3 and a linear layer 64->32, as OpenVINO's low-precision
pipeline sees a quantized model: activations fake-quantized to u8 (zero point
128), weights to i8, the output a float. The reference is the exact integer
sum of products times the scales, computed in float64. Errors are given in
output quantization steps (the output's range / 255). Weights cover the full
signed 8-bit range, then 7 bits ([-64, 63]), then 4 bits.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from openvino_backend.runtime import openvino_core

CHANNELS, OUT, SIZE = 64, 32, 12
ACT_SCALE = 0.05
WEIGHT_RANGES = {"8-bit weights [-127, 127]": 127, "7-bit weights [-64, 63]": 63, "4-bit weights [-8, 7]": 7}


def _fake_quantize(node: ov.Node, low: float, high: float, levels: int) -> ov.Node:
    lo, hi = ops.constant(np.float32(low)), ops.constant(np.float32(high))
    return ops.fake_quantize(node, lo, hi, lo, hi, levels)


def _layer(kind: str, weights_int: np.ndarray, weight_scale: float) -> ov.Model:
    """u8 activations (zero point 128) x i8 weights, as PT2E's quantize/dequantize pairs become."""
    shape = [1, CHANNELS, SIZE, SIZE] if kind == "conv" else [SIZE, CHANNELS]
    x = ops.parameter(shape, np.float32, name="x")
    xq = _fake_quantize(x, -128 * ACT_SCALE, 127 * ACT_SCALE, 256)
    w = ops.constant(weights_int.astype(np.int8))
    w = ops.multiply(ops.convert(w, np.float32), ops.constant(np.float32(weight_scale)))
    conv = kind == "conv"
    y = ops.convolution(xq, w, [1, 1], [1, 1], [1, 1], [1, 1]) if conv else ops.matmul(xq, w, False, True)
    return ov.Model([y], [x], kind)


def _reference(kind: str, x: np.ndarray, weights_int: np.ndarray, weight_scale: float) -> np.ndarray:
    xi = np.clip(np.round(x / ACT_SCALE), -128, 127).astype(np.float64)  # what the fake quantize keeps
    w = weights_int.astype(np.float64)
    if kind == "linear":
        return (xi @ w.T) * ACT_SCALE * weight_scale
    padded = np.pad(xi, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((1, OUT, SIZE, SIZE))
    for i in range(3):
        for j in range(3):
            patch = padded[:, :, i : i + SIZE, j : j + SIZE]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out * ACT_SCALE * weight_scale


def measure() -> list[dict[str, object]]:
    core = openvino_core()
    rows = []
    rng = np.random.default_rng(0)
    for label, bound in WEIGHT_RANGES.items():
        for kind in ("conv", "linear"):
            wshape = (OUT, CHANNELS, 3, 3) if kind == "conv" else (OUT, CHANNELS)
            weights_int = rng.integers(-bound - (bound != 127), bound + 1, wshape)
            scale = 0.01
            # Activations near the top of the u8 range: the pairs the AVX2 u8 x s8 multiply-add sums.
            shape = (1, CHANNELS, SIZE, SIZE) if kind == "conv" else (SIZE, CHANNELS)
            x = rng.uniform(-128 * ACT_SCALE, 127 * ACT_SCALE, shape).astype(np.float32)
            compiled = core.compile_model(_layer(kind, weights_int, scale), "CPU")
            got = compiled({"x": x})[0].astype(np.float64)
            want = _reference(kind, x, weights_int, scale)
            step = (want.max() - want.min()) / 255
            rows.append(
                {
                    "layer": kind,
                    "weights": label,
                    "max error, output steps": float(np.abs(got - want).max() / step),
                    "max error": float(np.abs(got - want).max()),
                }
            )
    return rows


def main() -> int:
    core = openvino_core()
    info = {
        "precision": str(core.get_property("CPU", "INFERENCE_PRECISION_HINT")),
        "capabilities": list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")),
        "rows": measure(),
    }
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
