"""``python -m bench --dynamic``: the same model exported static and with a dynamic dim, side by side.

For each model: the share of ops OpenVINO takes (dynamic against static), and latency at the example
size, static vs dynamic program, interleaved; the dynamic program also at the upper end of its range.
Beside it, the same ratio for OpenVINO alone (its own conversion of the exported program, inputs bound
once): the floor its CPU plugin's dynamic shapes set. Every timing has its max abs error against eager.
"""

from __future__ import annotations

import torch
from torch.export import Dim

from bench.harness import OpenvinoAlone, interleaved, max_error, median, ratio, table
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.tools.verify import LoadedMethod, flatten_outputs, lower_exported
from zoo import Decoder, Policy, SmallCNN

# name: (model, input at a size, dynamic dim, its range, example size)
MODELS = {
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
HEADERS = (
    "model",
    "ops delegated dynamic / static",
    "static ms",
    "dynamic ms",
    "dynamic/static",
    "OpenVINO alone: dynamic/static",
    "dynamic at upper end: ms",
)


def run(reps: int, iterations: int) -> None:
    rows = [_row(name, *case, reps, iterations) for name, case in MODELS.items()]
    title = (
        f"Dynamic shapes: static vs dynamic export, ms per call at the example size (median of {reps} x {iterations})"
    )
    table(title, rows, HEADERS)


def _row(name: str, build, make, dim: int, bound: Dim, example: int, reps: int, iterations: int) -> tuple:
    torch.manual_seed(0)
    module = build().eval()
    x, high = make(example), make(bound.max)
    programs, shares, plain = {}, {}, {}
    for kind, shapes in (("static", None), ("dynamic", ({dim: bound},))):
        partitioner = OpenvinoPartitioner()
        exported = torch.export.export(module, (x,), dynamic_shapes=shapes)
        plain[kind] = OpenvinoAlone(exported, (x,))
        programs[kind] = LoadedMethod(lower_exported(exported, partitioner=partitioner).buffer)
        shares[kind] = partitioner.report.delegated_nodes
    with torch.no_grad():
        expected, expected_high = flatten_outputs(module(x)), flatten_outputs(module(high))
    runs = {
        "static": lambda: programs["static"]([x]),
        "dynamic": lambda: programs["dynamic"]([x]),
        "high": lambda: programs["dynamic"]([high]),
        "plain": plain["static"],
        "plain-dynamic": plain["dynamic"],
    }
    times = interleaved(runs, reps, iterations)  # S D H S D H ...

    def cell(kind: str, given: torch.Tensor, want: list, t: list[float]) -> str:
        return f"{median(t, 3)} (err {max_error(programs[kind]([given]), want):.2g})"

    return (
        name,
        f"{shares['dynamic']} / {shares['static']} ({shares['dynamic'] / shares['static']:.0%})",
        cell("static", x, expected, times["static"]),
        cell("dynamic", x, expected, times["dynamic"]),
        ratio(times["dynamic"], times["static"]),
        ratio(times["plain-dynamic"], times["plain"]),
        f"{bound.max}: {cell('dynamic', high, expected_high, times['high'])}",
    )
