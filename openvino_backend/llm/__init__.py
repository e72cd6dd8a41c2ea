"""Decoder LLMs end to end: build one (ExecuTorch's example Llama, or a Hugging Face decoder),
export it with its KV cache in OpenVINO state and a prompt of any length in one call, and
generate text from the ``.pte`` with ExecuTorch's runtime."""
