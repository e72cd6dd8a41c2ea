"""Dynamic shapes: the same model exported static and with a dynamic dim, side by side.

For each model: the share of ops OpenVINO takes (dynamic against static), and
latency at the example size, static vs dynamic program, interleaved; the
dynamic program also at the upper end of its range. Beside it, the same
ratio for OpenVINO alone (its own conversion of the exported program, inputs
bound once): the floor its CPU plugin's dynamic shapes set. Every timing has
its max abs error against eager beside it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import openvino as ov
import torch
from torch.export import Dim

from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.tools.verify import LoadedMethod, flatten_outputs, lower_exported
from zoo import Decoder, Policy, SmallCNN

# name: (model, input at a size, dynamic dim, range, example size)
MODELS: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[int], torch.Tensor], int, Dim, int]] = {
    "cnn (batch)": (SmallCNN, lambda n: torch.randn(n, 3, 32, 32), 0, Dim("batch", min=1, max=8), 2),
    "encoder (batch)": (Policy, lambda n: torch.randn(n, 8, 24), 0, Dim("batch", min=1, max=8), 2),
    "decoder (sequence)": (Decoder, lambda n: torch.randint(0, 100, (1, n)), 1, Dim("seq", min=2, max=32), 16),
    # The same decoder at a working size: the per-call cost of dynamic shapes does not grow with it.
    "decoder 256x4 (sequence)": (
        lambda: Decoder(vocab=1000, width=256, layers=4),
        lambda n: torch.randint(0, 1000, (1, n)),
        1,
        Dim("seq", min=2, max=256),
        64,
    ),
}


def _ms(method: LoadedMethod, inputs: list[torch.Tensor], iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        method(inputs)
    return 1000 * (time.perf_counter() - start) / iterations


def _error(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    if [a.shape for a in actual] != [e.shape for e in expected]:
        return float("inf")
    return max((a.double() - e.double()).abs().max().item() for a, e in zip(actual, expected, strict=True))


class _PlainOpenvino:
    """OpenVINO's own conversion of the exported program (``openvino.convert_model``), inputs bound
    once: what OpenVINO alone does with the same model, static or dynamic."""

    def __init__(self, exported: torch.export.ExportedProgram, x: torch.Tensor) -> None:
        self.request = ov.Core().compile_model(ov.convert_model(exported), "CPU").create_infer_request()
        self.request.set_input_tensor(0, ov.Tensor(x.numpy()))

    def __call__(self, inputs: list[torch.Tensor]) -> None:
        self.request.infer()


def bench_dynamic(reps: int, iterations: int) -> list[tuple]:
    rows = []
    for name, (build, make, dim, bound, example) in MODELS.items():
        torch.manual_seed(0)
        module = build().eval()
        x = make(example)
        programs, shares, plain = {}, {}, {}
        for kind, shapes in (("static", None), ("dynamic", ({dim: bound},))):
            partitioner = OpenvinoPartitioner()
            exported = torch.export.export(module, (x,), dynamic_shapes=shapes)
            plain[kind] = _PlainOpenvino(exported, x)
            programs[kind] = LoadedMethod(lower_exported(exported, partitioner=partitioner).buffer)
            shares[kind] = partitioner.report.delegated_nodes
        with torch.no_grad():
            expected = flatten_outputs(module(x))
            high = make(bound.max)
            expected_high = flatten_outputs(module(high))
        times: dict[str, list[float]] = {key: [] for key in ("static", "dynamic", "high", "plain", "plain-dynamic")}
        runs = {
            "static": (programs["static"], x),
            "dynamic": (programs["dynamic"], x),
            "high": (programs["dynamic"], high),
            "plain": (plain["static"], x),
            "plain-dynamic": (plain["dynamic"], x),
        }
        for _ in range(reps):  # interleaved: S D H S D H ...
            for key, (method, given) in runs.items():
                times[key].append(_ms(method, [given], iterations))
        ratio = statistics.median(d / s for d, s in zip(times["dynamic"], times["static"], strict=True))
        plain_ratio = statistics.median(d / s for d, s in zip(times["plain-dynamic"], times["plain"], strict=True))
        rows.append(
            (
                name,
                f"{shares['dynamic']} / {shares['static']} ({shares['dynamic'] / shares['static']:.0%})",
                f"{statistics.median(times['static']):.3f} (err {_error(programs['static']([x]), expected):.2g})",
                f"{statistics.median(times['dynamic']):.3f} (err {_error(programs['dynamic']([x]), expected):.2g})",
                f"{ratio:.2f}",
                f"{plain_ratio:.2f}",
                f"{bound.max}: {statistics.median(times['high']):.3f} "
                f"(err {_error(programs['dynamic']([high]), expected_high):.2g})",
            )
        )
    return rows


HEADERS = (
    "model",
    "ops delegated dynamic / static",
    "static ms",
    "dynamic ms",
    "dynamic/static",
    "OpenVINO alone: dynamic/static",
    "dynamic at upper end: ms",
)
