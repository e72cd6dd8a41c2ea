"""The command line, verify, probe, and the model loader and examples they use."""
