"""``python -m bench --llm``: the recipe's program (``openvino_backend.llm``) against XNNPACK and itself;
``python -m bench --ab A.pte B.pte``: two programs of one decoder, in one process.

``--llm``: ExecuTorch's example Llama (``CONFIGS``, random weights), median ms through
``executorch.runtime``: decode after a 64-token prompt at context 128 and 2048, exported dynamic and
static, and XNNPACK's (static; its cache a mutable buffer ExecuTorch copies back); the prompt's prefill
in one call against 64; weights compressed to 8 and 4 bits against f32 and XNNPACK's ``8da4w``, each
beside the limit (the bytes of weights a decode step reads over the memory bandwidth of a 512 MB sum);
the fixed cost of a call (``bench.peers.call_cost_ms``).

``--ab``: separate processes minutes apart on a shared machine spread 1.5x-2x, where a change worth
10% disappears. Both programs are loaded into one process and measured in alternating rounds (a prompt
in one call from position 0, as a runner serves a new conversation, then ``--steps`` decode calls):
the median over rounds of B's time over A's, and how far apart their first logits are.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from bench.harness import table

PROMPT = 64
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
)
# Bytes a decode step reads per weight of a linear layer: f32; int8 with a scale and zero point per
# output channel (negligible); int4 in groups of 128 with an f16 scale per group.
BYTES_PER_WEIGHT = {"f32": 4.0, "int8": 1.0, "int4": 0.5 + 2 / 128}
BANDWIDTH_BYTES = 512 * 2**20


def prefill(method: object, prompt: Sequence[int], one_call: bool) -> tuple[torch.Tensor, float]:
    """The last logits after ``prompt`` from position 0 (in one call, or a token per call), and ms."""
    start = time.perf_counter()
    if one_call:
        logits = method.execute([torch.tensor([list(prompt)]), torch.tensor([0])])[0]
    else:
        for position, token in enumerate(prompt):
            logits = method.execute([torch.tensor([[token]]), torch.tensor([position])])[0]
    return logits, 1000 * (time.perf_counter() - start)


def decode_ms(method: object, logits: torch.Tensor, position: int, steps: int) -> float:
    """Median ms of ``steps`` one-token calls from ``position``, each token the last logits' argmax."""
    times = []
    for _ in range(steps):
        token = torch.tensor([[int(logits.reshape(-1, logits.shape[-1])[-1].argmax())]])
        start = time.perf_counter()
        logits = method.execute([token, torch.tensor([position])])[0]
        times.append(1000 * (time.perf_counter() - start))
        position += 1
    return statistics.median(times)


def _decoder(params: dict, context: int, directory: Path):
    from openvino_backend.llm.models import load_decoder

    path = directory / "params.json"
    path.write_text(json.dumps(params))
    return load_decoder(path, max_context=context)


def _decode_ms(buffer: bytes, prompt: list[int]) -> float:
    from openvino_backend.llm.generate import Generator

    generator = Generator(buffer)
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
    from openvino_backend.llm.generate import Generator

    generator = Generator(buffer)
    generator(prompt)
    start = time.perf_counter()
    generator(prompt)
    return 1000 * (time.perf_counter() - start)


