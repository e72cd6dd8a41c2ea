"""Rules for what may sit at the edge of an OpenVINO partition.

Each rule looks at one proposed partition and names the nodes that must stay
out of it, with a reason. The partitioner refuses those nodes and proposes
again until no rule objects, so every rule is free to be simple and local.

Why each rule exists:

* ``keep_boundary_copies_out``: OpenVINO's PyTorch frontend converts copies
  (``aten.clone``, ``aten.alias_copy``, ...) to nothing. A partition that
  returns a copy of one of its inputs becomes an ``ov.Model`` whose Result is
  fed by a Parameter; under ExecuTorch's binding order (inputs first, then
  outputs) the CPU plugin never writes that output and may overwrite the
  input. Two outputs that are copies of one tensor name a single OpenVINO
  tensor, which the frontend refuses. Copies used only inside the partition
  stay: OpenVINO skips them harmlessly.
* ``keep_non_default_dim_order_out`` (opt-in): the runtime binds every
  partition input and output as a tensor of its logical sizes over its data
  pointer. Preprocess adapts such tensors inside the ``ov.Model``
  (``edge_layout.py``), so this rule is not needed for correctness; it is
  there for users who would rather run layout changes on the CPU.
* ``keep_unbindable_tensors_out``: the runtime maps only some scalar types to
  OpenVINO element types, cannot bind 0-d or empty tensors, and never resizes an
  output of dynamic shape; any of these at the edge fails (or returns the
  wrong shape) at run time.
* ``keep_quantize_pairs_together``: OpenVINO takes a PT2E quantize /
  dequantize pair as one pattern and never computes the integer tensor
  between them; the pair never straddles the edge.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch.export import ExportedProgram

from openvino_backend.diagnostics import op_name
from openvino_backend.quantized import is_quantize

Rejection = tuple[torch.fx.Node, str]
BoundaryRule = Callable[["PartitionView"], Iterable[Rejection]]

# Ops OpenVINO's FX frontend translates to nothing (``op::skip_node``).
COPY_OPS = frozenset(
    {
        "aten.clone.default",
        "aten.alias.default",
        "aten.alias_copy.default",
        "aten.detach.default",
        "aten.detach_copy.default",
        "aten.lift_fresh_copy.default",
        "dim_order_ops._clone_dim_order.default",
    }
)
# Ops that are copies only when they keep the dtype (otherwise OpenVINO emits
# a Convert, which writes its output like any other op).
CAST_OPS = frozenset({"aten._to_copy.default", "dim_order_ops._to_dim_order_copy.default"})

# Scalar types the ExecuTorch OpenVINO runtime binds (convert_to_openvino_type).
RUNTIME_DTYPES = frozenset(
    {
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    }
)


def is_copy(node: torch.fx.Node) -> bool:
    """True when OpenVINO would convert ``node`` to its input unchanged."""
    if node.op != "call_function":
        return False
    op = op_name(node)
    if op in COPY_OPS:
        return True
    if op in CAST_OPS:
        source = node.args[0] if node.args else None
        return isinstance(source, torch.fx.Node) and _dtype(source) == _dtype(node)
    return False


def _val(node: torch.fx.Node) -> object:
    return node.meta.get("val")


def _dtype(node: torch.fx.Node) -> torch.dtype | None:
    val = _val(node)
    return val.dtype if isinstance(val, torch.Tensor) else None


def non_default_dim_order(val: object) -> tuple[int, ...] | None:
    """The dim order of ``val`` when its memory is not laid out contiguously.

    A tensor whose layout equals the contiguous one (channels-last with
    H = W = 1, say) is fine whatever its dim order says: the runtime reads the
    same bytes either way.
    """
    if not isinstance(val, torch.Tensor) or val.is_contiguous():
        return None
    return tuple(val.dim_order(ambiguity_check=False))


@dataclass(frozen=True)
class PartitionView:
    """One proposed partition inside its program, with edge queries."""

    nodes: frozenset[torch.fx.Node]
    program: ExportedProgram
    # What the rules compute about this partition and may share (its conversion), for one round.
    memo: dict[str, object] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def leaves(self, node: torch.fx.Node) -> bool:
        """True when ``node``'s result is used outside the partition."""
        return any(user not in self.nodes for user in node.users)

    @cached_property
    def _owned_constants(self) -> frozenset[torch.fx.Node]:
        return frozenset(owned_constants(self.program, self.nodes))

    def inputs(self) -> Iterator[torch.fx.Node]:
        """Nodes outside the partition whose results it reads at run time."""
        seen: set[torch.fx.Node] = set()
        for node in self.ordered():
            for source in node.all_input_nodes:
                if source not in self.nodes and source not in seen and source not in self._owned_constants:
                    seen.add(source)
                    yield source

    def outputs(self) -> Iterator[torch.fx.Node]:
        return (node for node in self.ordered() if self.leaves(node))

    def ordered(self) -> list[torch.fx.Node]:
        """The partition's nodes in graph (topological) order."""
        return [node for node in self.program.graph.nodes if node in self.nodes]

    def copy_root(self, node: torch.fx.Node) -> torch.fx.Node:
        """The tensor ``node`` is a copy of, following copy chains inside the partition."""
        while is_copy(node) and node in self.nodes:
            node = node.args[0]
        return node


