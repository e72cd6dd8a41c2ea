"""Values for every node of a program, computed by eager PyTorch: what the numerical check
feeds OpenVINO and compares it with.

The user's sample inputs when given; otherwise draws shaped by each input's
``meta["val"]``, integers kept in a range every index op reading them accepts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from openvino_backend.graph import non_default_dim_order, op_name
from openvino_backend.ops import facts
from openvino_backend.timing import timed

logger = logging.getLogger(__name__)

SampleValues = dict[torch.fx.Node, object]

# Integer inputs no index op reads are drawn from [-INT_RANGE, INT_RANGE).
INT_RANGE = 8


@timed("numerical_check")
def sample_values(
    program: ExportedProgram, sample_inputs: Sequence[object] | None = None, *, seed: int = 0
) -> SampleValues | None:
    """Every node's value in eager PyTorch, from ``sample_inputs`` or from draws; None if that fails.

    Drawn integer inputs stay in a range every index op reading them accepts;
    if eager still refuses the draws (a division by zero, say), positive
    integers are tried once more.
    """
    placeholders = program.graph.find_nodes(op="placeholder")
    specs = program.graph_signature.input_specs
    if len(placeholders) != len(specs):
        logger.warning("numerical check skipped: the program's signature does not match its placeholders")
        return None
    user_inputs = [node for node, spec in zip(placeholders, specs, strict=True) if spec.kind == InputKind.USER_INPUT]
    attempts: list[list[object]] = []
    if sample_inputs is not None:
        given = [x for x in torch.utils._pytree.tree_leaves(sample_inputs)]
        if len(given) != len(user_inputs):
            raise ValueError(f"sample_inputs has {len(given)} tensors; the program takes {len(user_inputs)} inputs")
        attempts.append(given)
    else:
        for low in (None, 1):
            generator = torch.Generator().manual_seed(seed)
            attempts.append([_draw(node, generator, low) for node in user_inputs])
    error: Exception | None = None
    for inputs in attempts:
        try:
            return _propagate(program, inputs)
        except Exception as failure:  # eager refused these values; the check cannot run on them
            error = failure
    logger.warning("numerical check skipped: PyTorch could not run the program on sample values (%s)", error)
    return None


def _propagate(program: ExportedProgram, user_inputs: list[object]) -> SampleValues:
    values: SampleValues = {}
    constants = {**program.state_dict, **program.constants}
    fake = sorted(name for name, value in constants.items() if isinstance(value, FakeTensor))
    if fake:
        raise ValueError(f"the program's weights are fake tensors ({', '.join(fake[:3])}...)")
    given = iter(user_inputs)
    flat = []
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            flat.append(next(given))
        elif spec.target in constants:
            flat.append(constants[spec.target])
        else:
            raise ValueError(f"no value for input {spec.arg.name} ({spec.kind.name})")

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node: torch.fx.Node) -> object:
            values[node] = result = super().run_node(node)
            return result

    with torch.no_grad():
        Recorder(program.graph_module).run(*flat, enable_io_processing=False)
    return values


def _hint(size: int | torch.SymInt) -> int:
    if isinstance(size, int):
        return size
    hint = size.node.hint
    return int(hint) if hint is not None else int(size.node.shape_env.size_hint(size.node.expr))


def _draw(node: torch.fx.Node, generator: torch.Generator, low: int | None) -> object:
    val = node.meta.get("val")
    if isinstance(val, (int, torch.SymInt)):
        return _hint(val)
    if not isinstance(val, torch.Tensor):
        raise ValueError(f"cannot draw a value for input {node.name}")
    shape = [_hint(d) for d in val.shape]
    if val.dtype == torch.bool:
        x = torch.rand(shape, generator=generator) < 0.5
    elif val.dtype.is_floating_point:
        x = torch.randn(shape, generator=generator).to(val.dtype)
    else:
        bound = _index_bound(node)
        lo = low if low is not None else (0 if bound is not None else -INT_RANGE)
        hi = max(lo + 1, bound if bound is not None else INT_RANGE)
        x = torch.randint(lo, hi, shape, generator=generator, dtype=val.dtype)
    order = non_default_dim_order(val)
    if order is not None:  # same logical values, laid out in the input's dim order
        x = x.permute(order).contiguous().permute(tuple(np.argsort(order)))
    return x


def _index_bound(node: torch.fx.Node) -> int | None:
    """The smallest size ``node``'s values index into, over the index ops reading it."""
    bounds = []
    for user in node.users:
        where = facts(user).index
        if where is not None and len(user.args) > where[2] and user.args[where[2]] is node:
            data, dim = user.args[where[0]], (user.args[where[1]] if where[1] is not None else 0)
            bounds.append(_hint(data.meta["val"].shape[dim]))
        elif op_name(user) == "aten.index.Tensor":
            data, indices = user.args[0], user.args[1]
            bounds += [_hint(data.meta["val"].shape[i]) for i, index in enumerate(indices) if index is node]
    return min(bounds) if bounds else None
