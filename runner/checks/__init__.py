"""Checks that read no weights: the tokenizer gate, pairing, model and GGUF headers, the memory estimate."""
