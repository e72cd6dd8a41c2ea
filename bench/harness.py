"""What every mode of the bench shares: timing, child processes, OpenVINO alone, tables.

* timing: ``per_call_ms`` (mean ms of a call over a batch of calls), ``interleaved`` (each contender
  once per round, A B C A B C ..., after a warm-up), ``median`` and ``median_ratio`` (the median of
  the per-round ratios: drifts of a shared machine hit both sides of a round alike);
* processes: ``answer_stream`` (a child's stdout kept for its JSON answer), ``run_child`` (a command
  in a fresh process, its last JSON line), ``run_measured`` (its result, peak RSS and wall time);
  children get the repository on their path (``child_env``);
* ``OpenvinoAlone``: the same model in plain OpenVINO, bound as the ExecuTorch runtime binds a blob;
* ``max_error``, ``table``, and the machine (``header``, ``cpu_kind``, ``emulated``).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

REPOSITORY = Path(__file__).resolve().parents[1]


def answer_stream() -> TextIO:
    """A child's stdout, kept for its answer (JSON lines); from here on everything the libraries
    print, from C or Python, goes to stderr."""
    stream = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return stream


def child_env() -> dict[str, str]:
    """This process's environment with the repository on the path (children import ``bench``)."""
    return {**os.environ, "PYTHONPATH": str(REPOSITORY)}


