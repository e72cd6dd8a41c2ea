"""OpenVINO alone on a decoder's linear layers and nothing else: the floor under a decode step.

Every linear layer of the decoder (its own weights, its shapes) is applied to one token's
input of its width, in one OpenVINO model compiled with the CPU's defaults, and compressed
as ours compresses (NNCF's ``compress_weights`` on that model: int8 asymmetric per channel,
int4 symmetric in groups of 128, every layer). No attention, norm or cache is around them:
its time is what OpenVINO's own kernels take to read and multiply the weights on this
machine, which no lowering can go under.
"""

from __future__ import annotations

import statistics
import time

import torch

from openvino_backend.llm.export import INT4_GROUP
from openvino_backend.llm.models import Decoder


class _Linears(torch.nn.Module):
    def __init__(self, layers: list[torch.nn.Linear]) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)
        self.widths = sorted({layer.in_features for layer in layers})

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        by_width = dict(zip(self.widths, inputs, strict=True))
        return tuple(layer(by_width[layer.in_features]) for layer in self.layers)


def linear_floor_ms(decoder: Decoder, weights: str, calls: int = 30) -> float:
    """Median ms of one call through every linear layer of ``decoder``, ``weights`` f32, int8 or int4."""
    import nncf
    import openvino as ov

    module = _Linears([m for m in decoder.module.modules() if isinstance(m, torch.nn.Linear)]).eval()
    inputs = tuple(torch.randn(1, width) for width in module.widths)
    with torch.no_grad():
        model = ov.convert_model(module, example_input=inputs)
    if weights == "int8":
        model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    elif weights == "int4":
        mode = nncf.CompressWeightsMode.INT4_SYM
        model = nncf.compress_weights(model, mode=mode, group_size=INT4_GROUP, ratio=1.0, all_layers=True)
    request = ov.Core().compile_model(model, "CPU").create_infer_request()
    feed = [x.numpy() for x in inputs]
    for _ in range(5):
        request.infer(feed)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        request.infer(feed)
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def main() -> int:
    """``python -m bench.linear_floor PARAMS_JSON CONTEXT WEIGHTS``: one JSON line, ``{"decode_ms": ...}``."""
    import json
    import sys
    import tempfile
    from pathlib import Path

    from bench import answer_stream
    from openvino_backend.llm.models import load_decoder

    params, context, weights = sys.argv[1:4]
    stream = answer_stream()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "params.json"
        path.write_text(params)
        decoder = load_decoder(path, max_context=int(context))
    print(json.dumps({"decode_ms": linear_floor_ms(decoder, weights)}), file=stream)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
