"""Errors raised at export, and how they render.

An export error has to answer four questions for someone who did not write
this backend: what went wrong, where in *their* code, why OpenVINO behaves
that way, and what to do next. The same answers are kept as structured fields
so tools (the CLI, the fuzzer, tests) never have to parse the text.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from openvino_backend.graph import op_name

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep

# One frame of an FX ``stack_trace``: 'File "m.py", line 12, in forward\n    y = x.clone()'
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)\n(?P<code>[^\n]*)')


@dataclass(frozen=True)
class SourceLocation:
    """The user's line that created a node (innermost frame of its stack trace)."""

    file: str
    line: int
    function: str
    code: str

    @classmethod
    def from_stack_trace(cls, stack_trace: str | None) -> SourceLocation | None:
        if not stack_trace:
            return None
        frames = list(_FRAME.finditer(stack_trace))
        if not frames:
            return None
        # The innermost frame outside torch itself: for `self.fc(x)` that is the
        # user's line, not torch/nn/modules/linear.py.
        users = [f for f in frames if not f["file"].startswith(_TORCH_DIR)]
        last = (users or frames)[-1]
        return cls(last["file"], int(last["line"]), last["func"], last["code"].strip())

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class NodeRef:
    """An FX node as the user should see it: its name, op, line and module."""

    name: str
    op: str
    source: SourceLocation | None = None
    module_path: str | None = None

    @classmethod
    def from_node(cls, node: torch.fx.Node) -> NodeRef:
        return cls(
            name=node.name,
            op=op_name(node),
            source=SourceLocation.from_stack_trace(node.meta.get("stack_trace")),
            module_path=_module_path(node),
        )


def _module_path(node: torch.fx.Node) -> str | None:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path, module_type = list(stack.values())[-1]
    type_name = module_type if isinstance(module_type, str) else getattr(module_type, "__qualname__", "")
    type_name = type_name.rsplit(".", 1)[-1]
    return f"{path or 'self'} ({type_name})" if type_name else (path or "self")


@dataclass(frozen=True)
class Finding:
    """One concrete problem, and the nodes that make it up (user's order)."""

    message: str
    nodes: tuple[NodeRef, ...] = ()


@dataclass(eq=False)
class OpenvinoExportError(RuntimeError):
    """Base of every error this backend raises at export.

    ``str(error)`` is the full, human-readable diagnostic; the fields carry the
    same information for programs.
    """

    summary: str
    findings: Sequence[Finding] = ()
    why: str = ""
    fix: str = ""
    partition: int | None = None
    notes: Sequence[str] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        super().__init__(self.render())

    @property
    def nodes(self) -> tuple[NodeRef, ...]:
        return tuple(n for f in self.findings for n in f.nodes)

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n.op for n in self.nodes))

    @property
    def locations(self) -> tuple[SourceLocation, ...]:
        return tuple(n.source for n in self.nodes if n.source is not None)

    def render(self) -> str:
        where = f"partition {self.partition}: " if self.partition is not None else ""
        lines = [f"{where}{self.summary}"]
        for finding in self.findings:
            lines.append(f"  = {finding.message}")
            lines.extend(_render_node(n) for n in finding.nodes)
        lines.extend(_labelled("why", self.why))
        lines.extend(_labelled("fix", self.fix))
        for note in self.notes:
            lines.extend(_labelled("note", note))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    def __reduce__(self):  # keep the dataclass picklable despite RuntimeError's args
        return (_rebuild, (type(self), self.__dict__.copy()))


def _rebuild(cls: type, state: dict) -> OpenvinoExportError:
    error = cls.__new__(cls)
    error.__dict__.update(state)
    RuntimeError.__init__(error, error.render())
    return error


def _render_node(node: NodeRef) -> str:
    head = f"  --> {node.source}  {node.source.code}" if node.source is not None else "  --> (no source line recorded)"
    detail = f"{node.op}, node `{node.name}`"
    if node.module_path:
        detail += f", in {node.module_path}"
    return f"{head}\n      ({detail})"


def _labelled(label: str, text: str) -> Iterable[str]:
    if not text:
        return []
    first, *rest = text.strip().splitlines()
    pad = " " * (len(label) + 4)
    return [f"  {label}: {first}", *(pad + line for line in rest)]


@dataclass(eq=False)
class PassthroughOutputError(OpenvinoExportError):
    """A partition output is fed directly by a partition input (stale memory)."""

    output_indices: tuple[int, ...] = ()


@dataclass(eq=False)
class OutputTypeError(OpenvinoExportError):
    """OpenVINO computes a partition output in another element type than PyTorch."""

    output_indices: tuple[int, ...] = ()


@dataclass(eq=False)
class EdgeTensorError(OpenvinoExportError):
    """A partition input or output the runtime cannot bind correctly (dynamic output, 0-d, dtype)."""


@dataclass(eq=False)
class DimOrderError(OpenvinoExportError):
    """A tensor crosses the partition edge in a dim order the runtime does not read."""


@dataclass(eq=False)
class ConversionError(OpenvinoExportError):
    """OpenVINO's frontend or compiler refused a partition."""


@dataclass(eq=False)
class CpuKernelError(OpenvinoExportError):
    """An op left on the CPU that ExecuTorch's kernels cannot run: the program would fail at run time."""


@dataclass(eq=False)
class FusionOrderError(OpenvinoExportError):
    """ExecuTorch's partition fusing would leave an invalid program (a check placed after the output)."""


@dataclass(eq=False)
class DeviceError(OpenvinoExportError):
    """The compile spec names an OpenVINO device this machine does not have."""


@dataclass(eq=False)
class PassError(OpenvinoExportError):
    """One of this backend's graph rewrites failed: a bug here, reported with the node it was at."""


def pass_failure(step: str, error: Exception, partition: int | None = None) -> PassError:
    """``error``, raised inside ``step``, as a ``PassError`` naming the node ``step`` was rewriting.

    The node is the innermost ``node`` local of the failing frames that belong to
    this package: every rewrite loops over the graph with that name.
    """
    node = None
    frame = error.__traceback__
    while frame is not None:
        local = frame.tb_frame.f_locals.get("node")
        if frame.tb_frame.f_globals.get("__name__", "").startswith("openvino_backend.") and isinstance(
            local, torch.fx.Node
        ):
            node = local
        frame = frame.tb_next
    return PassError(
        summary=f"{step} failed: {type(error).__name__}: {error}",
        findings=(Finding("while rewriting this node", (NodeRef.from_node(node),)),) if node is not None else (),
        why="a rewrite this backend applies before OpenVINO's frontend met a graph it does not handle",
        fix="please report it with this message; meanwhile, keep the op on the CPU:\n"
        "OpenvinoPartitioner(op_types_to_skip={...}) with the op named above",
        partition=partition,
    )


@dataclass(eq=False)
class CompileSpecError(OpenvinoExportError):
    """A compile spec value this backend does not understand."""


@dataclass(eq=False)
class BackendConflictError(OpenvinoExportError):
    """Another ``OpenvinoBackend`` class is loaded; ExecuTorch may pick either."""
