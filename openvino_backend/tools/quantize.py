"""INT8 through PyTorch's PT2E flow, with the quantizer ExecuTorch ships.

OpenVINO's own ``OpenVINOQuantizer`` works with this backend too, but it ships
in ``executorch.backends.openvino``, which this package never imports: users
import it themselves (``lowering/guard.py`` makes the two backends coexist).

OpenVINO picks INT8 kernels from the quantize/dequantize pattern itself (its
low-precision transformations), so the quantizer only has to place the
pattern the way OpenVINO's CPU kernels like it: symmetric int8 weights
(per output channel) and int8 activations per tensor. ExecuTorch's
``XNNPACKQuantizer`` does exactly that and ships with ExecuTorch, so this
backend uses it rather than a quantizer of its own: on a ResNet-18-sized CNN
its INT8 program runs ~1.9x faster than the float lowering here, within the
quantized model's own distance from the float model (``python -m bench``).

On CPUs without VNNI (AVX2 only) OpenVINO's INT8 kernels sum pairs of u8 x s8
products in 16 bits, which saturate with full-range 8-bit weights (off by tens
of output steps, measured by ``bench/int8_exact.py``); with 7-bit weights they
are exact. ``weight_bits`` picks the range; by default, what this machine
computes exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from openvino_backend.runtime import int8_weight_bits


def quantize_int8(
    module: torch.nn.Module | torch.export.ExportedProgram,
    example_inputs: Sequence[torch.Tensor],
    calibration: Iterable[Sequence[torch.Tensor]],
    *,
    per_channel: bool = True,
    fold_quantize: bool = True,
    weight_bits: int | None = None,
) -> torch.nn.Module:
    """``module`` quantized to INT8 (PT2E: prepare, calibrate on ``calibration``, convert).

    ``weight_bits``: 8 (weights in [-127, 127]) or 7 ([-63, 63]), which OpenVINO's INT8 kernels
    compute exactly on every x86 CPU: without VNNI (AVX2-only CPUs) they saturate with 8-bit
    weights. Default: what this machine computes exactly (``runtime.int8_weight_bits``)."""
    bits = int8_weight_bits() if weight_bits is None else weight_bits
    if bits not in (7, 8):
        raise ValueError(f"weight_bits {weight_bits}: expected 8, or 7 for CPUs without VNNI")
    exported = module if isinstance(module, torch.export.ExportedProgram) else None
    if exported is None:
        exported = torch.export.export(module.eval(), tuple(example_inputs))
    bound = 2 ** (bits - 1) - 1
    config = get_symmetric_quantization_config(is_per_channel=per_channel, weight_qmin=-bound, weight_qmax=bound)
    quantizer = XNNPACKQuantizer().set_global(config)
    prepared = prepare_pt2e(exported.module(), quantizer)
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    return convert_pt2e(prepared, fold_quantize=fold_quantize)
