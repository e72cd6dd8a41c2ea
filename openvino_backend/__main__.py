import sys

from openvino_backend.cli import main

sys.exit(main())
