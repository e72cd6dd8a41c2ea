"""Programs run the way deployments run them: written to a file, loaded from its path, memory-mapped.

The stock runtime frees a delegate's segment right after ``init``. Whether
OpenVINO still reads it then is asked of the installed OpenVINO
(``blob_import.py``), and the layout follows (``program.py``): these tests hold
on either answer, and CI runs them on an OpenVINO of each kind.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

import openvino_backend.lowering.blob_export as blob_export
import openvino_backend.lowering.preprocess as preprocess_module
import openvino_backend.program as layout
from openvino_backend import OpenvinoPartitioner, ProgramLayoutError, check_program, to_executorch
from openvino_backend.blob_import import import_copies_blob
from openvino_backend.program import BlobVersionError, delegate_blobs, segmented_delegates, write_program
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


def _run_unchecked(pte: Path, inputs: tuple[torch.Tensor, ...], tmp_path: Path) -> subprocess.CompletedProcess:
    torch.save(inputs, tmp_path / "inputs.pt")
    return subprocess.run(
        [sys.executable, "-c", _RUN_FROM_PATH, str(pte), str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _run_in_fresh_process(pte: Path, inputs: tuple[torch.Tensor, ...], tmp_path: Path) -> list[torch.Tensor]:
    done = _run_unchecked(pte, inputs, tmp_path)
    assert done.returncode == 0, f"exit {done.returncode} running {pte.name} from its path:\n{done.stderr[-2000:]}"
    return torch.load(tmp_path / "out.pt")


def _matches_eager(module: torch.nn.Module, inputs, results: list[torch.Tensor]) -> list[str]:
    """What differs from eager beyond the target's rounding, call by call (empty: it matches)."""
    with torch.no_grad():
        want = module(*inputs)
    tolerance = Tolerance.for_output(want.dtype, terms=64, scale=float(want.abs().max()), ops=8)
    return [
        f"call {call}: max error {(got - want).abs().max():.3g} over {tolerance}"
        for call, got in enumerate(results)
        if not tolerance.check(got, want)
    ]


def _assert_matches_eager(module: torch.nn.Module, inputs, results: list[torch.Tensor]) -> None:
    wrong = _matches_eager(module, inputs, results)
    assert not wrong, "\n".join(wrong)


@pytest.mark.slow
def test_a_program_written_by_to_executorch_runs_from_its_path_in_a_fresh_process(tmp_path: Path) -> None:
    module, inputs = Tagger().eval(), (torch.randint(0, 50, (4, 6)),)
    program = to_executorch(_edge(module, inputs))
    # ExecuTorch's layout (segments) where the import copies the blob; inline where it does not.
    assert segmented_delegates(program.buffer) == (() if layout.blobs_must_be_inline() else (0,))
    pte = tmp_path / "tagger.pte"
    write_program(program, pte)
    _assert_matches_eager(module, inputs, _run_in_fresh_process(pte, inputs, tmp_path))


@pytest.mark.slow
def test_executorch_default_writer_runs_from_its_path_exactly_where_the_probe_says_it_does(tmp_path: Path) -> None:
    """The probe's answer against the runtime's behaviour, unchecked: where the import copies the blob,
    ExecuTorch's default writer's program runs from its file and matches eager, and the project's
    loaders accept it; where it does not, the same program crashes or computes wrong values when run
    unchecked, and the project's loaders and writer refuse it before it runs."""
    module, inputs = Tagger().eval(), (torch.randint(0, 50, (4, 6)),)
    buffer = _edge(module, inputs).to_executorch().buffer  # ExecuTorch's default: blobs in segments
    assert segmented_delegates(buffer) == (0,)
    pte = tmp_path / "default.pte"
    pte.write_bytes(buffer)
    done = _run_unchecked(pte, inputs, tmp_path)
    ran_right = done.returncode == 0 and not _matches_eager(module, inputs, torch.load(tmp_path / "out.pt"))
    assert ran_right == import_copies_blob(), f"exit {done.returncode}; the probe says {import_copies_blob()}"
    if import_copies_blob():
        check_program(buffer)
        _assert_matches_eager(module, inputs, [LoadedMethod(pte)(inputs)[0]])
        return
    with pytest.raises(ProgramLayoutError, match="extract_delegate_segments=False"):
        check_program(buffer)
    with pytest.raises(ProgramLayoutError, match="segments the runtime frees"):
        LoadedMethod(pte)  # refused, not crashed
    with pytest.raises(ProgramLayoutError):
        write_program(buffer, tmp_path / "again.pte")
    assert not (tmp_path / "again.pte").exists()


