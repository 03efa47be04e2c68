"""Trust: keys, DSSE, signatures (model-signing and cosign-style), the release memory, verify, run records."""
