"""`bundle serve`: the OpenAI-compatible app, its guard against hostile clients, requests, the decoding worker."""
