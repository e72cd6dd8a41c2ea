"""OpenVINO's own mistakes: constant subgraphs folded by PyTorch, every partition run against PyTorch."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from executorch.exir import EdgeCompileConfig, to_edge

import openvino_backend.lowering.preprocess as preprocess
import openvino_backend.partition.numerical as numerical
import openvino_backend.partition.partitioner as partitioner_module
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.partition.samples import SampleValues, sample_values
from openvino_backend.tools.verify import check_run, lower
from tests.harness import NO_DIM_ORDER, execute_layer_test, non_delegated_ops


class ShiftByAbsRange(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # OpenVINO 2026.4.1 converts this to Range -> Convert -> Abs -> Subtract and loses the
        # Abs of the negative element: element 0 comes back as x + 1 instead of x - 1.
        return x - torch.arange(-1, 7).abs()


class CopyThenSin(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        y = x.clone()
        return y, torch.sin(y)


class Lookup(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(5, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.table(ids)) * 2


def _kept_out(partitioner: OpenvinoPartitioner) -> dict[str, str]:
    return {kept.node.op: kept.reason for kept in partitioner.report.kept_out}


@pytest.mark.isa
def test_openvino_miscomputes_the_range_when_nothing_guards_it() -> None:
    """The case is real: without folding or the check, the lowered program is wrong."""
    x = torch.randn(8)
    partitioner = OpenvinoPartitioner(fold_constants=False, check_numerics=False)
    program = lower(ShiftByAbsRange(), (x,), partitioner=partitioner)
    report = check_run(ShiftByAbsRange(), program.buffer, (x,))
    assert not report.outputs[0].values_ok


def test_constant_subgraphs_are_computed_by_pytorch() -> None:
    partitioner = OpenvinoPartitioner(check_numerics=False)
    program = execute_layer_test(ShiftByAbsRange(), (torch.randn(8),), partitioner=partitioner)
    graph = program.exported_program().graph_module.lowered_module_0.original_module.graph
    ops = {str(node.target) for node in graph.nodes if node.op == "call_function"}
    assert not any("arange" in op or "abs" in op for op in ops), ops


def test_large_constants_are_left_to_run_time() -> None:
    class Masked(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # 1 MiB of bool. (Built with ops every OpenVINO line tested converts: `% 3` would leave
            # the remainder on the CPU on 2025.4, whose frontend has no rule for it.)
            mask = torch.arange(1024 * 1024).reshape(1024, 1024).bitwise_and(3) == 0
            return x.masked_fill(mask, 0.0)

    partitioner = OpenvinoPartitioner(check_numerics=False)
    program = execute_layer_test(Masked(), (torch.randn(1024, 1024),), partitioner=partitioner)
    graph = program.exported_program().graph_module.lowered_module_0.original_module.graph
    assert any("arange" in str(node.target) for node in graph.nodes)


@pytest.mark.isa
def test_numerical_check_keeps_the_miscomputed_op_out() -> None:
    partitioner = OpenvinoPartitioner(fold_constants=False)
    execute_layer_test(ShiftByAbsRange(), (torch.randn(8),), expected_partitions=None, partitioner=partitioner)
    kept = _kept_out(partitioner)
    assert "aten.abs.default" in kept
    assert "differently from PyTorch" in kept["aten.abs.default"]
    assert "where PyTorch gives 1" in kept["aten.abs.default"]
    assert partitioner.numerical_check is not None
    assert [op for op, _ in partitioner.numerical_check.narrowed] == ["aten.abs.default"]


class ShiftThenLayers(torch.nn.Module):
    """``ShiftByAbsRange``'s miscomputed range, then two layers: in bf16 its error (about 0.1 at the
    output) stays within the rounding two layers allow."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(128, 128) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x - torch.arange(-1, 127).abs()
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


@pytest.mark.isa
def test_a_wrong_result_within_a_reduced_precision_s_rounding_is_still_found() -> None:
    partitioner = OpenvinoPartitioner(fold_constants=False)
    torch.manual_seed(0)
    execute_layer_test(
        ShiftThenLayers(), (torch.randn(2, 128),), expected_partitions=None, partitioner=partitioner, terms=128
    )
    assert partitioner.numerical_check is not None
    assert [op for op, _ in partitioner.numerical_check.narrowed] == ["aten.abs.default"]


