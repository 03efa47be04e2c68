"""`bundle bench`: timed runs against peers, on torch and GGUF bundles, and what machine they ran on."""
