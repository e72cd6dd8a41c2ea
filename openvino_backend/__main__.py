"""``python -m openvino_backend`` (and the ``openvino-backend`` script)."""

import sys


def run() -> int:
    # Before any heavy import: the libraries print while they load.
    if "--debug" not in sys.argv[1:]:
        from openvino_backend.tools.quiet import silence_libraries

        silence_libraries()
    from openvino_backend.tools.cli import main

    return main()


if __name__ == "__main__":
    sys.exit(run())
