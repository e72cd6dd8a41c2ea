"""The LLM bench at the working size: ExecuTorch's Llama, dim 2048, 16 layers, context 2048.

``python -m bench --llm --working-size``. Random weights (vocabulary 2048, as the
rest of the LLM bench), batch 1, a 64-token prompt. Each ``.pte`` is written to
a file by a fresh process, which reports its peak resident memory (the
export's), and measured in another (``bench/decode.py``): prefill of the
prompt (ours: one call; the others: a token per call, their only form), median
decode time over 32 tokens, and that process's peak resident memory (Python,
torch and the runtime included). Beside them, the limit: the bytes of weights
a decode step reads over the measured memory bandwidth.

Rows: ours (f32, int8, int4 weights), XNNPACK (f32 and its best, ``8da4w``),
and ExecuTorch's own OpenVINO backend (f32 and its ``openvino_4wo``). Under them,
the floor: OpenVINO alone on the model's linear layers and nothing else, with the
same compression (``bench/linear_floor.py``): the time its kernels need to read
and multiply the weights here.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower

from bench import answer_stream
from bench.decode import peak_mb
from bench.llm import BYTES_PER_WEIGHT, PROMPT, UPSTREAM_TIMEOUT, memory_bandwidth, weights_read_per_token
from openvino_backend.llm.export import example_inputs, export_decoder
from openvino_backend.llm.models import Decoder, load_decoder

logger = logging.getLogger(__name__)

CONFIG = {"dim": 2048, "n_layers": 16, "n_heads": 16, "vocab_size": 2048}
CONTEXT = 2048
FLOOR = "OpenVINO alone, linear layers only"
HEADERS = (
    "backend",
    "weights",
    ".pte MB",
    "export peak MB",
    "run peak MB",
    "prefill 64 tok/s",
    "decode tok/s",
    "decode ms",
    "limit ms",
    "decode / limit",
)


def _measured(path: Path, prompt: list[int], one_call: bool) -> dict:
    command = [sys.executable, "-m", "bench.decode", str(path), "--prompt", ",".join(map(str, prompt))]
    command += ["--one-call-prefill"] if one_call else []
    done = subprocess.run(command, capture_output=True, text=True, timeout=UPSTREAM_TIMEOUT, check=False)
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {"error": done.stderr.strip().splitlines()[-1:]}


def _xnnpack(decoder: Decoder, best: bool) -> bytes:
    module = decoder.module
    if best:
        from executorch.examples.models.llama.source_transformation.quantize import quantize

        module = quantize(copy.deepcopy(module), "8da4w", group_size=128)
    decoder = dataclasses.replace(decoder, module=module)
    with torch.no_grad():
        exported = torch.export.export(decoder.module, example_inputs(decoder, 1))
    return to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch().buffer


def _build(backend: str, weights: str, path: Path) -> dict:
    """Lower one variant in a fresh process (``python -m bench.working_size``): nothing one export
    holds weighs on the next, and the export's own peak memory is measured."""
    if backend == "ExecuTorch's OpenVINO":
        command = [sys.executable, "-m", "bench.upstream_llm", "--params", json.dumps(CONFIG)]
        command += ["--context", str(CONTEXT), "--weights", weights, "--out", str(path)]
    else:
        command = [sys.executable, "-m", "bench.working_size", backend, weights, str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=UPSTREAM_TIMEOUT, check=False)
    lines = done.stdout.strip().splitlines()
    answer = json.loads(lines[-1]) if lines else {"error": f"exit {done.returncode}: {done.stderr[-300:]}"}
    if "pte_bytes" not in answer:
        logger.warning("%s %s: %s", backend, weights, answer.get("error"))
    return answer


