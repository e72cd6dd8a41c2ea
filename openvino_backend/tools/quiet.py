"""Keep the terminal for the command line's own output.

Libraries write to the process's stdout and stderr from C++ (the ExecuTorch
runtime's "OpenVINO: runtime loaded" line, cpuinfo) and from Python at import
(torchao's missing optional kernels, torch's deprecation warnings). None of
it helps a user reading ``verify``'s verdict, and any of it would corrupt
``--json``. Called before those libraries are imported, this points file
descriptors 1 and 2 at the null device, gives Python's ``sys.stdout`` the
original stdout back (the command line's output) and keeps the original
stderr for the command line's own messages (``stderr()``); ``sys.stderr``,
which libraries write their warnings and logs to, stays on the null device.
``--debug`` skips it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import TextIO

_terminal_stderr: TextIO | None = None


def stderr() -> TextIO:
    """Where the command line's own messages to stderr go (the terminal, even when silenced)."""
    return _terminal_stderr or sys.stderr


def silence_libraries() -> None:
    """Send everything but the command line's own output to the null device."""
    global _terminal_stderr
    sys.stdout.flush()
    sys.stderr.flush()
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding=sys.stdout.encoding, errors="replace")
    _terminal_stderr = os.fdopen(os.dup(2), "w", buffering=1, encoding=sys.stderr.encoding, errors="replace")
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    sys.stdout = out
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    warnings.filterwarnings("ignore")
    logging.basicConfig(handlers=[logging.NullHandler()], force=True)


@contextlib.contextmanager
def nncf_off_stdout() -> Iterator[None]:
    """Inside, NNCF's compression reports stay off stdout: a table per compression, logged at INFO
    through NNCF's own handler on stdout (NNCF sets its logger's level when imported, so it is
    imported first), and a progress bar, which ``rich`` draws on whatever ``sys.stdout`` is (sent
    to ``sys.stderr`` meanwhile)."""
    try:
        import nncf
    except ImportError:
        pass  # compressing will say that NNCF is missing
    else:
        nncf.set_log_level(logging.ERROR)
    with contextlib.redirect_stdout(sys.stderr):
        yield