@pytest.mark.parametrize("inline", [True, False], ids=["import-keeps-reading", "import-copies"])
def test_the_default_layout_is_announced_once_at_export_only_where_it_breaks(caplog, monkeypatch, inline) -> None:
    monkeypatch.setattr(layout, "blobs_must_be_inline", lambda: inline)
    monkeypatch.setattr(layout, "_warned", False)
    module, inputs = Tagger().eval(), (torch.randint(0, 50, (4, 6)),)
    with caplog.at_level("WARNING", logger="openvino_backend.program"):
        _edge(module, inputs)
        with layout.writing_inline():
            _edge(module, inputs)
        _edge(module, inputs)
    warnings = [r.getMessage() for r in caplog.records if r.name == "openvino_backend.program"]
    assert warnings == [] if not inline else len(warnings) == 1 and "extract_delegate_segments=False" in warnings[0]


def test_a_program_from_another_openvino_is_refused_by_name(tmp_path: Path, monkeypatch) -> None:
    module, inputs = Tagger().eval(), (torch.randint(0, 50, (4, 6)),)
    pte = tmp_path / "tagger.pte"
    write_program(to_executorch(_edge(module, inputs)), pte)
    written_by = layout.openvino_version()
    assert [blob.openvino_version for blob in delegate_blobs(pte.read_bytes())] == [written_by]
    monkeypatch.setattr(layout, "openvino_version", lambda: "2099.1.0")
    with pytest.raises(BlobVersionError, match=rf"written by OpenVINO {written_by}; this is OpenVINO 2099.1.0") as e:
        LoadedMethod(pte)
    assert e.value.written_by == (written_by,) and f"openvino=={written_by}" in e.value.fix


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
    assert segmented_delegates(pte.read_bytes()) == (() if layout.blobs_must_be_inline() else (0,))
    inputs = (torch.randn(2, 16),)
    _assert_matches_eager(module, inputs, _run_in_fresh_process(pte, inputs, tmp_path))


def test_check_program_refuses_what_is_not_a_program() -> None:
    with pytest.raises(ValueError, match="not an ExecuTorch program"):
        segmented_delegates(b"\x00" * 64)


@pytest.mark.slow
@pytest.mark.parametrize("inline", [True, False], ids=["import-keeps-reading", "import-copies"])
def test_a_program_past_the_flatbuffer_limit(monkeypatch, tmp_path: Path, inline: bool) -> None:
    """Inline blobs count against the flatbuffer's limit: refused with its reason. In segments they do
    not, and the program is written and runs (where the installed OpenVINO's import copies the blob)."""
    from flatbuffers.builder import Builder

    monkeypatch.setattr(layout, "blobs_must_be_inline", lambda: inline)
    # ExecuTorch's serializer, stopped at 64 KiB instead of 2 GiB: a 256 KiB layer is over it.
    monkeypatch.setattr(Builder, "MAX_BUFFER_SIZE", 1 << 16)
    module, inputs = torch.nn.Linear(256, 256).eval(), (torch.randn(2, 256),)
    if inline:
        with pytest.raises(ProgramLayoutError, match=r"(?s)over the 2 GiB a flatbuffer can hold.*--weights int8"):
            to_executorch(_edge(module, inputs))
        return
    program = to_executorch(_edge(module, inputs))
    assert segmented_delegates(program.buffer) == (0,)
    if import_copies_blob():
        pte = tmp_path / "linear.pte"
        write_program(program, pte)
        _assert_matches_eager(module, inputs, _run_in_fresh_process(pte, inputs, tmp_path))


class _NoExport:
    """A compiled model whose ``export_model`` is refused: the blob must come from OpenVINO's cache."""

    def __init__(self, compiled) -> None:
        self._compiled = compiled

    def __getattr__(self, name: str):
        if name == "export_model":
            raise AssertionError("preprocess exported the blob in memory, beside the compiled model")
        return getattr(self._compiled, name)


