"""An unknown second ``OpenvinoBackend`` class in the process is an error, never a fallback
(ExecuTorch's own is routed: ``tests/test_upstream_quantizer.py``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


@pytest.mark.slow  # a fresh interpreter
def test_second_backend_class_is_refused() -> None:
    # A fresh interpreter: the conflicting class must not leak into other tests.
    script = textwrap.dedent(
        """
        from executorch.exir.backend.backend_details import BackendDetails

        class OpenvinoBackend(BackendDetails):  # what executorch.backends.openvino defines
            @staticmethod
            def preprocess(program, specs):
                raise AssertionError("the other backend must never run")

        from openvino_backend import BackendConflictError, OpenvinoPartitioner
        try:
            OpenvinoPartitioner()
        except BackendConflictError as error:
            print("REFUSED")
            print(error)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert "REFUSED" in result.stdout
    assert "__main__.OpenvinoBackend" in result.stdout
    assert "keep that module out of the process" in result.stdout


@pytest.mark.slow  # a fresh interpreter
def test_package_never_imports_upstream_backend() -> None:
    script = (
        "import sys, openvino_backend.tools.cli, openvino_backend.tools.verify, openvino_backend.tools.probe\n"
        "print(any(m.startswith('executorch.backends.openvino') for m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("False")
