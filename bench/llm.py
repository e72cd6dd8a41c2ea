"""LLMs: the recipe's program (``openvino_backend.llm``) against XNNPACK, and against itself.

ExecuTorch's example Llama with random weights (vocabulary 2048), batch 1,
median milliseconds through ``executorch.runtime``:

* decode: one token per call after a 64-token prompt; ours at context 128 and
  2048 (the KV cache stays in OpenVINO state and grows with the positions
  written, ``lowering/kv_cache.py``), ours exported static (one token per
  call), XNNPACK (static, its usual export; the cache is a mutable buffer
  ExecuTorch copies back), and ExecuTorch's own OpenVINO backend
  (export_llama's ``--openvino`` recipe, static, in its own process:
  ``bench/upstream_llm.py``), at context 128 and 2048.
* prefill: the 64-token prompt in one call against 64 one-token calls (each
  the second time, after the first prompt).
* weights: decode with weights compressed to 8 and 4 bits (NNCF's scheme,
  kept compressed in OpenVINO) against f32, and the size of each ``.pte``;
  ExecuTorch's OpenVINO backend with the same weights (its ``openvino_8wo``
  and ``openvino_4wo``).
* XNNPACK's best: its ``8da4w`` (int8 dynamic activations, int4 weights in
  groups of 128, ExecuTorch's own ``quantize(model, "8da4w")``).
* the limit: the bytes of weights one decode step reads (every linear layer;
  the embedding gives one row) over the machine's memory bandwidth, measured
  here by summing a 512 MB tensor with torch's threads.
* the fixed cost of a call (``bench.peers.call_cost_ms``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower

from bench.decode import token_per_call_ms
from bench.peers import call_cost_ms
from openvino_backend.llm.export import example_inputs, export_decoder
from openvino_backend.llm.generate import Generator
from openvino_backend.llm.models import Decoder, load_decoder

logger = logging.getLogger(__name__)

PROMPT = 64
UPSTREAM_TIMEOUT = 1200
STEPS = 32
CONFIGS = {
    "llama 256x4": {"dim": 256, "n_layers": 4, "n_heads": 4, "vocab_size": 2048},
    "llama 1024x8": {"dim": 1024, "n_layers": 8, "n_heads": 16, "vocab_size": 2048},
}
HEADERS = (
    "model",
    "decode ms (ctx 128)",
    "ctx 2048 / 128",
    "XNNPACK: ctx 2048 / 128",
    "static ms",
    "dynamic / static",
    "XNNPACK ms",
    "ours / XNNPACK",
    "ExecuTorch's OpenVINO ms",
    "ours / theirs",
    "theirs: ctx 2048 / 128",
    "prefill 64: one call ms",
    "64 calls / one call",
)
WEIGHT_HEADERS = (
    "model",
    "weights",
    ".pte MB",
    "size / f32",
    "decode ms",
    "f32 / this",
    "limit ms",
    "this / limit",
    "XNNPACK 8da4w ms",
    "this / 8da4w",
    "ExecuTorch's OpenVINO, same weights ms",
    "this / theirs",
)
# Bytes a decode step reads per weight of a linear layer: f32; int8 with a scale and zero point per
# output channel (negligible); int4 in groups of 128 with an f16 scale per group.
BYTES_PER_WEIGHT = {"f32": 4.0, "int8": 1.0, "int4": 0.5 + 2 / 128}
BANDWIDTH_BYTES = 512 * 2**20


def _decoder(params: dict, context: int, directory: Path) -> Decoder:
    path = directory / "params.json"
    path.write_text(json.dumps(params))
    return load_decoder(path, max_context=context)


def _decode_ms(generator: Generator, prompt: list[int]) -> float:
    logits = generator(prompt)
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        logits = generator([int(logits.argmax())])
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def _prefill_ms(buffer: bytes, prompt: list[int]) -> float:
    """A prompt's second prefill (the first at a new shape pays OpenVINO's one-off set-up), into the
    positions after the first."""
    generator = Generator(buffer)
    generator(prompt)
    start = time.perf_counter()
    generator(prompt)
    return 1000 * (time.perf_counter() - start)


def _xnnpack_decode_ms(decoder: Decoder, prompt: list[int]) -> float:
    inputs = example_inputs(decoder, 1)
    with torch.no_grad():
        exported = torch.export.export(decoder.module, inputs)
    program = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch()
    return token_per_call_ms(program.buffer, prompt, STEPS)


def _upstream_decode_ms(params: dict, context: int, weights: str, prompt: list[int]) -> float | None:
    """ExecuTorch's own OpenVINO backend (export_llama's recipe), in its own process; None if it failed."""
    command = [sys.executable, "-m", "bench.upstream_llm", "--params", json.dumps(params), "--context", str(context)]
    command += ["--weights", weights, "--prompt", ",".join(map(str, prompt))]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=UPSTREAM_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        logger.warning("ExecuTorch's OpenVINO backend, %s %s: no answer in %d s", params, weights, UPSTREAM_TIMEOUT)
        return None
    lines = done.stdout.strip().splitlines()
    answer = json.loads(lines[-1]) if lines else {"error": done.stderr.strip().splitlines()[-1:]}
    if "decode_ms" not in answer:
        logger.warning("ExecuTorch's OpenVINO backend, %s %s: %s", params, weights, answer.get("error"))
        return None
    return answer["decode_ms"]


def _xnnpack_8da4w_ms(decoder: Decoder, prompt: list[int]) -> float:
    """XNNPACK's best decode: ExecuTorch's own 8da4w source transformation (group 128)."""
    from executorch.examples.models.llama.source_transformation.quantize import quantize

    quantized = quantize(copy.deepcopy(decoder.module), "8da4w", group_size=128)
    return _xnnpack_decode_ms(dataclasses.replace(decoder, module=quantized), prompt)


def memory_bandwidth() -> float:
    """Bytes per second a full read of a large tensor reaches, best of five, with torch's threads."""
    data = torch.ones(BANDWIDTH_BYTES // 4, dtype=torch.float32)
    data.sum()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return BANDWIDTH_BYTES / best


def weights_read_per_token(decoder: Decoder) -> int:
    """Weights of the linear layers: what one decode step must read (the embedding gives one row)."""
    return sum(m.weight.numel() for m in decoder.module.modules() if isinstance(m, torch.nn.Linear))


def _ms(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "fails"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b is not None else "-"


def bench_llm(quick: bool) -> tuple[list[tuple], list[tuple], dict[str, float], float]:
    """Decode and prefill rows, weight rows, the cost of one call (``call_cost_ms``), memory bandwidth in B/s."""
    rows, weight_rows = [], []
    bandwidth = memory_bandwidth()
    names = ["llama 256x4"] if quick else list(CONFIGS)
    prompt = torch.randint(0, 2048, (PROMPT,), generator=torch.Generator().manual_seed(0)).tolist()
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            decoder = _decoder(CONFIGS[name], 128, Path(tmp))
            dynamic = export_decoder(decoder).buffer
            prefill = _prefill_ms(dynamic, prompt)
            static_program = export_decoder(decoder, dynamic=False).buffer
            # Interleaved, three times each: a quiet median for the dynamic / static ratio.
            decodes, statics = [], []
            for _ in range(3):
                decodes.append(_decode_ms(Generator(dynamic), prompt))
                statics.append(_decode_ms(Generator(static_program), prompt))
            decode, static = statistics.median(decodes), statistics.median(statics)
            calls = _prefill_ms(static_program, prompt)  # a token per call
            xnnpack = _xnnpack_decode_ms(decoder, prompt)
            xnnpack_best = _xnnpack_8da4w_ms(decoder, prompt)
            limits = {w: weights_read_per_token(decoder) * b / bandwidth * 1000 for w, b in BYTES_PER_WEIGHT.items()}
            sizes = {"f32": len(dynamic)}
            speeds = {"f32": decode}
            for weights in ("int8", "int4"):
                buffer = export_decoder(decoder, weights=weights).buffer
                sizes[weights], speeds[weights] = len(buffer), _decode_ms(Generator(buffer), prompt)
            theirs = {w: _upstream_decode_ms(CONFIGS[name], 128, w, prompt) for w in ("f32", "int8", "int4")}
            for weights in ("f32", "int8", "int4"):
                weight_rows.append(
                    (
                        name,
                        weights,
                        f"{sizes[weights] / 1e6:.1f}",
                        f"{sizes[weights] / sizes['f32']:.2f}",
                        f"{speeds[weights]:.2f}",
                        f"{speeds['f32'] / speeds[weights]:.2f}",
                        f"{limits[weights]:.2f}",
                        f"{speeds[weights] / limits[weights]:.2f}",
                        f"{xnnpack_best:.2f}",
                        f"{speeds[weights] / xnnpack_best:.2f}",
                        _ms(theirs[weights]),
                        _ratio(speeds[weights], theirs[weights]),
                    )
                )
            long_decoder = _decoder(CONFIGS[name], 2048, Path(tmp))
            long_context = _decode_ms(Generator(export_decoder(long_decoder).buffer), prompt)
            xnnpack_long = _xnnpack_decode_ms(long_decoder, prompt)
            theirs_long = _upstream_decode_ms(CONFIGS[name], 2048, "f32", prompt)
        rows.append(
            (
                name,
                f"{decode:.2f}",
                f"{long_context / decode:.2f}",
                f"{xnnpack_long / xnnpack:.2f}",
                f"{static:.2f}",
                f"{decode / static:.2f}",
                f"{xnnpack:.2f}",
                f"{decode / xnnpack:.2f}",
                _ms(theirs["f32"]),
                _ratio(decode, theirs["f32"]),
                _ratio(theirs_long, theirs["f32"]),
                f"{prefill:.1f}",
                f"{calls / prefill:.1f}",
            )
        )
    return rows, weight_rows, call_cost_ms(), bandwidth
