"""PyTorch's OpenMP workers sleep while a program runs (``runtime.torch_workers_idle``).

ExecuTorch's Python binding copies outputs with PyTorch; a logits-sized copy
is split across PyTorch's workers, which then spin beside OpenVINO's threads
unless ``OMP_WAIT_POLICY=PASSIVE`` was set before PyTorch loaded. The speed
this costs is ``python -m bench --threads``; these tests hold the mechanism.
"""

from __future__ import annotations

import threading

import torch

from openvino_backend.runtime import torch_workers_idle
from openvino_backend.tools.verify import LoadedMethod, lower


def test_pytorch_runs_single_threaded_inside_and_gets_its_threads_back() -> None:
    before = torch.get_num_threads()
    with torch_workers_idle():
        assert torch.get_num_threads() == 1
        with torch_workers_idle():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1  # the inner block leaving does not wake them
    assert torch.get_num_threads() == before


def test_each_python_thread_keeps_its_own_count() -> None:
    before = torch.get_num_threads()
    inside, leave = threading.Barrier(2), threading.Event()
    seen = {}

    def hold() -> None:
        with torch_workers_idle():
            inside.wait()
            leave.wait()
            seen["other, after this thread left"] = torch.get_num_threads()

    other = threading.Thread(target=hold)
    other.start()
    with torch_workers_idle():
        inside.wait()
        assert torch.get_num_threads() == 1  # entered second, still single-threaded
    assert torch.get_num_threads() == before
    leave.set()
    other.join()
    assert seen == {"other, after this thread left": 1}
    assert torch.get_num_threads() == before


def test_a_loaded_method_runs_with_pytorch_single_threaded() -> None:
    class Wide(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 + 1

    x = torch.randn(1, 65536)  # a copy this size is split across PyTorch's workers
    method = LoadedMethod(lower(Wide(), (x,)).buffer)
    seen = []

    class Recording:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def execute(self, inputs: list[object]) -> object:
            seen.append(torch.get_num_threads())
            return self.inner.execute(inputs)

    method._method = Recording(method._method)
    (out,) = method([x])
    assert seen == [1]
    torch.testing.assert_close(out, x * 2 + 1)