def test_openvino_s_model_cache_holds_exactly_export_model_s_blob() -> None:
    """What preprocess relies on to keep the blob out of memory while the models live, asked of the
    installed OpenVINO (CI asks both lines): the cache file, past its header line, is the blob."""
    assert blob_export.cache_holds_export("CPU", {})
    assert not blob_export.cache_holds_export("CPU", {"CACHE_DIR": "/somewhere/of/the/user"})


def test_the_blob_comes_from_openvino_s_cache_and_the_program_runs_from_its_file(tmp_path: Path, monkeypatch) -> None:
    compile_model = preprocess_module.compile_model
    monkeypatch.setattr(preprocess_module, "compile_model", lambda *a, **k: _NoExport(compile_model(*a, **k)))
    read: list[int] = []
    monkeypatch.setattr(
        preprocess_module, "read_cached_blob", lambda d: read.append(1) or blob_export.read_cached_blob(d)
    )
    module, inputs = Tagger().eval(), (torch.randint(0, 50, (4, 6)),)
    pte = tmp_path / "cached.pte"
    write_program(to_executorch(_edge(module, inputs)), pte)
    assert read == [1]
    _assert_matches_eager(module, inputs, _run_in_fresh_process(pte, inputs, tmp_path))


@pytest.mark.parametrize("refusal", ["cache_holds_export", "room_for_blob", "blob_directory"])
def test_where_the_cache_cannot_give_the_blob_it_is_exported_in_memory(tmp_path: Path, monkeypatch, refusal) -> None:
    """An OpenVINO whose cache holds something else, a disk without room for the blob, no directory
    but in memory: the blob is exported as OpenVINO's API gives it, and nothing is read from a cache."""
    monkeypatch.setattr(preprocess_module, refusal, lambda *a: None if refusal == "blob_directory" else False)
    monkeypatch.setattr(preprocess_module, "read_cached_blob", lambda d: pytest.fail("read from the cache"))
    module, inputs = Tagger().eval(), (torch.randint(0, 50, (4, 6)),)
    pte = tmp_path / "exported.pte"
    write_program(to_executorch(_edge(module, inputs)), pte)
    _assert_matches_eager(module, inputs, [LoadedMethod(pte)(inputs)[0]])


_READ_ONCE = textwrap.dedent(
    """
    import os, resource, sys
    from pathlib import Path
    from openvino_backend.lowering.blob_export import read_cached_blob

    directory = Path(sys.argv[1])
    with open(directory / "model.blob", "wb") as file:
        file.write(b'<?xml version="1.0"?><compiled_blob ie_version="x" header_size_alignment="0"/>\\n')
        chunk = os.urandom(1 << 20)
        for _ in range(256):
            file.write(chunk)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    blob = read_cached_blob(directory)
    print(len(blob), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
    """
)


def test_the_cached_blob_is_read_into_memory_once(tmp_path: Path) -> None:
    """256 MiB of blob past the header cost the process's peak 256 MiB, not twice that (a buffered
    reader joins what it read ahead with the rest: a second copy of a 1.9 GB blob at 3 B)."""
    done = subprocess.run([sys.executable, "-c", _READ_ONCE, str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    size, grown = map(int, done.stdout.split())
    assert size == 256 << 20
    assert grown < 1.25 * size, f"reading a {size >> 20} MiB blob raised the peak by {grown >> 20} MiB"


def test_blobs_are_written_on_disk_not_into_a_memory_file_system(tmp_path: Path, monkeypatch) -> None:
    """A ``/tmp`` that is memory (tmpfs, as on many desktops) would hold the blob in memory beside the
    process's copy: the user's cache directory is used instead, and where that is memory too, none."""
    monkeypatch.setattr(blob_export.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    monkeypatch.setattr(blob_export.Path, "home", lambda: tmp_path / "home")
    (tmp_path / "tmp").mkdir()
    file_system, memory = blob_export._file_system, {tmp_path / "tmp"}
    monkeypatch.setattr(blob_export, "_file_system", lambda path: "tmpfs" if path in memory else "ext4")
    assert blob_export.blob_directory() == tmp_path / "home" / ".cache" / "openvino_backend"
    memory.add(tmp_path / "home" / ".cache" / "openvino_backend")
    assert blob_export.blob_directory() is None
    assert file_system(Path("/proc")) == "proc"  # read from the mount table
