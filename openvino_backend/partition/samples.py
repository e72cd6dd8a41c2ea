"""Values for every node of a program, computed by eager PyTorch: what the numerical check
feeds OpenVINO and compares it with.

The user's sample inputs when given; otherwise draws shaped by each input's
``meta["val"]``, integers kept in a range every index op reading them accepts.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.utils.flop_counter import flop_registry

from openvino_backend.graph import non_default_dim_order, op_name
from openvino_backend.ops import facts
from openvino_backend.partition import rows as row_blocks
from openvino_backend.partition.rows import RESHAPES, maps_rows, nbytes, row_part, row_ratio, static_shape
from openvino_backend.timing import timed
from openvino_backend.transform.fold import mutated_in_place

logger = logging.getLogger(__name__)

# A value at least this large that computing again gives again is recomputed when asked for, not held:
# one a cheap op computes from other values from a mebibyte; a value of the weights alone from 64 KiB (a compressed
# weight's unpacking steps are each smaller than a mebibyte in small layers, and a decoder has hundreds).
RECOMPUTED_BYTES = 1 << 20
RECOMPUTED_WEIGHT_BYTES = 1 << 16


class SampleValues(Mapping[torch.fx.Node, object]):
    """Every node's value in eager PyTorch.

    A large value that computing again from its inputs gives again, and cheaply, is computed
    again each time it is asked for, not held: one computed from the weights alone (a weight
    transposed, a compressed weight dequantized: a model's weights pass through several such
    steps), and one whose op costs about what reading its inputs costs (a copy, a layout change,
    a cast, arithmetic element by element, an index: an LLM's cache passes through several per
    layer, updated, its key and value heads expanded for every query head, its keys scaled).
    Holding each would hold the weights' and the caches' memory several times over while the
    partitions are checked. What a contraction computes (a matmul, a convolution, an attention)
    is held.
    """

    _RECOMPUTED = object()  # held in place of a value computed again when asked for

    def __init__(self) -> None:
        self._values: dict[torch.fx.Node, object] = {}
        # The nodes computed from the weights alone (the weights among them): OpenVINO folds them.
        self.from_weights: set[torch.fx.Node] = set()

    def record(self, node: torch.fx.Node, value: object, *, recomputable: bool, from_weights: bool = False) -> None:
        """``value``, computed for ``node``; ``recomputable``: computing ``node`` again from the
        values of its inputs gives ``value`` again; ``from_weights``: from the weights alone."""
        recomputed = (
            recomputable
            and node.op == "call_function"
            and torch.Tag.nondeterministic_seeded not in getattr(node.target, "tags", ())
            and isinstance(value, torch.Tensor)
            and value.nbytes >= (RECOMPUTED_WEIGHT_BYTES if from_weights else RECOMPUTED_BYTES)
        )
        self._values[node] = self._RECOMPUTED if recomputed else value
        if from_weights:
            self.from_weights.add(node)

    def defer(self, node: torch.fx.Node) -> bool:
        """Hold nothing for ``node``, computed from the weights alone, and compute it when asked for,
        if its ``meta["val"]`` says it is large enough; True if so. A weight's steps then never
        stand whole side by side: a value read is computed by rows where its steps allow."""
        if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            return False
        if nbytes(node) < RECOMPUTED_WEIGHT_BYTES:
            return False
        self._values[node] = self._RECOMPUTED
        self.from_weights.add(node)
        return True

    def recomputes(self, node: torch.fx.Node) -> bool:
        """True when ``node``'s value is computed again each time it is asked for."""
        return self._values.get(node) is self._RECOMPUTED

    def __getitem__(self, node: torch.fx.Node) -> object:
        value = self._values[node]
        return value if value is not self._RECOMPUTED else self._recompute(node)

    def _recompute(self, node: torch.fx.Node) -> object:
        """``node``'s value computed again, with the values it reads that are computed again too:
        each once (a value read twice on the way is computed once), and each let go once its last
        reader here has it (a dequantized weight's steps are not all held at once). A large value
        whose steps each map rows to rows (a weight's unpacking, cast and scale) is computed a block
        of rows at a time into its own tensor: no step is ever whole beside the next."""
        order: list[torch.fx.Node] = []  # what is computed again, each after what it reads
        finished: set[torch.fx.Node] = set()
        opened: set[torch.fx.Node] = set()
        stack = [node]
        while stack:
            current = stack[-1]
            if current in finished:
                stack.pop()
            elif current in opened:  # what it reads is computed: it can be
                finished.add(current)
                order.append(current)
                stack.pop()
            else:
                opened.add(current)
                stack += [a for a in current.all_input_nodes if self.recomputes(a) and a not in finished]
        by_rows = self._by_rows(order)
        large = {current for current in by_rows if nbytes(current) > row_blocks.ROWS_BYTES}
        # A step by rows whose readers here are all computed by rows is computed inside theirs, never whole.
        inside = (
            {a for current in order if current in large for a in current.all_input_nodes if a in by_rows}
            - {a for current in order if current not in large for a in current.all_input_nodes}
            - {node}
        )
        readers = Counter(a for current in order for a in current.all_input_nodes if self.recomputes(a))
        done: dict[torch.fx.Node, object] = {}
        for current in order:
            if current in inside:
                continue
            if current in large:
                done[current] = self._compute_by_rows(current, order, by_rows, done)
            else:
                done[current] = self._compute(current, done)
            for arg in current.all_input_nodes:
                if arg in done and arg is not current:
                    readers[arg] -= 1
                    if readers[arg] == 0:
                        del done[arg]
        return done[node]

    def _by_rows(self, order: list[torch.fx.Node]) -> set[torch.fx.Node]:
        """The nodes of ``order`` whose value's block of rows (leading dim) is computed from the same
        block of what they read: element by element ops, casts and copies, reshapes and stacks that
        keep the leading dim, each reading values of the same leading dim or broadcast over it."""
        rows: set[torch.fx.Node] = set()
        for current in order:
            shape = static_shape(current)
            if not shape or shape[0] < 2 or current.op != "call_function" or not maps_rows(current):
                continue
            reads = [a for a in current.all_input_nodes if self.recomputes(a)]
            if any(a not in rows or static_shape(a)[0] != shape[0] * row_ratio(current) for a in reads):
                continue
            held = [self._values[a] for a in current.all_input_nodes if not self.recomputes(a)]
            if all(row_part(x, shape, op_name(current)) is not None for x in held):
                rows.add(current)
        return rows

    def _compute_by_rows(
        self,
        node: torch.fx.Node,
        order: list[torch.fx.Node],
        rows: set[torch.fx.Node],
        done: Mapping[torch.fx.Node, object],
    ) -> torch.Tensor:
        """``node``'s value computed ``ROWS_BYTES`` of it at a time, with the steps in ``rows`` it
        needs (``order`` has them in the order they compute)."""
        needed, pending = {node}, [node]
        while pending:
            for arg in pending.pop().all_input_nodes:
                if arg in rows and arg not in done and arg not in needed:
                    needed.add(arg)
                    pending.append(arg)
        steps = [current for current in order if current in needed]
        shape, meta = static_shape(node), node.meta["val"]
        out = torch.empty_strided(shape, meta.stride(), dtype=meta.dtype)
        step = max(1, row_blocks.ROWS_BYTES * shape[0] // max(1, nbytes(node)))
        for start in range(0, shape[0], step):
            stop = min(start + step, shape[0])
            block: dict[torch.fx.Node, object] = {}
            for current in steps:
                full, name = static_shape(current), op_name(current)
                scale = full[0] // shape[0]  # its rows per row of the result
                read = functools.partial(self._block_read, block, done, full, name, shape[0], slice(start, stop))
                args, kwargs = torch.fx.node.map_arg((current.args, current.kwargs), read)
                if name in RESHAPES:
                    args = (args[0], [(stop - start) * scale, *full[1:]], *args[2:])
                with torch.no_grad():
                    block[current] = current.target(*args, **kwargs)
            out[start:stop] = block[node]
        return out

    def _block_read(
        self,
        block: Mapping[torch.fx.Node, object],
        done: Mapping[torch.fx.Node, object],
        shape: tuple[int, ...],
        name: str,
        rows: int,
        result_rows: slice,
        arg: torch.fx.Node,
    ) -> object:
        """What a step of op ``name`` and ``shape`` reads of ``arg`` for the block ``result_rows`` of a
        result of ``rows`` rows: the rows of ``arg`` that block comes from, or ``arg`` whole (a value
        broadcast over the rows)."""
        if arg in block:
            return block[arg]
        if arg in done:  # a step by rows, computed before: its rows for this block
            scale = static_shape(arg)[0] // rows
            return done[arg][result_rows.start * scale : result_rows.stop * scale]
        value = self._values[arg]
        if row_part(value, shape, name) != "rows":
            return value
        scale = shape[0] // rows
        return value[result_rows.start * scale : result_rows.stop * scale]

    def _compute(self, node: torch.fx.Node, done: Mapping[torch.fx.Node, object]) -> object:
        args, kwargs = torch.fx.node.map_arg(
            (node.args, node.kwargs), lambda arg: done[arg] if arg in done else self._values[arg]
        )
        with torch.no_grad():
            # A layout copy computed again is its view: the same values, without a second weight-sized
            # tensor (a linear's weight reaches its matmul through a permute_copy).
            view = _VIEWS.get(op_name(node))
            if view is not None and not kwargs and isinstance(args[0], torch.Tensor):
                return view(*args)
            return node.target(*args, **kwargs)

    def __iter__(self) -> Iterator[torch.fx.Node]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


# What the propagation puts for a value computed from the weights alone until something reads it.
_DEFERRED = object()

# Copies whose values a view of their input gives.
_VIEWS = {
    "aten.permute_copy.default": torch.permute,
    "aten.expand_copy.default": lambda x, size, implicit=False: x.expand(size),
    "aten.view_copy.default": torch.reshape,
}

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
    values = SampleValues()
    constants = {**program.state_dict, **program.constants}
    fake = sorted(name for name, value in constants.items() if isinstance(value, FakeTensor))
    if fake:
        raise ValueError(f"the program's weights are fake tensors ({', '.join(fake[:3])}...)")
    given = iter(user_inputs)
    flat = []
    weights: set[torch.fx.Node] = set()  # nodes computed from the weights alone
    # A tensor written in place would not be computed again as it was: it, and what reads it, is held.
    written = mutated_in_place(program.graph)
    placeholders = program.graph.find_nodes(op="placeholder")
    for node, spec in zip(placeholders, program.graph_signature.input_specs, strict=True):
        if spec.kind == InputKind.USER_INPUT:
            flat.append(next(given))
        elif spec.target in constants:
            flat.append(constants[spec.target])
            if node not in written:
                weights.add(node)
        else:
            raise ValueError(f"no value for input {spec.arg.name} ({spec.kind.name})")

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node: torch.fx.Node) -> object:
            unchanged = node not in written and not any(n in written for n in node.all_input_nodes)
            if node.op == "call_function" and unchanged and all(n in weights for n in node.all_input_nodes):
                weights.add(node)
                if values.defer(node):  # computed when a value not of the weights alone reads it
                    return _DEFERRED
            result = super().run_node(node)
            from_weights = node in weights
            values.record(
                node, result, recomputable=from_weights or (unchanged and _cheap(node)), from_weights=from_weights
            )
            return result

        def fetch_args_kwargs_from_env(self, node: torch.fx.Node) -> tuple[tuple, dict]:
            deferred = [arg for arg in node.all_input_nodes if self.env.get(arg) is _DEFERRED]
            for arg in deferred:
                self.env[arg] = values[arg]
            try:
                return super().fetch_args_kwargs_from_env(node)
            finally:
                for arg in deferred:
                    self.env[arg] = _DEFERRED

    with torch.no_grad():
        Recorder(program.graph_module).run(*flat, enable_io_processing=False)
    return values


def _cheap(node: torch.fx.Node) -> bool:
    """True when computing ``node`` costs about what reading its inputs costs: a copy of some of
    its input's values (a view's copy, a layout or dim-order change), or an ATen op PyTorch counts
    no flops for (``torch.utils.flop_counter`` counts the contractions)."""
    if node.op != "call_function":
        return False
    if torch.Tag.view_copy in getattr(node.target, "tags", ()) or facts(node).copy is not None:
        return True
    op = getattr(node.target, "_op", node.target)  # an edge op wraps its ATen op
    return isinstance(op, torch._ops.OpOverload) and op.namespace == "aten" and op.overloadpacket not in flop_registry


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