def owned_constants(program: ExportedProgram, nodes: Collection[torch.fx.Node]) -> dict[torch.fx.Node, torch.Tensor]:
    """Constant inputs read only by ``nodes``, with their values.

    ``tag_constant_data`` makes them part of the delegate: they never cross
    the edge at run time, and preprocess sees them as constants.
    """
    sig = program.graph_signature
    targets = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    mutated = set(sig.buffers_to_mutate.values())
    values = {**program.state_dict, **program.constants}
    return {
        node: values[targets[node.name]]
        for node in program.graph.find_nodes(op="placeholder")
        if node.name in targets
        and targets[node.name] not in mutated
        and targets[node.name] in values
        and node.users
        and all(user in nodes for user in node.users)
    }


def keep_boundary_copies_out(part: PartitionView) -> Iterator[Rejection]:
    """A copy may leave the partition only if it is the sole name of a tensor computed inside."""
    leaving_by_root: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in part.outputs():
        if not is_copy(node):
            continue
        root = part.copy_root(node)
        if root not in part.nodes and changes_layout(root, node):
            # Preprocess adapts each edge tensor to its own dim order (edge_layout.py): between
            # an input and an output in different orders OpenVINO moves the data, a real op.
            continue
        if root not in part.nodes:
            yield (
                node,
                (
                    f"copy of partition input `{root.name}` whose result leaves the partition: "
                    "OpenVINO converts it to nothing, and the runtime would return stale memory"
                ),
            )
        else:
            leaving_by_root.setdefault(root, []).append(node)
    for root, copies in leaving_by_root.items():
        # One name per tensor: the root itself if it leaves, else the first copy.
        kept = () if part.leaves(root) else copies[:1]
        for node in copies:
            if node not in kept:
                yield (
                    node,
                    (
                        f"copy of `{root.name}`, which already leaves the partition: "
                        "OpenVINO converts it to nothing, so both outputs would name one tensor"
                    ),
                )


def changes_layout(source: torch.fx.Node, copy: torch.fx.Node) -> bool:
    """True when ``copy`` lays ``source``'s values out in another dim order."""
    return non_default_dim_order(_val(source)) != non_default_dim_order(_val(copy))