def run_child(command: Sequence[str], *, timeout: float, env: dict[str, str] | None = None) -> dict:
    """``command`` in a fresh process: the last JSON line it printed, or ``{"error": why, "exit": code}``
    (a negative code is the signal that killed it)."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, env=env or child_env())
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if lines:
        return json.loads(lines[-1])
    code = done.returncode
    said = [line for line in done.stderr.splitlines() if line.strip()][-1:] or ["no answer"]
    how = f"killed by signal {-code}" if code < 0 else f"exit {code}"
    return {"error": f"{how}: {said[0][:200]}", "exit": code}


def run_measured(command: list[str]) -> tuple[subprocess.CompletedProcess, float, float]:
    """``command`` in a process of its own: its result, its peak RSS in GB and its wall seconds (the
    child's own ``rusage``, reaped here rather than by ``subprocess``, which would discard it)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=child_env())
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(command, child.returncode, out.read(), err.read())
    return done, usage.ru_maxrss / 1e6, seconds  # ru_maxrss: kB on Linux


def per_call_ms(call: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return 1000 * (time.perf_counter() - start) / calls


def interleaved(
    runs: dict[str, Callable[[], object]], rounds: int, calls: int | dict[str, int], warm_up: int = 3
) -> dict[str, list[float]]:
    """ms per call of each run, once per round in turn (A B C A B C ...), after ``warm_up`` calls each."""
    for run in runs.values():
        for _ in range(warm_up):
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            times[name].append(per_call_ms(run, calls[name] if isinstance(calls, dict) else calls))
    return times


def median(values: Sequence[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f}" if values else "-"


def median_ratio(a: Sequence[float] | None, b: Sequence[float] | None) -> float | None:
    """The median of the paired ratios a / b, or None when the two were not measured alike."""
    if not a or not b or len(a) != len(b):
        return None
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def ratio(a: Sequence[float] | None, b: Sequence[float] | None) -> str:
    value = median_ratio(a, b)
    return "-" if value is None else f"{value:.2f}"


def max_error(actual: Sequence, expected: Sequence, relative: bool = False) -> float:
    """The largest absolute error over the outputs (``relative``: over each output's largest magnitude)."""
    if [tuple(a.shape) for a in actual] != [tuple(e.shape) for e in expected]:
        return float("inf")
    errors = []
    for a, e in zip(actual, expected, strict=True):
        if e.numel():
            error = (a.double() - e.double()).abs().max()
            errors.append((error / e.double().abs().max().clamp_min(1e-30) if relative else error).item())
    return max(errors, default=0.0)


class OpenvinoAlone:
    """The model in plain OpenVINO: ``convert_model`` of an exported program (in core ATen where the
    frontend takes only that) or of a module, compiled with no properties as the runtime compiles a
    blob, inputs bound before outputs as the runtime binds them: once, or with ``rebind`` at every
    call, as the runtime does. Outputs are bound (and returned) only when ``expected`` gives them."""

    def __init__(self, model: object, inputs: Sequence, expected: Sequence | None = None, rebind: bool = False):
        import numpy as np
        import openvino as ov
        import torch

        if isinstance(model, torch.export.ExportedProgram):
            try:
                converted = ov.convert_model(model)
            except Exception:  # the frontend takes some programs only in core ATen (a quantized linear)
                converted = ov.convert_model(model.run_decompositions())
        else:
            converted = ov.convert_model(model, example_input=tuple(inputs))
        self.request = ov.Core().compile_model(converted, "CPU").create_infer_request()
        self.inputs = [x.numpy().copy() for x in inputs]
        self.outputs = [np.zeros(tuple(e.shape), dtype=e.numpy().dtype) for e in expected or ()]
        self.rebind = rebind
        self._bind()

    def _bind(self) -> None:
        import openvino as ov

        for index, array in enumerate(self.inputs):
            self.request.set_input_tensor(index, ov.Tensor(array, shared_memory=True))
        for index, array in enumerate(self.outputs):
            self.request.set_output_tensor(index, ov.Tensor(array, shared_memory=True))

    def __call__(self, *_: object) -> list:
        import torch

        if self.rebind:
            self._bind()
        self.request.infer()
        return [torch.from_numpy(a.copy()) for a in self.outputs]


def table(title: str, rows: Sequence[Sequence[object]], headers: Sequence[str]) -> None:
    from tabulate import tabulate

    print(f"\n{title}")
    print(tabulate(rows, headers=headers))


_SETS = ("avx2", "avx512_f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile")


def _host() -> tuple[str, set[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), set()
    fields = [line.split(":", 1) for line in text.splitlines() if ":" in line]
    name = next((value.strip() for key, value in fields if key.strip() == "model name"), "?")
    return name, set(next((value.split() for key, value in fields if key.strip() == "flags"), []))


def emulated() -> bool:
    """Whether this process runs on an emulated CPU (QEMU): CPUID, as PyTorch reads it, then
    describes another CPU than the host's ``/proc/cpuinfo``, and times mean nothing."""
    import torch

    _, flags = _host()
    capabilities = torch.cpu.get_capabilities()
    # PyTorch's cpuinfo names avx512f "avx512_f"; /proc/cpuinfo "avx512f".
    pairs = (("avx2", "avx2"), ("avx512_f", "avx512f"), ("avx512_vnni", "avx512_vnni"))
    return bool(flags) and any(bool(capabilities.get(ours, False)) != (theirs in flags) for ours, theirs in pairs)


def cpu_kind() -> str:
    """The CPU's name and the instruction sets that decide OpenVINO's kernels and precision (as
    CPUID gives them, which an emulated CPU answers for itself)."""
    import torch

    capabilities = torch.cpu.get_capabilities()
    sets = [s for s in _SETS if capabilities.get(s, False)]
    kind = (
        "AMX"
        if "amx_tile" in sets
        else "AVX512-BF16, no AMX"
        if "avx512_bf16" in sets
        else "AVX-512 with VNNI, no BF16"
        if "avx512_vnni" in sets
        else "AVX2 only"
    )
    name = _host()[0]
    return f"{f'emulated (QEMU) on {name}' if emulated() else name} ({kind}: {' '.join(sets)})"


def header() -> str:
    import torch

    from openvino_backend.runtime import inference_precision, openvino_version

    return (
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"OpenVINO {openvino_version()} (CPU computes f32 as {inference_precision('CPU')}); "
        f"torch {torch.__version__}\nCPU: {cpu_kind()}"
    )
