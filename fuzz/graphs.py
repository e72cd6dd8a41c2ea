"""The hypothesis strategies that draw graphs: identity-like ones for the stale-memory
defences, compute ones for the numerical check."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st

from fuzz.op_table import ARITH_OPS, COMPUTE_OPS, DTYPES, DYNAMIC_RANGE, IDENTITY_OPS, Op, Value, result_of
from fuzz.spec import GraphSpec, Input, Step


@st.composite
def graphs(draw: st.DrawFn, max_inputs: int = 3, max_steps: int = 8, max_outputs: int = 3) -> GraphSpec:
    dim_order = draw(st.booleans())
    # About half the graphs have a dynamic dim 0, shared by the inputs whose dim 0 has the drawn size.
    dynamic_size = draw(st.integers(DYNAMIC_RANGE[0], 4)) if draw(st.booleans()) else None
    inputs = _draw_inputs(draw, max_inputs, dim_order, dynamic_size, DTYPES, channels_last=st.booleans())
    return _draw_steps(
        draw,
        inputs,
        dim_order,
        dynamic_size,
        max_steps,
        max_outputs,
        # Identity-like ops are what this fuzzer is about: draw them more often.
        lambda: IDENTITY_OPS if draw(st.integers(0, 2)) else COMPUTE_OPS,
    )


def _draw_inputs(
    draw: st.DrawFn,
    max_inputs: int,
    dim_order: bool,
    dynamic_size: int | None,
    dtypes: tuple[str, ...],
    channels_last: st.SearchStrategy[bool],
) -> list[Input]:
    """1 to ``max_inputs`` inputs of rank 1 to 4; the first has dim 0 of ``dynamic_size`` if given."""
    inputs = []
    for index in range(draw(st.integers(1, max_inputs))):
        rank = draw(st.integers(1, 4))
        shape = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
        if dynamic_size is not None and index == 0:
            shape = (dynamic_size, *shape[1:])
        dtype = draw(st.sampled_from(dtypes))
        # ExecuTorch runs channels-last only with dim order on.
        inputs.append(Input(shape, dtype, rank == 4 and dim_order and draw(channels_last)))
    return inputs


def _draw_steps(
    draw: st.DrawFn,
    inputs: list[Input],
    dim_order: bool,
    dynamic_size: int | None,
    max_steps: int,
    max_outputs: int,
    pool: Callable[[], tuple[Op, ...]],
) -> GraphSpec:
    values = [Value(i.shape, i.dtype) for i in inputs]
    steps = []
    for _ in range(draw(st.integers(1, max_steps))):
        ops = pool()
        first = draw(st.integers(0, len(values) - 1))
        candidates = []
        for op in ops:
            if op.arity == 1:
                args = (first,)
            else:
                partners = [j for j in range(len(values)) if op.applies((values[first], values[j]), dim_order)]
                if not partners:
                    continue
                args = (first, partners[draw(st.integers(0, len(partners) - 1))])
            if op.applies(tuple(values[i] for i in args), dim_order):
                candidates.append((op, args))
        if not candidates:
            continue
        op, args = candidates[draw(st.integers(0, len(candidates) - 1))]
        param = draw(st.integers(0, 3))
        steps.append(Step(op.name, args, param))
        values.append(result_of(op, tuple(values[i] for i in args), param))
    n_out = draw(st.integers(1, max_outputs))
    # Prefer the newest values, so chains end in outputs, but allow any (inputs too).
    outputs = tuple(draw(st.one_of(st.integers(0, len(values) - 1), st.just(len(values) - 1))) for _ in range(n_out))
    seed = draw(st.integers(0, 2**16))
    return GraphSpec(tuple(inputs), tuple(steps), outputs, dim_order, seed, dynamic_size)


COMPUTE_DTYPES = ("float32", "int64", "bool")


@st.composite
def compute_graphs(draw: st.DrawFn, max_inputs: int = 3, max_steps: int = 8, max_outputs: int = 3) -> GraphSpec:
    """General compute graphs over the op kinds OpenVINO claims, with some identity-like ops mixed in."""
    dim_order = draw(st.booleans())
    dynamic_size = draw(st.integers(DYNAMIC_RANGE[0], 4)) if draw(st.booleans()) else None
    quarter = st.integers(0, 3).map(lambda n: n == 0)  # channels-last for a quarter of 4-d inputs
    inputs = _draw_inputs(draw, max_inputs, dim_order, dynamic_size, COMPUTE_DTYPES, channels_last=quarter)
    pools = (ARITH_OPS, ARITH_OPS, COMPUTE_OPS, IDENTITY_OPS)
    return _draw_steps(
        draw, inputs, dim_order, dynamic_size, max_steps, max_outputs, lambda: draw(st.sampled_from(pools))
    )
