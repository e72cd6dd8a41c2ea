"""4-bit weights two ways, the same decoder (``python -m bench --pt2e-weights``).

* ``export-llm --weights int4``: NNCF's ``compress_weights`` inside ``export_decoder``;
* ExecuTorch's ``export_llama --pt2e_quantize openvino_4wo`` flow: NNCF's ``compress_pt2e`` with
  ``OpenVINOQuantizer(mode=INT4WO_SYM)``, then this backend's ``lower_graph``.

Each program is written in a process of its own (importing ``OpenVINOQuantizer`` loads ExecuTorch's
own backend class, which never shares a process with the measurements), then measured from its file
by ``bench.decode`` in fresh processes, rounds interleaved.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from openvino_backend.llm.models import Decoder

# SmolLM2-135M's shape at 12 layers (random weights).
PARAMS = {
    "dim": 576,
    "n_layers": 12,
    "n_heads": 9,
    "n_kv_heads": 3,
    "hidden_dim": 1536,
    "vocab_size": 32000,
    "norm_eps": 1e-5,
    "max_seq_len": 256,
}
PROMPT = list(range(5, 61))  # 56 tokens, in one call
ROUNDS = 3
FLOWS = ("export-llm --weights int4", "compress_pt2e + OpenVINOQuantizer INT4WO_SYM")
HEADERS = ("weights compressed by", ".pte MB", "prefill ms", "decode ms", "over export-llm")


def compress_pt2e_int4(decoder: Decoder, group_size: int) -> tuple[torch.export.ExportedProgram, torch.fx.GraphModule]:
    """``decoder``'s exported graph (prompts of any length) with its weights compressed as
    ``export_llama --pt2e_quantize openvino_4wo`` compresses them: NNCF's ``compress_pt2e`` with
    ``OpenVINOQuantizer(mode=INT4WO_SYM)``; the ``torch.export.ExportedProgram`` ``lower_graph``
    takes, and the compressed module (the eager reference). Loads ExecuTorch's own backend class."""
    import nncf.experimental.torch.fx
    import torch
    from executorch.backends.openvino.quantizer import OpenVINOQuantizer, QuantizationMode

    from openvino_backend.llm.export import export_graph

    exported = export_graph(decoder)
    quantizer = OpenVINOQuantizer(mode=QuantizationMode.INT4WO_SYM, group_size=group_size, ratio=1)
    with torch.no_grad():
        compressed = nncf.experimental.torch.fx.compress_pt2e(exported.module(), quantizer=quantizer)
        shapes = ({1: torch.export.Dim("prompt", min=1, max=decoder.max_context - 1)}, None)
        return torch.export.export(compressed, exported.example_inputs[0], dynamic_shapes=shapes), compressed


def _write(flow: str, params: Path, out: Path) -> None:
    """Lower the decoder at ``params`` with its weights compressed by ``flow`` and write ``out``."""
    from openvino_backend.llm.export import export_decoder, lower_graph
    from openvino_backend.llm.models import load_decoder
    from openvino_backend.program import write_program

    decoder = load_decoder(params, max_context=PARAMS["max_seq_len"])
    if flow == FLOWS[0]:
        write_program(export_decoder(decoder, weights="int4"), out)
    else:
        write_program(lower_graph(compress_pt2e_int4(decoder, group_size=64)[0], decoder), out)  # 576 = 9 x 64


def _run(args: list[str]) -> str:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args[:3])}: ended with {done.returncode}\n{done.stderr[-2000:]}")
    return done.stdout


def bench_pt2e_weights() -> tuple[list[list[object]], str]:
    """Rows of ``HEADERS`` and the line naming what was measured."""
    with tempfile.TemporaryDirectory() as tmp:
        params = Path(tmp) / "params.json"
        params.write_text(json.dumps(PARAMS))
        files = {flow: Path(tmp) / f"{index}.pte" for index, flow in enumerate(FLOWS)}
        for index, flow in enumerate(FLOWS):
            _run(["-m", "bench.pt2e_weights", str(index), str(params), str(files[flow])])
        figures: dict[str, list[dict[str, float]]] = {flow: [] for flow in FLOWS}
        for _ in range(ROUNDS):
            for flow in FLOWS:
                ids = ",".join(map(str, PROMPT))
                out = _run(["-m", "bench.decode", str(files[flow]), "--prompt", ids, "--one-call-prefill"])
                figures[flow].append(json.loads([line for line in out.splitlines() if line.startswith("{")][-1]))
        sizes = {flow: files[flow].stat().st_size / 1e6 for flow in FLOWS}
    ratios = [b["decode_ms"] / a["decode_ms"] for a, b in zip(figures[FLOWS[0]], figures[FLOWS[1]], strict=True)]
    rows = []
    for flow in FLOWS:
        decode = statistics.median(f["decode_ms"] for f in figures[flow])
        prefill = statistics.median(f["prefill_ms"] for f in figures[flow])
        ratio = "1" if flow == FLOWS[0] else f"{statistics.median(ratios):.2f}x"
        rows.append([flow, f"{sizes[flow]:.1f}", f"{prefill:.1f}", f"{decode:.2f}", ratio])
    what = (
        f"Llama {PARAMS['dim']}x{PARAMS['n_layers']}, {PARAMS['n_heads']}/{PARAMS['n_kv_heads']} heads, vocabulary "
        f"{PARAMS['vocab_size']}, context {PARAMS['max_seq_len']}, {len(PROMPT)}-token prompt in one call; "
        f"{ROUNDS} interleaved rounds (the ratio is the median of the rounds' ratios)"
    )
    return rows, what


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("0", "1"):
        sys.exit("usage (the bench's child): python -m bench.pt2e_weights 0|1 PARAMS.json OUT.pte")
    _write(FLOWS[int(sys.argv[1])], Path(sys.argv[2]), Path(sys.argv[3]))