@pytest.mark.isa
def test_numerical_check_alone_keeps_a_passthrough_from_returning_stale_memory(monkeypatch) -> None:
    """With the copy rules, the conversion check and the validator all off, the check still holds."""
    monkeypatch.setattr(preprocess, "validate_model", lambda *a, **k: None)
    monkeypatch.setattr(preprocess, "validate_compiled", lambda *a, **k: None)
    partitioner = OpenvinoPartitioner(boundary_rules=(), check_by_conversion=False)
    program = execute_layer_test(
        CopyThenSin(),
        (torch.randn(3, 4),),
        expected_partitions=None,
        partitioner=partitioner,
        compile_config=NO_DIM_ORDER,
    )
    assert "aten.clone.default" in _kept_out(partitioner)
    assert "clone.out" in non_delegated_ops(program)


class Layers(torch.nn.Module):
    """Four layers of 64 KiB weights."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(128, 128) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def _counting_runs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    runs: list[list[str]] = []
    convert = numerical.convert_partition

    def counted(program: object, nodes: list[torch.fx.Node]) -> object:
        runs.append([str(node.target) for node in nodes])
        return convert(program, nodes)

    monkeypatch.setattr(numerical, "convert_partition", counted)
    return runs


def test_a_partition_reading_more_weights_than_a_stretch_is_checked_a_stretch_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(numerical, "STRETCH_BYTES", 100 << 10)  # a layer (65 KiB), not two
    runs = _counting_runs(monkeypatch)
    partitioner = OpenvinoPartitioner()
    torch.manual_seed(0)
    execute_layer_test(Layers(), (torch.randn(2, 128),), partitioner=partitioner, terms=128)
    assert partitioner.numerical_check is not None and partitioner.numerical_check.unchecked == 0
    # One run a layer, each on its own, every node in exactly one.
    assert [sum("addmm" in op for op in run) for run in runs] == [1, 1, 1, 1]
    assert sum(len(run) for run in runs) == partitioner.report.delegated_nodes


class TiedTable(Layers):
    """An int8 table dequantized once, read by the lookup at the start and the projection at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randint(-127, 128, (512, 128), dtype=torch.int8))
        self.register_buffer("scale", torch.rand(512, 1) / 100)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        table = self.table.float() * self.scale
        return super().forward(table[ids]) @ table.T


def test_what_the_weights_alone_give_is_computed_in_each_stretch_not_handed_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(numerical, "STRETCH_BYTES", 100 << 10)
    inputs: list[tuple[torch.Size, ...]] = []
    convert = numerical.convert_partition

    def recorded(program: object, nodes: list[torch.fx.Node]) -> object:
        result = convert(program, nodes)
        inputs.append(tuple(node.meta["val"].shape for node in result.inputs))
        return result

    monkeypatch.setattr(numerical, "convert_partition", recorded)
    outputs: list[tuple[tuple[int, ...], ...]] = []
    run = numerical.run_like_runtime

    def judged(compiled: object, feeds: list, planned: list) -> object:
        outputs.append(tuple(tuple(numpy.shape) for numpy in planned))
        return run(compiled, feeds, planned)

    monkeypatch.setattr(numerical, "run_like_runtime", judged)
    partitioner = OpenvinoPartitioner()
    torch.manual_seed(0)
    execute_layer_test(TiedTable(), (torch.tensor([[1, 7, 300]]),), partitioner=partitioner, terms=128)
    assert len(inputs) > 1, "checked in one run"
    assert not [shapes for shapes in inputs if torch.Size([512, 128]) in shapes], inputs
    assert outputs and not [shapes for shapes in outputs if (512, 128) in shapes], outputs


class CopyThenLayers(Layers):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.clone()
        return y, super().forward(y)


