"""The layer both packages stand on: `bundler/` (the bundle) and `runner/` (decoding) import it, it imports neither."""