def is_getitem(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and op_name(node) == "getitem"


def tensors_read(source: torch.fx.Node, readers: Iterable[torch.fx.Node]) -> list[object]:
    """The values of ``source`` that ``readers`` take: the value itself, or the tuple elements they pick.

    Multi-output ops (``_native_batch_norm_legit_no_training``, ``max_pool2d_with_indices``,
    ...) hold a tuple in ``meta["val"]``; their tensors cross a partition edge
    through ``getitem`` nodes, which ExecuTorch's fuser pulls into the delegate
    beside their producer. A rule about edge tensors must look at those tensors.
    """
    val = _val(source)
    if not isinstance(val, (tuple, list)):
        return [val]
    picked: list[object] = []
    for reader in readers:
        if is_getitem(reader) and isinstance(reader.args[1], int):
            picked.append(val[reader.args[1]])
        else:
            picked.extend(val)
    return picked


def first_problem(values: Iterable[object], problem: Callable[[object], str | None]) -> str | None:
    return next((why for why in map(problem, values) if why is not None), None)


def _reject_at_edge(
    part: PartitionView,
    output_problem: Callable[[object], str | None],
    input_problem: Callable[[object], str | None],
) -> Iterator[Rejection]:
    """Reject each output whose value has a problem, and each reader of an input that has one."""
    for node in part.outputs():
        leaving = tensors_read(node, (user for user in node.users if user not in part.nodes))
        if (why := first_problem(leaving, output_problem)) is not None:
            yield node, f"result leaves the partition {why}"
    for source in part.inputs():
        readers = [user for user in source.users if user in part.nodes]
        if (why := first_problem(tensors_read(source, readers), input_problem)) is None:
            continue
        for user in readers:
            yield user, f"reads `{source.name}` from outside the partition {why}"


def _in_dim_order(val: object) -> str | None:
    order = non_default_dim_order(val)
    if order is None:
        return None
    return f"in dim order {order}; the OpenVINO runtime binds edge tensors by their logical sizes"


def keep_non_default_dim_order_out(part: PartitionView) -> Iterator[Rejection]:
    """No tensor crosses the partition edge in a non-default dim order (opt-in; see module doc)."""
    return _reject_at_edge(part, _in_dim_order, _in_dim_order)


def unbindable(val: object) -> str | None:
    """Why the runtime cannot bind ``val`` at the partition edge, or None."""
    if not isinstance(val, torch.Tensor):
        return None
    if val.dtype not in RUNTIME_DTYPES:
        return f"as {val.dtype}, which the OpenVINO runtime cannot bind"
    if val.dim() == 0:
        # create_ov_tensor builds an ov_shape of the tensor's rank, and OpenVINO's
        # C API refuses rank 0: the delegate fails with error 0x1 at run time.
        return "as a 0-d tensor, which the OpenVINO runtime cannot bind (error 0x1 at run time)"
    if any(isinstance(d, int) and d == 0 for d in val.shape):
        # OpenVINO's C API refuses a tensor over no memory: error 0x1 at run time.
        return f"as an empty tensor {tuple(val.shape)}, which the OpenVINO runtime cannot bind (error 0x1 at run time)"
    return None


def unbindable_output(val: object) -> str | None:
    """Why the runtime cannot hand ``val`` back as a partition output, or None."""
    if isinstance(val, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return "as a scalar, which the OpenVINO runtime cannot return (it expects a tensor: error 0x12)"
    if (why := unbindable(val)) is not None:
        return why
    if isinstance(val, torch.Tensor) and not all(isinstance(d, int) for d in val.shape):
        # ExecuTorch plans a dynamic output at its upper bound and the OpenVINO
        # runtime never resizes it: the program would return the wrong shape.
        return f"with dynamic shape {tuple(val.shape)}, which the OpenVINO runtime does not resize"
    return None


def keep_unbindable_tensors_out(part: PartitionView) -> Iterator[Rejection]:
    """Every tensor at the edge must be one the runtime can bind (dtype, rank, static output size)."""
    return _reject_at_edge(part, unbindable_output, unbindable)


def keep_quantize_pairs_together(part: PartitionView) -> Iterator[Rejection]:
    """A quantize and the dequantize reading it sit on the same side of the edge.

    OpenVINO takes the pair as one pattern (a FakeQuantize on float values, or an
    INT8 kernel's input): it never computes the integer tensor between them, so
    that tensor cannot cross the edge, and ExecuTorch's runtime has no kernel for
    either half. Kept out, the half the partition cannot hold takes its partner
    with it, and the reason names both.
    """
    for node in part.outputs():
        if is_quantize(node):
            yield node, "quantize whose dequantize runs outside the partition: " + _PAIR_WHY
    for source in part.inputs():
        if is_quantize(source):
            for user in source.users:
                if user in part.nodes:
                    yield user, f"reads quantize `{source.name}`, which runs outside the partition: " + _PAIR_WHY


_PAIR_WHY = (
    "OpenVINO takes a quantize / dequantize pair as one pattern and never computes the integer "
    "tensor between them, so the pair cannot be split at the partition edge"
)


DEFAULT_RULES: tuple[BoundaryRule, ...] = (
    keep_boundary_copies_out,
    keep_unbindable_tensors_out,
    keep_quantize_pairs_together,
)