@pytest.mark.isa
def test_a_stretch_that_returns_stale_memory_is_narrowed_to_its_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check alone (no copy rules, conversion check or validator) keeps the clone of an input out,
    found in the first of four stretches."""
    monkeypatch.setattr(numerical, "STRETCH_BYTES", 100 << 10)
    monkeypatch.setattr(preprocess, "validate_model", lambda *a, **k: None)
    monkeypatch.setattr(preprocess, "validate_compiled", lambda *a, **k: None)
    runs = _counting_runs(monkeypatch)
    partitioner = OpenvinoPartitioner(boundary_rules=(), check_by_conversion=False)
    torch.manual_seed(0)
    program = execute_layer_test(
        CopyThenLayers(),
        (torch.randn(2, 128),),
        expected_partitions=None,
        partitioner=partitioner,
        compile_config=NO_DIM_ORDER,
        terms=128,
    )
    assert "aten.clone.default" in _kept_out(partitioner)
    assert "clone.out" in non_delegated_ops(program)
    assert all(sum("addmm" in op for op in run) <= 1 for run in runs), "a run took more than one stretch"


class CopyBetweenLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.layers[0](x))
        y = h.clone()
        z = torch.tanh(self.layers[2](torch.tanh(self.layers[1](y))))
        return z + y


def test_a_copy_at_the_start_of_a_stretch_is_not_taken_for_stale_memory() -> None:
    """A stretch starting with a copy of a value it is handed returns that copy straight from its
    input: no runtime binds either, so it is not judged; the same copy of the partition's own input,
    leaving the partition, is."""
    x = torch.randn(2, 16)
    program = to_edge(torch.export.export(CopyBetweenLayers(), (x,)), compile_config=NO_DIM_ORDER).exported_program()
    values = sample_values(program, (x,))
    assert values is not None
    check = numerical.NumericalCheck(program, values)
    nodes = [node for node in program.graph.nodes if node.op == "call_function"]
    start = next(i for i, node in enumerate(nodes) if "clone" in node.name)
    stretch = nodes[start : start + 4]  # the copy and the second layer
    assert "tanh" in stretch[-1].name
    (x_node,) = (node for node in program.graph.find_nodes(op="placeholder") if node.name == "x")
    inside = (frozenset({x_node}), frozenset({nodes[-1]}))
    assert check.run(stretch, edge=inside) is None
    # Were the clone's input and output the partition's edge, its output would be stale memory.
    at_the_edge = (frozenset({stretch[0].args[0]}), frozenset({stretch[0]}))
    mismatch = check.run(stretch, edge=at_the_edge)
    assert mismatch is not None and mismatch.node is stretch[0], mismatch


def test_drawn_indices_stay_in_the_range_the_index_op_accepts() -> None:
    partitioner = OpenvinoPartitioner()
    execute_layer_test(Lookup().eval(), (torch.tensor([[0, 4, 2]]),), expected_partitions=None, partitioner=partitioner)
    assert partitioner.numerical_check is not None  # PyTorch ran the program on drawn ids


def test_sample_inputs_must_match_the_program() -> None:
    partitioner = OpenvinoPartitioner(sample_inputs=(torch.randn(8), torch.randn(8)))
    with pytest.raises(ValueError, match="sample_inputs has 2 tensors; the program takes 1 input"):
        lower(ShiftByAbsRange(), (torch.randn(8),), partitioner=partitioner)


def test_the_check_runs_on_the_users_sample_inputs(monkeypatch) -> None:
    sample = torch.full((8,), 3.0)
    seen: list[SampleValues] = []
    computed = partitioner_module.sample_values
    monkeypatch.setattr(partitioner_module, "sample_values", lambda *a, **k: seen.append(computed(*a, **k)) or seen[-1])
    partitioner = OpenvinoPartitioner(fold_constants=False, sample_inputs=(sample,))
    execute_layer_test(ShiftByAbsRange(), (torch.randn(8),), expected_partitions=None, partitioner=partitioner)
    assert partitioner.numerical_check is not None and len(seen) == 1
    given = [value for node, value in seen[0].items() if node.op == "placeholder" and node.name == "x"]
    assert len(given) == 1 and torch.equal(given[0], sample)


def test_sample_values_are_dropped_once_partitions_settle(monkeypatch) -> None:
    """Every node's sample value (a model's transposed weights among them) must not live as long as
    the partitioner: on an LLM that held as much memory again as its weights through preprocess."""
    held: list[weakref.ref] = []
    computed = partitioner_module.sample_values

    def watched(*args, **kwargs):
        values = computed(*args, **kwargs)
        held.extend(weakref.ref(v) for v in values.values() if isinstance(v, torch.Tensor))
        return values

    monkeypatch.setattr(partitioner_module, "sample_values", watched)
    partitioner = OpenvinoPartitioner()
    lower(Lookup(), (torch.tensor([[1, 4, 0]]),), partitioner=partitioner)
    gc.collect()
    assert held, "the numerical check computed no sample values"
    alive = [ref() for ref in held if ref() is not None]
    assert not any(t.shape == (3, 4) or t.shape == (1, 3, 4) for t in alive), [t.shape for t in alive]


def test_large_values_from_weights_alone_are_recomputed_not_held() -> None:
    """A transposed weight is computed again when the check asks for it: the same values, a new tensor."""
    model = torch.nn.Linear(1024, 512)
    x = torch.randn(2, 1024)
    program = to_edge(torch.export.export(model, (x,))).exported_program()
    values = sample_values(program, (x,))
    assert values is not None
    transposes = [node for node in values if node.op == "call_function" and "permute" in str(node.target)]
    assert len(transposes) == 1
    first, again = values[transposes[0]], values[transposes[0]]
    assert first is not again, "a 2 MiB transposed weight was held"
    assert torch.equal(first, model.weight.detach().T)
    # Computed again as a view of the weight: no second weight-sized tensor while it is in use.
    weight = values[transposes[0].args[0]]
    assert first.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
    out = next(node for node in values if node.op == "call_function" and "addmm" in str(node.target))
    assert values[out] is values[out], "a value computed from the input must be held"
    torch.testing.assert_close(values[out], model(x).detach())


def test_a_compressed_weight_s_unpacking_steps_are_recomputed_not_held() -> None:
    """Each step from a small layer's stored weight to its float value (here a cast and a scale of a
    256x128 int8 weight, 128 KiB in f32) is computed again when asked for: a decoder has hundreds of
    such layers, and holding every step would hold their weights several times over."""

    class Dequantized(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("weight", torch.randint(-127, 128, (256, 128), dtype=torch.int8))
            self.register_buffer("scale", torch.rand(256, 1) / 100)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.linear(x, self.weight.float() * self.scale)

    model, x = Dequantized(), torch.randn(2, 128)
    program = to_edge(torch.export.export(model, (x,))).exported_program()
    values = sample_values(program, (x,))
    assert values is not None
    steps = [
        node
        for node in values
        if node.op == "call_function" and isinstance(values[node], torch.Tensor) and values[node].shape == (256, 128)
    ]
    assert steps, "no step of the weight's dequantization"
    for node in steps:
        assert values[node] is not values[node], f"{node.name} ({values[node].nbytes} bytes) was held"
    torch.testing.assert_close(values[steps[-1]], model.weight.float() * model.scale)
    out = next(
        node
        for node in values
        if node.op == "call_function" and values[node] is not None and getattr(values[node], "shape", None) == (2, 256)
    )
    torch.testing.assert_close(values[out], model(x))


def test_a_cache_s_update_and_the_arithmetic_on_it_are_recomputed_not_held() -> None:
    """A static cache updated with the new keys, transposed and scaled is each time a cache-sized
    value (a decoder has two caches a layer): computed again when asked for. The matmul reading
    them is held."""

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cache", torch.randn(1, 4, 1024, 64))  # 1 MiB

        def forward(self, q: torch.Tensor, k: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
            keys = self.cache.index_copy(2, position, k)
            return q @ (keys.transpose(-1, -2) * 0.125)

    model = Attention()
    inputs = (torch.randn(1, 4, 2, 64), torch.randn(1, 4, 1, 64), torch.tensor([5]))
    program = to_edge(torch.export.export(model, inputs)).exported_program()
    values = sample_values(program, inputs)
    assert values is not None
    sized = [
        node
        for node in values
        if node.op == "call_function" and getattr(values[node], "numel", lambda: 0)() == model.cache.numel()
    ]
    assert len(sized) >= 2, [node.name for node in sized]  # the update and the scaled keys
    for node in sized:
        assert values[node] is not values[node], f"{node.name} was held"
    keys = model.cache.index_copy(2, inputs[2], inputs[1])
    torch.testing.assert_close(values[sized[-1]].reshape(keys.transpose(-1, -2).shape), keys.transpose(-1, -2) * 0.125)
    out = next(node for node in values if node.op == "call_function" and "bmm" in str(node.target))
    assert values[out] is values[out], "a matmul's value must be held"
    torch.testing.assert_close(values[out].reshape(1, 4, 2, 1024), model(*inputs))


def test_a_value_read_twice_on_the_way_is_computed_once() -> None:
    """Values computed again from values computed again: each once per request, not once per path
    (twelve residual steps would otherwise take 2**12 computations)."""

    class Residuals(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(12):
                x = x + x * 0.5
            return x

    x = torch.randn(512, 512)  # 1 MiB
    program = to_edge(torch.export.export(Residuals(), (x,))).exported_program()
    values = sample_values(program, (x,))
    assert values is not None
    last = list(program.graph.nodes)[-2]

    calls = []

    class Count(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append(func)
            return func(*args, **(kwargs or {}))

    with Count():
        value = values[last]
    assert len(calls) <= 2 * 12 + 2, f"{len(calls)} ops to compute a value 24 ops from the input"
    torch.testing.assert_close(value, Residuals()(x))


def test_computing_a_value_again_lets_each_step_go_once_read() -> None:
    """Asked for a weight dequantized in three steps (cast, zero point, scale), the cast is let go
    once the zero point is taken off: the steps of a large weight are never all held at once."""

    class ZeroPoint(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("weight", torch.randint(0, 255, (512, 128), dtype=torch.uint8))
            self.register_buffer("zero", torch.full((512, 1), 128.0))
            self.register_buffer("scale", torch.rand(512, 1) / 100)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.linear(x, (self.weight.float() - self.zero) * self.scale)

    x = torch.randn(2, 128)
    program = to_edge(torch.export.export(ZeroPoint(), (x,))).exported_program()
    values = sample_values(program, (x,))
    assert values is not None
    (scaled,) = (node for node in values if node.op == "call_function" and "mul" in node.name)
    cast: list[weakref.ref] = []
    cast_alive_at_the_scale: list[bool] = []

    class Watch(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.mul.Tensor and cast:
                cast_alive_at_the_scale.append(cast[0]() is not None)
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == (512, 128) and not cast:
                cast.append(weakref.ref(out))
            return out

    with Watch():
        value = values[scaled]
    assert cast_alive_at_the_scale == [False]
    torch.testing.assert_close(value, (program.state_dict["weight"].float() - 128.0) * program.state_dict["scale"])


def test_a_large_weight_s_steps_are_computed_by_rows_and_never_stand_whole(monkeypatch) -> None:
    """A tied embedding table dequantized (cast, zero point, scale) is computed a block of rows at a
    time into one tensor, while the program's values are computed and each time the check asks for
    it: no step of it ever stands whole beside another, which at a 3 B decoder's vocabulary would be
    1.6 GB each. Its values are those of the steps computed whole."""
    import openvino_backend.partition.rows as rows

    monkeypatch.setattr(rows, "ROWS_BYTES", 1 << 14)  # a block of 32 rows of the 512x128 f32 table

    class TiedTable(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", torch.randint(0, 255, (512, 128), dtype=torch.uint8))
            self.register_buffer("zero", torch.randint(0, 255, (512, 1), dtype=torch.uint8))
            self.register_buffer("scale", torch.rand(512, 1) / 100)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            table = (self.table.float() - self.zero.float()) * self.scale
            return torch.nn.functional.embedding(ids, table) @ table.T

    ids = torch.tensor([[3, 511, 0]])
    program = to_edge(torch.export.export(TiedTable(), (ids,))).exported_program()
    whole: list[tuple] = []

    class Watch(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if (
                isinstance(out, torch.Tensor)
                and out.shape == (512, 128)
                and func is not torch.ops.aten.empty_strided.default
            ):
                whole.append(func)
            return out

    with Watch():
        values = sample_values(program, (ids,))
    assert values is not None
    assert whole == [], f"steps of the table computed whole: {whole}"
    (scaled,) = (node for node in values if node.op == "call_function" and "mul" in node.name)
    with Watch():
        value = values[scaled]
    assert whole == [], f"steps of the table computed whole when asked for: {whole}"
    weights = program.state_dict
    expected = (weights["table"].float() - weights["zero"].float()) * weights["scale"]
    assert torch.equal(value, expected)
    (out,) = (node for node in program.graph.find_nodes(op="output"))
    torch.testing.assert_close(values[out.args[0][0]], program.module()(ids))


def test_a_4_bit_weight_unpacked_flat_and_shaped_by_channel_is_computed_by_rows(monkeypatch) -> None:
    """NNCF unpacks a 4-bit weight flat (two values per byte, one byte per row), then shapes it by
    output channel: a reshape from 64 times the rows. A block of the weight's rows reads a block of
    64 times as many flat rows, so the steps on both sides of that reshape are computed by rows, and
    none stands whole; the values are those of the steps computed whole."""
    import openvino_backend.partition.rows as rows

    monkeypatch.setattr(rows, "ROWS_BYTES", 1 << 14)  # 16 rows of the 256x256 f32 weight
    out_features, in_features, group = 256, 256, 128

    class Unpacked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            packed = torch.randint(0, 255, (out_features * in_features // 2, 1), dtype=torch.uint8)
            self.register_buffer("packed", packed)
            self.register_buffer("scale", torch.rand(out_features, in_features // group, 1).half() / 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            low, high = torch.bitwise_and(self.packed, 15), torch.bitwise_right_shift(self.packed, 4)
            signed = torch.stack([low, high], -1).to(torch.int8) - 8
            grouped = signed.reshape(out_features, in_features // group, group).half() * self.scale
            weight = grouped.reshape(out_features, in_features).float()
            return x @ weight.T

    x = torch.randn(3, in_features)
    unchecked = EdgeCompileConfig(_check_ir_validity=False)  # the shift is no core ATen op
    program = to_edge(torch.export.export(Unpacked(), (x,)), compile_config=unchecked).exported_program()
    whole: list[tuple] = []

    class Watch(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            storages = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            if (
                isinstance(out, torch.Tensor)
                and out.numel() == out_features * in_features
                and func is not torch.ops.aten.empty_strided.default
                and out.untyped_storage().data_ptr() not in storages  # a view computes nothing
            ):
                whole.append((func, tuple(out.shape)))
            return out

    with Watch():
        values = sample_values(program, (x,))
        assert values is not None
        (weight,) = (n for n in values if n.op == "call_function" and "permute" in str(n.target))
        value = values[weight]
    assert whole == [], f"steps of the weight computed whole: {whole}"
    weights = program.state_dict
    signed = torch.stack([weights["packed"] & 15, weights["packed"] >> 4], -1).to(torch.int8) - 8
    grouped = signed.reshape(out_features, in_features // group, group).half() * weights["scale"]
    assert torch.equal(value, grouped.reshape(out_features, in_features).float().T)
    (out,) = program.graph.find_nodes(op="output")
    torch.testing.assert_close(values[out.args[0][0]], program.module()(x))


def test_a_weight_written_in_place_is_not_recomputed() -> None:
    """A value read from a weight the program then writes in place is held as it was when computed:
    computing it again afterwards would read the written weight."""
    model = torch.nn.Linear(1024, 512)
    x = torch.randn(2, 1024)
    program = to_edge(torch.export.export(model, (x,))).exported_program()
    graph = program.graph
    transpose = next(node for node in graph.nodes if node.op == "call_function" and "permute" in str(node.target))
    weight = transpose.args[0]
    with graph.inserting_after(transpose):
        graph.call_function(torch.ops.aten.add_.Scalar, (weight, 1.0))
    program.graph_module.recompile()
    original = model.weight.detach().clone()
    values = sample_values(program, (x,))
    assert values is not None
    assert torch.equal(values[transpose], original.T)


def test_large_copies_are_recomputed_and_copies_of_written_values_held() -> None:
    """A copy of a value (an LLM's cache with its key heads expanded, a view's copy) is computed
    again from the held value it copies: on a decoder, holding every such copy held its caches'
    memory many times over. A copy of a value written in place afterwards is held as it was."""

    class Expand(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            doubled = x * 2  # held: computed from the input
            return doubled.expand(4, 512, 256).reshape(8, 256, 256) + 1

    x = torch.randn(1, 512, 256)
    program = to_edge(torch.export.export(Expand(), (x,))).exported_program()
    values = sample_values(program, (x,))
    assert values is not None
    calls = {node.name.removeprefix("aten_"): node for node in values}
    doubled, expanded, reshaped = calls["mul_tensor"], calls["expand_copy_default"], calls["view_copy_default"]
    assert values[doubled] is values[doubled]
    assert values[expanded] is not values[expanded], "a 2 MiB expanded copy was held"
    assert values[reshaped] is not values[reshaped], "a 2 MiB reshaped copy was held"
    torch.testing.assert_close(values[reshaped], (x * 2).expand(4, 512, 256).reshape(8, 256, 256))

    graph = program.graph
    with graph.inserting_after(expanded):
        graph.call_function(torch.ops.aten.add_.Scalar, (doubled, 1.0))  # written after its copy
    program.graph_module.recompile()
    values = sample_values(program, (x,))
    assert values is not None
    assert values[expanded] is values[expanded], "a copy of a value written in place must be held"
    torch.testing.assert_close(values[expanded], (x * 2).expand(4, 512, 256))
