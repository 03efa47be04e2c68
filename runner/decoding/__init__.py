"""Decoding: the speculative loop, its statistics, the run history and continuous batching."""