def _xnnpack_decode_ms(decoder, prompt: list[int], best: bool = False) -> float:
    """XNNPACK's decode, the prompt fed a token per call; ``best``: ExecuTorch's own 8da4w (group 128)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from openvino_backend.llm.export import example_inputs

    if best:
        from executorch.examples.models.llama.source_transformation.quantize import quantize

        decoder = dataclasses.replace(decoder, module=quantize(copy.deepcopy(decoder.module), "8da4w", group_size=128))
    with torch.no_grad():
        exported = torch.export.export(decoder.module, example_inputs(decoder, 1))
    buffer = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    program = Runtime.get().load_program(buffer)  # held while its method runs
    method = program.load_method("forward")
    logits, _ = prefill(method, prompt, one_call=False)
    return decode_ms(method, logits, len(prompt), STEPS)


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


def _rows(name: str, prompt: list[int], bandwidth: float) -> tuple[tuple, list[tuple]]:
    from openvino_backend.llm.export import export_decoder

    with tempfile.TemporaryDirectory() as tmp:
        decoder = _decoder(CONFIGS[name], 128, Path(tmp))
        dynamic = export_decoder(decoder).buffer
        prefill_ms = _prefill_ms(dynamic, prompt)
        static_program = export_decoder(decoder, dynamic=False).buffer
        # Interleaved, three times each: a quiet median for the dynamic / static ratio.
        decodes, statics = [], []
        for _ in range(3):
            decodes.append(_decode_ms(dynamic, prompt))
            statics.append(_decode_ms(static_program, prompt))
        decode, static = statistics.median(decodes), statistics.median(statics)
        calls = _prefill_ms(static_program, prompt)  # a token per call
        xnnpack, xnnpack_best = _xnnpack_decode_ms(decoder, prompt), _xnnpack_decode_ms(decoder, prompt, best=True)
        read = sum(m.weight.numel() for m in decoder.module.modules() if isinstance(m, torch.nn.Linear))
        sizes, speeds = {"f32": len(dynamic)}, {"f32": decode}
        for weights in ("int8", "int4"):
            buffer = export_decoder(decoder, weights=weights).buffer
            sizes[weights], speeds[weights] = len(buffer), _decode_ms(buffer, prompt)
        weight_rows = []
        for weights, ms in speeds.items():
            limit = read * BYTES_PER_WEIGHT[weights] / bandwidth * 1000
            size = (f"{sizes[weights] / 1e6:.1f}", f"{sizes[weights] / sizes['f32']:.2f}")
            times = (f"{ms:.2f}", f"{speeds['f32'] / ms:.2f}", f"{limit:.2f}", f"{ms / limit:.2f}")
            weight_rows.append((name, weights, *size, *times, f"{xnnpack_best:.2f}", f"{ms / xnnpack_best:.2f}"))
        long_decoder = _decoder(CONFIGS[name], 2048, Path(tmp))
        long_context = _decode_ms(export_decoder(long_decoder).buffer, prompt)
        xnnpack_long = _xnnpack_decode_ms(long_decoder, prompt)
    row = (
        name,
        f"{decode:.2f}",
        f"{long_context / decode:.2f}",
        f"{xnnpack_long / xnnpack:.2f}",
        f"{static:.2f}",
        f"{decode / static:.2f}",
        f"{xnnpack:.2f}",
        f"{decode / xnnpack:.2f}",
        f"{prefill_ms:.1f}",
        f"{calls / prefill_ms:.1f}",
    )
    return row, weight_rows


def run(quick: bool) -> None:
    from bench.peers import call_cost_line, call_cost_ms

    bandwidth = memory_bandwidth()
    prompt = torch.randint(0, 2048, (PROMPT,), generator=torch.Generator().manual_seed(0)).tolist()
    rows, weight_rows = [], []
    for name in ["llama 256x4"] if quick else list(CONFIGS):
        row, weights = _rows(name, prompt, bandwidth)
        rows.append(row)
        weight_rows += weights
    table("LLM (ExecuTorch's example Llama, random weights), median ms through executorch.runtime", rows, HEADERS)
    title = (
        f"LLM weights: compressed in OpenVINO vs f32 (decode at context 128); limit: weight bytes "
        f"per token / {bandwidth / 1e9:.1f} GB/s measured"
    )
    table(title, weight_rows, WEIGHT_HEADERS)
    print(f"\n{call_cost_line(call_cost_ms())}")


def ab(a: str, b: str, prompt: list[int], steps: int, rounds: int) -> None:
    from executorch.runtime import Runtime

    programs = [Runtime.get().load_program(Path(path)) for path in (a, b)]  # held while they run
    methods = [program.load_method("forward") for program in programs]
    first = [prefill(method, prompt, one_call=True)[0] for method in methods]  # each shape's set-up, once
    figures: list[list[tuple[float, float]]] = [[], []]
    for _ in range(rounds):
        for method, rows in zip(methods, figures, strict=True):
            logits, prefill_ms = prefill(method, prompt, one_call=True)
            rows.append((prefill_ms, decode_ms(method, logits, len(prompt), steps)))
    print(f"A {a}\nB {b}\nfirst logits, largest difference: {(first[0] - first[1]).abs().max().item():.3g}")
    for name, index in (("prefill", 0), ("decode", 1)):
        ms = [statistics.median(row[index] for row in figure) for figure in figures]
        ratio = statistics.median(y[index] / x[index] for x, y in zip(*figures, strict=True))
        print(f"{name} ms: A {ms[0]:.2f}  B {ms[1]:.2f}  B/A {ratio:.3f} (median of {rounds} rounds' ratios)")
