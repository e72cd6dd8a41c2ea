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
  (``lowering/edge_layout.py``), so this rule is not needed for correctness; it is
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

from collections.abc import Callable, Iterator

import torch

from openvino_backend.graph import first_problem, non_default_dim_order, tensors_read
from openvino_backend.ops import is_copy, is_quantize
from openvino_backend.partition.view import Objection, PartitionView, Rule
from openvino_backend.runtime import unbindable, unbindable_output


def keep_boundary_copies_out(part: PartitionView) -> Iterator[Objection]:
    """A copy may leave the partition only if it is the sole name of a tensor computed inside."""
    leaving_by_root: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in part.outputs():
        if not is_copy(node):
            continue
        root = part.copy_root(node)
        if root not in part.nodes and changes_layout(root, node):
            # Preprocess adapts each edge tensor to its own dim order (lowering/edge_layout.py): between
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
    return non_default_dim_order(source.meta.get("val")) != non_default_dim_order(copy.meta.get("val"))


def _reject_at_edge(
    part: PartitionView,
    output_problem: Callable[[object], str | None],
    input_problem: Callable[[object], str | None],
) -> Iterator[Objection]:
    """Reject each output the runtime binds whose value has a problem, and each reader of a bound
    input that has one (a buffer the partition holds as OpenVINO state is never bound)."""
    for node in part.bound_outputs():
        leaving = tensors_read(node, (user for user in node.users if user not in part.nodes))
        if (why := first_problem(leaving, output_problem)) is not None:
            yield node, f"result leaves the partition {why}"
    for source in part.bound_inputs():
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


def keep_non_default_dim_order_out(part: PartitionView) -> Iterator[Objection]:
    """No tensor crosses the partition edge in a non-default dim order (opt-in; see module doc)."""
    return _reject_at_edge(part, _in_dim_order, _in_dim_order)


def keep_unbindable_tensors_out(part: PartitionView) -> Iterator[Objection]:
    """Every tensor at the edge must be one the runtime can bind (dtype, rank, static output size).

    A node kept out takes with it the producers inside the partition whose values it reads and the
    runtime could not bind either: once it runs on the CPU those values leave the partition, and
    would be kept out in turn. Refused together, a dynamic-shape decoder cut in its middle settles in
    one round of proposals, not one per op back to where its shapes are static."""
    kept: dict[torch.fx.Node, str] = {}
    for node, why in _reject_at_edge(part, unbindable_output, unbindable):
        kept.setdefault(node, why)
    readers = list(kept)
    while readers:
        reader = readers.pop()
        for source in reader.all_input_nodes:
            if source not in part.nodes or source in kept:
                continue
            if (why := first_problem(tensors_read(source, [reader]), unbindable_output)) is not None:
                kept[source] = f"result leaves the partition {why} once `{reader.name}`, kept out, reads it"
                readers.append(source)
    yield from kept.items()


def keep_quantize_pairs_together(part: PartitionView) -> Iterator[Objection]:
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


DEFAULT_RULES: tuple[Rule, ...] = (
    keep_boundary_copies_out,
    keep_unbindable_tensors_out,
    keep_quantize_pairs_together,
)
