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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e


def quantize_int8(
    module: torch.nn.Module | torch.export.ExportedProgram,
    example_inputs: Sequence[torch.Tensor],
    calibration: Iterable[Sequence[torch.Tensor]],
    *,
    per_channel: bool = True,
    fold_quantize: bool = True,
) -> torch.nn.Module:
    """``module`` quantized to INT8 (PT2E: prepare, calibrate on ``calibration``, convert)."""
    exported = module if isinstance(module, torch.export.ExportedProgram) else None
    if exported is None:
        exported = torch.export.export(module.eval(), tuple(example_inputs))
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=per_channel))
    prepared = prepare_pt2e(exported.module(), quantizer)
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    return convert_pt2e(prepared, fold_quantize=fold_quantize)
