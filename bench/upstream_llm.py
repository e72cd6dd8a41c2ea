"""ExecuTorch's own OpenVINO backend on the LLM bench's decoder, in its own process.

``python -m bench.upstream_llm --params JSON --context N --weights f32|int8|int4 --prompt IDS``
prints one JSON line on stdout: ``{"decode_ms": ..., "pte_bytes": ...}`` or ``{"error": ...}``;
with ``--out FILE`` it writes the ``.pte`` instead (``{"pte_bytes": ..., "peak_mb": ...}``, the
export's peak resident memory).

Its recipe is export_llama's ``--openvino [--pt2e_quantize openvino_8wo|openvino_4wo]``: a static
export (one token per call), the weights compressed by NNCF's ``compress_pt2e`` with its
``OpenVINOQuantizer`` (INT8WO_ASYM per channel, INT4WO_SYM in groups of 128), lowered by its
``OpenvinoPartitioner``. It never shares a process with this package: both define a backend named
``OpenvinoBackend``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

from bench import answer_stream

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as bench/__init__.py: PyTorch's idle workers sleep


def _lowered(params: dict, context: int, weights: str) -> bytes:
    import torch
    from executorch.backends.openvino.partitioner import OpenvinoPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    from openvino_backend.llm.models import load_decoder  # torch only: no backend of ours is defined
    from openvino_backend.program import to_executorch  # neither: how the program is written

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "params.json"
        path.write_text(json.dumps(params))
        decoder = load_decoder(path, max_context=context)
    for module in decoder.module.modules():  # export_llama's static mode: positions as tensors, no .item()
        for owner in (module, getattr(module, "params", None)):
            if hasattr(owner, "enable_dynamic_shape"):
                owner.enable_dynamic_shape = False
    inputs = (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long))  # one token per call
    with torch.no_grad():
        exported = torch.export.export(decoder.module, inputs)
        if weights != "f32":
            import nncf.experimental.torch.fx
            from executorch.backends.openvino.quantizer import OpenVINOQuantizer, QuantizationMode

            if weights == "int4":
                quantizer = OpenVINOQuantizer(mode=QuantizationMode.INT4WO_SYM, group_size=128, ratio=1)
            else:
                quantizer = OpenVINOQuantizer(mode=QuantizationMode.INT8WO_ASYM, group_size=-1, ratio=None)
            module = nncf.experimental.torch.fx.compress_pt2e(exported.module(), quantizer=quantizer)
            exported = torch.export.export(module, inputs)
    partitioner = OpenvinoPartitioner([CompileSpec("device", b"CPU")])
    # NNCF unpacks 4-bit weights with a shift outside core ATen (as export_decoder allows it too).
    config = EdgeCompileConfig(_core_aten_ops_exception_list=[torch.ops.aten.bitwise_right_shift.Tensor_Scalar])
    lowered = to_edge_transform_and_lower(exported, partitioner=[partitioner], compile_config=config)
    return to_executorch(lowered).buffer  # its blob reads its constants after import too


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.upstream_llm")
    parser.add_argument("--params", required=True, help="the example Llama's params, as JSON")
    parser.add_argument("--context", type=int, required=True)
    parser.add_argument("--weights", choices=("f32", "int8", "int4"), default="f32")
    parser.add_argument("--prompt", help="token ids, comma-separated: decode after them, a token per call")
    parser.add_argument("--out", help="write the .pte here instead of measuring it")
    args = parser.parse_args()
    if not (args.prompt or args.out):
        parser.error("give --prompt (measure) or --out (write the .pte)")
    out = answer_stream()
    warnings.filterwarnings("ignore")
    try:
        buffer = _lowered(json.loads(args.params), args.context, args.weights)
        if args.out:
            Path(args.out).write_bytes(buffer)
            from bench.decode import peak_mb

            print(json.dumps({"pte_bytes": len(buffer), "peak_mb": peak_mb()}), file=out)
            return 0
        from bench.decode import token_per_call_ms

        prompt = [int(t) for t in args.prompt.split(",")]
        print(json.dumps({"decode_ms": token_per_call_ms(buffer, prompt), "pte_bytes": len(buffer)}), file=out)
    except Exception as error:  # reported as the bench's cell, not a crash of the bench
        traceback.print_exc()  # to stderr, which the bench keeps
        first = str(error).splitlines()[0] if str(error) else ""
        print(json.dumps({"error": f"{type(error).__name__}: {first}"}), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
