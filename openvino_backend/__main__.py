"""``python -m openvino_backend`` (and the ``openvino-backend`` script)."""

import os
import sys


def settings() -> None:
    """The process's settings the libraries read as they load (before PyTorch allocates anything)."""
    # ExecuTorch's Python binding copies outputs with PyTorch, whose idle OpenMP workers would spin
    # on the cores OpenVINO needs for the next call (a millisecond per call on two cores); PyTorch
    # reads this when it loads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # PyTorch's allocator asks for transparent huge pages for its large tensors (where the kernel gives
    # them on request, its usual setting): an export allocates and frees weight-sized values throughout,
    # and the kernel zeroes each page it hands out. Llama-3.2-3B int4 export on a Xeon with AMX: 78 M page
    # faults and 172 s of system time, 12.6 M and 116 s with it; peak memory the same.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def run() -> int:
    settings()
    # Before any heavy import: the libraries print while they load.
    if "--debug" not in sys.argv[1:]:
        from openvino_backend.tools.quiet import silence_libraries

        silence_libraries()
    try:
        from openvino_backend.tools.cli import main, return_freed_memory

        # The process's allocator, so only here: a program calling main() keeps its own.
        return_freed_memory()
        return main()
    except Exception as error:  # before the command line could catch it (importing the libraries, say)
        from openvino_backend.tools.quiet import stderr

        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        print(
            f"error: {type(error).__name__}{': ' + first if first else ''}\n  rerun with --debug for the traceback",
            file=stderr(),
        )
        return 4


if __name__ == "__main__":
    sys.exit(run())
