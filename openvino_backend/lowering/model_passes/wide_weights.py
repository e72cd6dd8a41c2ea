"""INT8 layers whose weights use all 8 bits, on a CPU without VNNI: weights dequantized at export.

On a CPU without VNNI (AVX2 only), OpenVINO's INT8 kernels multiply u8
activations by s8 weights with ``vpmaddubsw``, which sums pairs of products
into 16 bits: with weights past 7 bits the sums saturate and the layer
computes wrong values (``docs/int8.md`` has the measurement). PyTorch's
quantized model computes such a layer as ``dequantize(x) @ dequantize(w)``
in float; so does OpenVINO when the weight reaches it as a float constant
(its low-precision transformations then leave the layer in float, the
activations still quantized by their FakeQuantize). The weight's dequantize
(``Convert`` -> ``Subtract`` -> ``Multiply``, what ``DecomposeStoredDequantizePass``
writes of a stored int8 weight, or the ``FakeQuantize`` the frontend writes of
a weight quantized in the graph) is evaluated here in f32, as PyTorch
evaluates it, and the layer reads the result: exact, delegated, not INT8-fast.
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as opset

# Layers OpenVINO's low-precision transformations turn into INT8 kernels, by their weight input.
_WEIGHTED = {
    "MatMul": 1,
    "Convolution": 1,
    "GroupConvolution": 1,
    "ConvolutionBackpropData": 1,
    "GroupConvolutionBackpropData": 1,
}
# Ops a quantized activation or a dequantized weight passes through on its way to the layer.
_SHAPE_ONLY = ("Reshape", "Transpose", "Squeeze", "Unsqueeze")


def dequantize_wide_weights(model: ov.Model, weight_bits: int) -> int:
    """Replace, in place, each INT8 layer's constant weight quantized to more than ``weight_bits``
    bits by its dequantized f32 value; how many were replaced."""
    limit = 2 ** (weight_bits - 1) - 1
    replaced = 0
    for node in model.get_ordered_ops():
        port = _WEIGHTED.get(node.get_type_name())
        if port is None or not _quantized(node.input_value(0)):
            continue
        found = _dequantized(node.input_value(port))
        if found is None or found[1] <= limit:
            continue
        node.input(port).replace_source_output(opset.constant(found[0].astype(np.float32)).output(0))
        replaced += 1
    if replaced:
        model.validate_nodes_and_infer_types()
    return replaced


def _quantized(output: ov.Output) -> bool:
    """Whether ``output`` is a FakeQuantize's, through shape-only ops and Converts."""
    node = output.get_node()
    while node.get_type_name() in (*_SHAPE_ONLY, "Convert"):
        node = node.input_value(0).get_node()
    return node.get_type_name() == "FakeQuantize"


def _dequantized(output: ov.Output) -> tuple[np.ndarray, int] | None:
    """The f32 value of a constant (de)quantize expression ending at ``output``, and the largest
    integer magnitude its weights were quantized to (0 if none); None for anything else.

    Two forms reach here: a stored int8 weight dequantized (``Convert`` -> ``Subtract`` ->
    ``Multiply``), and a float weight quantized and dequantized in the graph
    (``fold_quantize=False``), which the frontend writes as a ``FakeQuantize``.
    """
    node = output.get_node()
    kind = node.get_type_name()
    if kind == "Constant":
        data = node.get_data()
        return data, int(np.abs(data.astype(np.int16)).max(initial=0)) if node.get_element_type() == ov.Type.i8 else 0
    if kind not in ("Convert", "Subtract", "Multiply", "FakeQuantize", *_SHAPE_ONLY):
        return None  # not a constant expression: never walk into the graph
    inputs = [_dequantized(value) for value in node.input_values()]
    if any(found is None for found in inputs):
        return None
    values = [found[0] for found in inputs]
    widest = max(found[1] for found in inputs)
    if kind == "Convert" and node.get_output_element_type(0) == ov.Type.f32:
        return values[0].astype(np.float32), widest
    if kind == "Subtract":
        return np.subtract(values[0], values[1], dtype=np.float32), widest
    if kind == "Multiply":
        return np.multiply(values[0], values[1], dtype=np.float32), widest
    if kind == "FakeQuantize":
        levels = int(node.get_levels())
        return _fake_quantize(*values, levels), max(widest, levels // 2)
    if kind == "Transpose":
        return np.transpose(values[0], values[1]), widest
    if kind in ("Reshape", "Squeeze", "Unsqueeze") and node.get_output_partial_shape(0).is_static:
        return values[0].reshape(tuple(node.get_output_shape(0))), widest
    return None


def _fake_quantize(
    x: np.ndarray, in_low: np.ndarray, in_high: np.ndarray, out_low: np.ndarray, out_high: np.ndarray, levels: int
) -> np.ndarray:
    """OpenVINO's FakeQuantize, in f32, rounding half to even as PyTorch's quantize does."""
    x, in_low, in_high = (np.asarray(a, dtype=np.float32) for a in (x, in_low, in_high))
    out_low, out_high = (np.asarray(a, dtype=np.float32) for a in (out_low, out_high))
    steps = np.float32(levels - 1)
    q = np.rint((x - in_low) / (in_high - in_low) * steps) / steps * (out_high - out_low) + out_low
    return np.where(x <= np.minimum(in_low, in_high), out_low, np.where(x > np.maximum(in_low, in_high), out_high, q))
