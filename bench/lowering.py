"""``python -m bench [--quick]`` and ``--large``: lowering and inference, ours against ExecuTorch 1.5.1's
OpenVINO backend ("upstream") and plain OpenVINO.

Lowering runs in long-lived worker processes, one per backend (both define a backend named
``OpenvinoBackend``: they never share a process), interleaved A B C A B C over the repetitions,
each worker lowering the model once, uncounted, first. Inference runs the lowered ``.pte`` files
through ``executorch.runtime`` and the same model in plain OpenVINO (inputs bound before outputs at
every call, as the runtime binds them), interleaved, each latency with its max abs error against
eager beside it. ``python -m bench.lowering --backend B`` is a worker: one JSON request per stdin
line (``{"model": name, "out": path}``), one JSON answer per line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.harness import (
    OpenvinoAlone,
    answer_stream,
    child_env,
    interleaved,
    max_error,
    median,
    median_ratio,
    ratio,
    table,
)
from openvino_backend.tools.examples import RobotPolicy
from zoo import CopiesLeaving, Decoder, ResidualCNN, TransformerEncoder

# name: (model, input shapes, vocabulary: the inputs are token ids below it, or None: random floats)
MODELS = {
    "resnet-cnn": (ResidualCNN, [(1, 3, 64, 64)], None),
    "transformer": (TransformerEncoder, [(1, 32, 128)], None),
    "robot-policy": (RobotPolicy, [(2, 8, 24), (2, 6)], None),
    "copies": (CopiesLeaving, [(16, 64), (16, 64)], None),
    # Llama-shaped (hidden 128, 4 heads, 16 layers, about 1,000 export nodes): --large alone
    "decoder-16": (lambda: Decoder(vocab=1000, width=128, heads=4, layers=16), [(1, 32)], 1000),
}
LARGE = "decoder-16"
QUICK = ("copies", "robot-policy")
BACKENDS = ("ours", "upstream", "ours-no-check")
CHECK_STEPS = ("validate_model", "validate_output_types", "validate_compiled", "edge_dim_orders")
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


def build(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    factory, shapes, vocab = MODELS[name]
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    draw = [torch.randn(s, generator=g) if vocab is None else torch.randint(0, vocab, s, generator=g) for s in shapes]
    return factory().eval(), tuple(draw)


class Worker:
    def __init__(self, backend: str) -> None:
        self.backend = backend
        command = [sys.executable, "-m", "bench.lowering", "--backend", backend]
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL}
        self.process = subprocess.Popen(command, text=True, env=child_env(), **pipes)
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
        self.process.stdin.close()
        self.process.wait(timeout=60)


def lower_interleaved(model: str, workers: dict[str, Worker], reps: int, workdir: Path):
    """Each worker lowers ``model`` once uncounted (first-call costs: plugin loading, caches), then ``reps``
    times, interleaved: seconds per backend, the errors, our steps."""
    times: dict[str, list[float]] = {name: [] for name in workers}
    errors: dict[str, str] = {}
    steps: list[dict] = []
    for index in range(reps + 1):
        for backend, worker in workers.items():
            reply = worker.lower(model, workdir / f"{model}-{backend}.pte")
            if "error" in reply:
                errors[backend] = reply["error"]
            elif index:
                times[backend].append(reply["seconds"])
                if backend == "ours":
                    steps.append(reply["steps"])
    return times, errors, steps


@contextlib.contextmanager
def workers(backends: tuple[str, ...]):
    started = {name: Worker(name) for name in backends}
    try:
        yield started
    finally:
        for worker in started.values():
            worker.close()


def _lowering_row(name: str, times: dict[str, list[float]], errors: dict[str, str], steps: list[dict]) -> tuple:
    numerics = [s.get("numerical_check", 0.0) for s in steps]  # measured inside each of our lowerings
    part = median_ratio(numerics, times["ours"])
    share = f"{median(numerics)} ({100 * part:.1f}%)" if part is not None else "-"

    def cell(backend: str) -> str:
        return median(times[backend]) if times[backend] else errors.get(backend, "-")[:60]

    ours = times["ours"]
    unchecked = ratio(ours, times["ours-no-check"])
    return name, cell("ours"), cell("upstream"), ratio(ours, times["upstream"]), cell("ours-no-check"), unchecked, share


def _steps_row(name: str, steps: list[dict]) -> tuple:
    def ms(key: str) -> float:
        return 1e3 * statistics.median(s.get(key, 0.0) for s in steps)

    total, checks = ms("preprocess"), sum(ms(step) for step in CHECK_STEPS)
    share = f"{100 * checks / total:.2f}%" if total else "-"
    return name, f"{total:.1f}", f"{ms('convert'):.1f}", f"{ms('compile_model'):.1f}", f"{checks:.2f}", share


def _inference_row(name: str, paths: dict[str, Path], errors: dict[str, str], reps: int, iterations: int) -> tuple:
    from openvino_backend.tools.verify import LoadedMethod, flatten_outputs

    model, inputs = build(name)
    with torch.no_grad():
        expected = flatten_outputs(model(*inputs))
    runners = {b: LoadedMethod(paths[b]) for b in ("ours", "upstream") if b not in errors and paths[b].exists()}
    try:
        runners["plain"] = OpenvinoAlone(model, inputs, expected, rebind=True)
    except Exception as error:  # plain conversion of a model is informative, never fatal
        errors["plain"] = type(error).__name__
    calls = {b: (lambda run=run: run(list(inputs))) for b, run in runners.items()}
    accuracy = {b: max_error(call(), expected) for b, call in calls.items()}
    latency = interleaved(calls, reps, iterations)  # ours, upstream, plain, ours, ...

    def cell(backend: str) -> str:
        if backend not in latency:
            return errors.get(backend, "-")[:40]
        return f"{median(latency[backend], 3)} (err {accuracy[backend]:.2g})"

    pair = [latency.get(b) for b in ("ours", "upstream", "plain")]
    return name, cell("ours"), cell("upstream"), cell("plain"), ratio(pair[0], pair[1]), ratio(pair[0], pair[2])


def run(quick: bool) -> None:
    names = list(QUICK) if quick else [name for name in MODELS if name != LARGE]
    reps, iterations = (3, 20) if quick else (7, 100)
    lowering, inference, steps = [], [], []
    with tempfile.TemporaryDirectory() as tmp, workers(BACKENDS) as started:
        for name in names:
            times, errors, our_steps = lower_interleaved(name, started, reps, Path(tmp))
            lowering.append(_lowering_row(name, times, errors, our_steps))
            if our_steps:
                steps.append(_steps_row(name, our_steps))
            paths = {b: Path(tmp) / f"{name}-{b}.pte" for b in BACKENDS}
            inference.append(_inference_row(name, paths, errors, reps, iterations))
    table(
        f"Lowering time, s (to_edge_transform_and_lower + to_executorch; median of {reps}, interleaved)",
        lowering,
        (
            "model",
            "ours",
            "upstream",
            "ours/upstream",
            "ours, no conversion check",
            "conversion check (ratio)",
            "numerical check s (share)",
        ),
    )
    table(
        f"Inference latency, ms per call (median of {reps} x {iterations}), max abs error vs eager",
        inference,
        ("model", "ours", "upstream", "plain OpenVINO", "ours/upstream", "ours/plain"),
    )
    table(
        "Our preprocess, ms per export (all partitions), and the share spent in our checks",
        steps,
        ("model", "preprocess", "convert", "compile", "checks", "checks share"),
    )


def run_large(quick: bool) -> None:
    """The large decoder lowered by both backends, interleaved; our stages' seconds beside the totals."""
    reps = 3 if quick else 7
    with tempfile.TemporaryDirectory() as tmp, workers(("ours", "upstream")) as started:
        times, errors, steps = lower_interleaved(LARGE, started, reps, Path(tmp))
    ours, upstream = times["ours"], times["upstream"]
    rows = [("total (ours)", median(ours))]
    rows.append(("total (upstream)", median(upstream) if upstream else errors.get("upstream", "-")[:60]))
    if upstream and len(ours) == len(upstream):
        rows.append(("ours / upstream", ratio(ours, upstream)))
        each = sorted(a / b for a, b in zip(ours, upstream, strict=True))
        rows.append(("  each repetition", " ".join(f"{r:.2f}" for r in each)))
    own = [s.get("partition", 0) + s.get("pre_decomposition", 0) + s.get("preprocess", 0) for s in steps]
    rows.append(("this package's own share", median(own)))
    rows += [(label, median([s.get(key, 0.0) for s in steps])) for key, label in LARGE_STAGES]
    table(f"Lowering {LARGE} (Llama-shaped, 16 layers), s (median of {reps}, interleaved)", rows, ("stage", "seconds"))


