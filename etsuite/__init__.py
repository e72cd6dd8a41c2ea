"""Run ExecuTorch's backend operator suite against ``openvino_backend`` (see ``flow.py``)."""