def bench_working_size() -> tuple[list[tuple], float]:
    """One row per backend and weights; the memory bandwidth in B/s."""
    bandwidth = memory_bandwidth()
    prompt = torch.randint(0, CONFIG["vocab_size"], (PROMPT,), generator=torch.Generator().manual_seed(0)).tolist()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        params = Path(tmp) / "params.json"
        params.write_text(json.dumps(CONFIG))
        read = weights_read_per_token(load_decoder(params, max_context=CONTEXT))
        variants = [
            ("ours", "f32"),
            ("ours", "int8"),
            ("ours", "int4"),
            ("XNNPACK", "f32"),
            ("XNNPACK", "8da4w"),
            ("ExecuTorch's OpenVINO", "f32"),
            ("ExecuTorch's OpenVINO", "int4"),
        ]
        for backend, weights in variants:
            path = Path(tmp) / "program.pte"
            built = _build(backend, weights, path)
            measured = _measured(path, prompt, backend == "ours") if "pte_bytes" in built else built
            name = "openvino_4wo" if backend != "ours" and weights == "int4" else weights
            rows.append(_row(backend, name, path, measured, built.get("peak_mb"), read, bandwidth))
            path.unlink(missing_ok=True)
    for weights in ("f32", "int8", "int4"):
        rows.append(_floor_row(weights, read, bandwidth))
    return rows, bandwidth


def _floor_row(weights: str, read: int, bandwidth: float) -> tuple:
    """OpenVINO alone on the decoder's linear layers only (``bench/linear_floor.py``), in its own process."""
    command = [sys.executable, "-m", "bench.linear_floor", json.dumps(CONFIG), str(CONTEXT), weights]
    done = subprocess.run(command, capture_output=True, text=True, timeout=UPSTREAM_TIMEOUT, check=False)
    lines = done.stdout.strip().splitlines()
    measured = json.loads(lines[-1]) if lines else {}
    if "decode_ms" not in measured:
        logger.warning("linear layers alone, %s: exit %s: %s", weights, done.returncode, done.stderr[-300:])
        return (FLOOR, weights, *["-"] * 4, *["fails"] * 4)
    limit = read * BYTES_PER_WEIGHT[weights] / bandwidth * 1000
    ms = measured["decode_ms"]
    return (FLOOR, weights, *["-"] * 4, f"{1000 / ms:.1f}", f"{ms:.1f}", f"{limit:.1f}", f"{ms / limit:.2f}")


def main() -> int:
    """``python -m bench.working_size ours|XNNPACK WEIGHTS OUT.pte``: lower one variant, one JSON line."""
    backend, weights, out = sys.argv[1:4]
    stream = answer_stream()
    with tempfile.TemporaryDirectory() as tmp:
        params = Path(tmp) / "params.json"
        params.write_text(json.dumps(CONFIG))
        decoder = load_decoder(params, max_context=CONTEXT)
    try:
        if backend == "ours":
            buffer = export_decoder(decoder, weights=weights).buffer
        else:
            buffer = _xnnpack(decoder, best=weights == "8da4w")
    except Exception as error:  # the row says the backend cannot lower it
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}), file=stream)
        return 0
    Path(out).write_bytes(buffer)
    print(json.dumps({"pte_bytes": len(buffer), "peak_mb": peak_mb()}), file=stream)
    return 0


def _row(
    backend: str, weights: str, path: Path, measured: dict, export_mb: float | None, read: int, bandwidth: float
) -> tuple:
    size = f"{path.stat().st_size / 1e6:.0f}" if path.exists() else "-"
    export = f"{export_mb:.0f}" if export_mb is not None else "-"
    if "decode_ms" not in measured:
        logger.warning("%s %s: %s", backend, weights, measured.get("error"))
        return (backend, weights, size, export, *["fails"] * 7)
    per_weight = BYTES_PER_WEIGHT["int4" if weights in ("int4", "8da4w", "openvino_4wo") else weights]
    limit = read * per_weight / bandwidth * 1000
    return (
        backend,
        weights,
        size,
        export,
        f"{measured['peak_mb']:.0f}",
        f"{PROMPT / measured['prefill_ms'] * 1000:.0f}",
        f"{1000 / measured['decode_ms']:.1f}",
        f"{measured['decode_ms']:.1f}",
        f"{limit:.1f}",
        f"{measured['decode_ms'] / limit:.2f}",
    )


if __name__ == "__main__":
    sys.exit(main())