def worker(backend: str) -> int:
    out = answer_stream()
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    from openvino_backend.program import to_executorch  # defines no backend: how either one's program is written

    recording = contextlib.nullcontext
    if backend.startswith("ours"):
        import functools

        from openvino_backend.partition.partitioner import OpenvinoPartitioner
        from openvino_backend.timing import recording  # the package's own stages, timed where they run

        if backend == "ours-no-check":  # what conversion-aware partitioning costs
            OpenvinoPartitioner = functools.partial(OpenvinoPartitioner, check_by_conversion=False)
    else:
        from executorch.backends.openvino import OpenvinoPartitioner
    print(json.dumps({"ready": True}), file=out)
    for line in sys.stdin:
        request = json.loads(line)
        model, inputs = build(request["model"])
        try:
            exported = torch.export.export(model, inputs)
            start = time.perf_counter()
            with recording() as steps:
                partitioner = OpenvinoPartitioner([CompileSpec("device", b"CPU")])
                program = to_executorch(to_edge_transform_and_lower(exported, partitioner=[partitioner]))
            seconds = time.perf_counter() - start
        except Exception as error:
            print(json.dumps({"error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}), file=out)
            continue
        Path(request["out"]).write_bytes(program.buffer)
        print(json.dumps({"seconds": seconds, "steps": dict(steps or {})}), file=out)
    return 0


if __name__ == "__main__":
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR)
    parser = argparse.ArgumentParser(prog="python -m bench.lowering")
    parser.add_argument("--backend", choices=BACKENDS, required=True)
    sys.exit(worker(parser.parse_args().backend))
