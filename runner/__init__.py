"""specbundle's runner: tokenizer gate, pairing policy, loading, speculative decoding, metrics."""
