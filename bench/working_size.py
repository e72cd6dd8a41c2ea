"""The LLM bench at a working size: ExecuTorch's Llama, dim 2048, 8 layers, context 2048.

The size the issue names, dim 2048 with 16 layers (3.3 GB of f32 weights), does not export
in 24 GiB: lowering it with this backend peaks past the machine's memory (killed by the kernel
during the f32 export). Half its layers is the largest of that width that fits.

``python -m bench --llm --working-size``. Random weights (vocabulary 2048, as the
rest of the LLM bench), batch 1, a 64-token prompt. Each ``.pte`` is written to
a file and measured in a fresh process (``bench/decode.py``): prefill of the
prompt (ours: one call; the others: a token per call, their only form), median
decode time over 32 tokens, and the process's peak resident memory (Python,
torch and the runtime included). Beside them, the limit: the bytes of weights
a decode step reads over the measured memory bandwidth.

Rows: ours (f32, int8, int4 weights), XNNPACK (f32 and its best, ``8da4w``),
and ExecuTorch's own OpenVINO backend (f32 and its ``openvino_4wo``).
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

from bench.llm import BYTES_PER_WEIGHT, PROMPT, UPSTREAM_TIMEOUT, memory_bandwidth, weights_read_per_token
from openvino_backend.llm.export import example_inputs, export_decoder
from openvino_backend.llm.models import Decoder, load_decoder

logger = logging.getLogger(__name__)

CONFIG = {"dim": 2048, "n_layers": 8, "n_heads": 16, "vocab_size": 2048}
CONTEXT = 2048
HEADERS = (
    "backend",
    "weights",
    ".pte MB",
    "peak MB",
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


def _upstream(path: Path, weights: str) -> bool:
    command = [sys.executable, "-m", "bench.upstream_llm", "--params", json.dumps(CONFIG)]
    command += ["--context", str(CONTEXT), "--weights", weights, "--out", str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=UPSTREAM_TIMEOUT, check=False)
    lines = done.stdout.strip().splitlines()
    answer = json.loads(lines[-1]) if lines else {}
    if "pte_bytes" not in answer:
        logger.warning("ExecuTorch's OpenVINO backend, %s: %s", weights, answer.get("error", done.stderr[-500:]))
    return "pte_bytes" in answer


def bench_working_size() -> tuple[list[tuple], float]:
    """One row per backend and weights; the memory bandwidth in B/s."""
    bandwidth = memory_bandwidth()
    prompt = torch.randint(0, CONFIG["vocab_size"], (PROMPT,), generator=torch.Generator().manual_seed(0)).tolist()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        params = Path(tmp) / "params.json"
        params.write_text(json.dumps(CONFIG))
        decoder = load_decoder(params, max_context=CONTEXT)
        read = weights_read_per_token(decoder)
        variants = [
            ("ours", "f32", lambda: export_decoder(decoder).buffer, True),
            ("ours", "int8", lambda: export_decoder(decoder, weights="int8").buffer, True),
            ("ours", "int4", lambda: export_decoder(decoder, weights="int4").buffer, True),
            ("XNNPACK", "f32", lambda: _xnnpack(decoder, best=False), False),
            ("XNNPACK", "8da4w", lambda: _xnnpack(decoder, best=True), False),
        ]
        for backend, weights, build, one_call in variants:
            path = Path(tmp) / f"{backend}-{weights}.pte"
            try:
                path.write_bytes(build())
            except Exception as error:  # a backend that cannot lower the model is a row that says so
                logger.warning("%s %s: %s", backend, weights, error)
                rows.append((backend, weights, "fails", *["-"] * 6))
                continue
            rows.append(_row(backend, weights, path, _measured(path, prompt, one_call), read, bandwidth))
            path.unlink()
        for weights in ("f32", "int4"):
            path = Path(tmp) / f"upstream-{weights}.pte"
            measured = _measured(path, prompt, False) if _upstream(path, weights) else {"error": "lowering failed"}
            name = "openvino_4wo" if weights == "int4" else weights
            rows.append(_row("ExecuTorch's OpenVINO", name, path, measured, read, bandwidth))
    return rows, bandwidth


def _row(backend: str, weights: str, path: Path, measured: dict, read: int, bandwidth: float) -> tuple:
    if "decode_ms" not in measured:
        logger.warning("%s %s: %s", backend, weights, measured.get("error"))
        return (backend, weights, f"{path.stat().st_size / 1e6:.0f}" if path.exists() else "-", *["fails"] * 6)
    per_weight = BYTES_PER_WEIGHT["int4" if weights in ("int4", "8da4w", "openvino_4wo") else weights]
    limit = read * per_weight / bandwidth * 1000
    return (
        backend,
        weights,
        f"{path.stat().st_size / 1e6:.0f}",
        f"{measured['peak_mb']:.0f}",
        f"{PROMPT / measured['prefill_ms'] * 1000:.0f}",
        f"{1000 / measured['decode_ms']:.1f}",
        f"{measured['decode_ms']:.1f}",
        f"{limit:.1f}",
        f"{measured['decode_ms'] / limit:.2f}",
    )
