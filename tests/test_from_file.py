"""Programs run the way deployments run them: written to a file, loaded from its path, memory-mapped.

OpenVINO keeps reading constants from a blob after importing it, and the stock
runtime frees a delegate's segment right after ``init``; only blobs written
inline live as long as the program (``openvino_backend/program.py``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

from openvino_backend import OpenvinoPartitioner, ProgramLayoutError, check_program, to_executorch
from openvino_backend.program import segmented_delegates, write_program
from openvino_backend.runtime import Tolerance
from openvino_backend.tools.cli import main
from openvino_backend.tools.verify import LoadedMethod


class Tagger(torch.nn.Module):
    """Constants OpenVINO uses as they are, without repacking: an embedding table and biases."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 32)
        self.hidden = torch.nn.Linear(32, 64)
        self.out = torch.nn.Linear(64, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(self.embed(ids))))


def _edge(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]):
    exported = torch.export.export(module.eval(), inputs)
    return to_edge_transform_and_lower(exported, partitioner=[OpenvinoPartitioner()])


# Runs in a new interpreter: nothing of the exporting process (its OpenVINO, its buffers) helps.
_RUN_FROM_PATH = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import torch
    from executorch.runtime import Runtime

    pte, inputs, out = map(Path, sys.argv[1:])
    program = Runtime.get().load_program(pte)  # held while its method runs
    method = program.load_method("forward")
    results = [method.execute(list(torch.load(inputs)))[0] for _ in range(3)]
    torch.save(results, out)
    """
)


def _run_in_fresh_process(pte: Path, inputs: tuple[torch.Tensor, ...], tmp_path: Path) -> list[torch.Tensor]:
    torch.save(inputs, tmp_path / "inputs.pt")
    done = subprocess.run(
        [sys.executable, "-c", _RUN_FROM_PATH, str(pte), str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"exit {done.returncode} running {pte.name} from its path:\n{done.stderr[-2000:]}"
    return torch.load(tmp_path / "out.pt")


def _assert_matches_eager(module: torch.nn.Module, inputs, results: list[torch.Tensor]) -> None:
    with torch.no_grad():
        want = module(*inputs)
    tolerance = Tolerance.for_output(want.dtype, terms=64, scale=float(want.abs().max()), ops=8)
    for call, got in enumerate(results):
        assert tolerance.check(got, want), f"call {call}: max error {(got - want).abs().max():.3g} over {tolerance}"


def test_a_program_written_by_to_executorch_runs_from_its_path_in_a_fresh_process(tmp_path: Path) -> None:
    module, inputs = Tagger().eval(), (torch.randint(0, 50, (4, 6)),)
    program = to_executorch(_edge(module, inputs))
    assert segmented_delegates(program.buffer) == ()
    pte = tmp_path / "tagger.pte"
    write_program(program, pte)
    _assert_matches_eager(module, inputs, _run_in_fresh_process(pte, inputs, tmp_path))


def test_executorch_default_layout_is_refused_before_it_runs(tmp_path: Path) -> None:
    module, inputs = Tagger().eval(), (torch.randint(0, 50, (4, 6)),)
    buffer = _edge(module, inputs).to_executorch().buffer  # ExecuTorch's default: blobs in segments
    assert segmented_delegates(buffer) == (0,)
    with pytest.raises(ProgramLayoutError, match="extract_delegate_segments=False"):
        check_program(buffer)
    pte = tmp_path / "default.pte"
    pte.write_bytes(buffer)
    with pytest.raises(ProgramLayoutError, match="segments the runtime frees"):
        LoadedMethod(pte)  # refused, not crashed
    with pytest.raises(ProgramLayoutError):
        write_program(buffer, tmp_path / "again.pte")
    assert not (tmp_path / "again.pte").exists()


def test_the_default_layout_is_announced_once_at_export(caplog) -> None:
    import openvino_backend.program as layout

    layout._warned = False
    module, inputs = Tagger().eval(), (torch.randint(0, 50, (4, 6)),)
    with caplog.at_level("WARNING", logger="openvino_backend.program"):
        _edge(module, inputs)
        with layout.writing_inline():
            _edge(module, inputs)
    warnings = [r for r in caplog.records if r.name == "openvino_backend.program"]
    assert len(warnings) == 1 and "extract_delegate_segments=False" in warnings[0].getMessage()


def test_lower_writes_a_program_that_runs_from_its_path(tmp_path: Path, capsys) -> None:
    (tmp_path / "tagger_model.py").write_text(
        textwrap.dedent(
            """
            import torch

            class Tagger(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    torch.manual_seed(0)
                    self.hidden = torch.nn.Linear(16, 32)
                    self.out = torch.nn.Linear(32, 4)

                def forward(self, x):
                    return self.out(torch.relu(self.hidden(x)))

            def model():
                return Tagger()
            """
        )
    )
    sys.path.insert(0, str(tmp_path))
    try:
        pte = tmp_path / "tagger.pte"
        code = main(["lower", "tagger_model:model", "--input-shape", "2,16", "-o", str(pte)])
        assert code == 0, capsys.readouterr()
        module = sys.modules["tagger_model"].model().eval()
    finally:
        sys.path.remove(str(tmp_path))
    assert segmented_delegates(pte.read_bytes()) == ()
    inputs = (torch.randn(2, 16),)
    _assert_matches_eager(module, inputs, _run_in_fresh_process(pte, inputs, tmp_path))


def test_check_program_refuses_what_is_not_a_program() -> None:
    with pytest.raises(ValueError, match="not an ExecuTorch program"):
        segmented_delegates(b"\x00" * 64)


def test_a_program_past_the_flatbuffer_limit_is_refused_with_its_reason(monkeypatch) -> None:
    from flatbuffers.builder import Builder

    # ExecuTorch's serializer, stopped at 64 KiB instead of 2 GiB: a 256 KiB layer is over it.
    monkeypatch.setattr(Builder, "MAX_BUFFER_SIZE", 1 << 16)
    module, inputs = torch.nn.Linear(256, 256).eval(), (torch.randn(2, 256),)
    with pytest.raises(ProgramLayoutError, match=r"(?s)over the 2 GiB a flatbuffer can hold.*--weights int8\|int4"):
        to_executorch(_edge(module, inputs))
