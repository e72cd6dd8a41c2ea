"""A graph as data, and its source.

A ``GraphSpec`` is a straight-line program over tensors: inputs, then steps
that each apply one op to earlier values, then outputs chosen from any value.
It renders to Python source, which is both what runs (compiled under a file
name that diagnostics can point at) and the reproduction printed on failure.
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass
from itertools import count

import torch

from fuzz.op_table import DYNAMIC_RANGE, OPS, Value, result_of


@dataclass(frozen=True)
class Input:
    shape: tuple[int, ...]
    dtype: str
    channels_last: bool = False


@dataclass(frozen=True)
class Step:
    op: str
    args: tuple[int, ...]
    param: int = 0


@dataclass(frozen=True)
class GraphSpec:
    inputs: tuple[Input, ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]
    dim_order: bool = True
    seed: int = 0
    # Exported with dim 0 dynamic (in DYNAMIC_RANGE) for every input whose dim 0 has this size.
    dynamic_size: int | None = None

    def dynamic_shapes(self) -> tuple[dict, ...] | None:
        if self.dynamic_size is None:
            return None
        n = torch.export.Dim("n", min=DYNAMIC_RANGE[0], max=DYNAMIC_RANGE[1])
        return tuple({0: n} if i.shape[:1] == (self.dynamic_size,) else {} for i in self.inputs)

    def run_shapes(self) -> list[list[tuple[int, ...]]]:
        """The input shapes to run at: the example's, and with the dynamic dim at both ends of its range."""
        example = [i.shape for i in self.inputs]
        if self.dynamic_size is None:
            return [example]
        marked = [bool(d) for d in self.dynamic_shapes()]
        return [example] + [
            [(size, *shape[1:]) if dynamic else shape for shape, dynamic in zip(example, marked, strict=True)]
            for size in DYNAMIC_RANGE
        ]

    def values(self) -> tuple[Value, ...]:
        values = [Value(i.shape, i.dtype) for i in self.inputs]
        for step in self.steps:
            values.append(result_of(OPS[step.op], tuple(values[i] for i in step.args), step.param))
        return tuple(values)

    def terms(self) -> int:
        """The longest product of reduction lengths in the graph (for tolerances)."""
        values = self.values()
        product = 1
        for step in self.steps:
            product *= OPS[step.op].terms(tuple(values[i] for i in step.args), step.param)
        return max(1, product)

    def name(self, index: int) -> str:
        return f"x{index}" if index < len(self.inputs) else f"v{index}"

    def forward_source(self) -> str:
        values = self.values()
        params = ", ".join(self.name(i) for i in range(len(self.inputs)))
        lines = ["class FuzzGraph(torch.nn.Module):", f"    def forward(self, {params}):"]
        for offset, step in enumerate(self.steps):
            index = len(self.inputs) + offset
            args = tuple(self.name(i) for i in step.args)
            vals = tuple(values[i] for i in step.args)
            lines.append(f"        {self.name(index)} = {OPS[step.op].template(args, vals, step.param)}")
        lines.append(f"        return ({', '.join(self.name(i) for i in self.outputs)},)")
        return "\n".join(lines) + "\n"

    def inputs_source(self) -> str:
        lines = [f"generator = torch.Generator().manual_seed({self.seed})", "inputs = ("]
        for spec in self.inputs:
            make = {
                "bool": f"torch.rand({spec.shape}, generator=generator) < 0.5",
                "int64": f"torch.randint(-5, 6, {spec.shape}, generator=generator)",
                "int8": f"torch.randint(-5, 6, {spec.shape}, generator=generator, dtype=torch.int8)",
            }.get(spec.dtype, f"torch.randn({spec.shape}, generator=generator).to(torch.{spec.dtype})")
            if spec.channels_last:
                make = f"({make}).to(memory_format=torch.channels_last)"
            lines.append(f"    {make},")
        lines.append(")")
        return "\n".join(lines) + "\n"

    def repro(self) -> str:
        config = "None" if self.dim_order else "EdgeCompileConfig(_skip_dim_order=True)"
        return (
            "import torch\n"
            "from executorch.exir import EdgeCompileConfig\n"
            "from openvino_backend.tools.verify import check_run, lower\n\n\n"
            f"{self.forward_source()}\n\n"
            f"{self.inputs_source()}"
            f"dynamic_shapes = {self._dynamic_source()}\n"
            f"program = lower(FuzzGraph(), inputs, compile_config={config}, dynamic_shapes=dynamic_shapes)\n"
            "print(check_run(FuzzGraph(), program.buffer, inputs))\n"
        )

    def _dynamic_source(self) -> str:
        if self.dynamic_size is None:
            return "None"
        n = f"torch.export.Dim('n', min={DYNAMIC_RANGE[0]}, max={DYNAMIC_RANGE[1]})"
        dims = ", ".join("{0: n}" if d else "{}" for d in self.dynamic_shapes())
        return f"(lambda n: ({dims},))({n})"

    def build(self) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        """The module (compiled from its source, so stack traces name real lines) and inputs."""
        filename = f"<fuzz-graph-{next(_graph_ids)}>"
        source = "import torch\n\n" + self.forward_source() + "\n" + self.inputs_source()
        lines = source.splitlines(keepends=True)
        linecache.cache[filename] = (len(source), None, lines, filename)
        namespace: dict[str, object] = {}
        exec(compile(source, filename, "exec"), namespace)
        module = namespace["FuzzGraph"]()
        return module, tuple(namespace["inputs"])


_graph_ids = count()


def describe(spec: GraphSpec) -> str:
    """One line: the ops in order, for summaries."""
    ops = " ".join(step.op for step in spec.steps)
    dynamic = f", dim 0 dynamic from size {spec.dynamic_size}" if spec.dynamic_size is not None else ""
    return (
        f"{len(spec.inputs)} inputs, {ops or 'no ops'} -> {len(spec.outputs)} outputs "
        f"(dim order {spec.dim_order}{dynamic})"
    )
