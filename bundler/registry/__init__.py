"""OCI registries: the distribution API v2 client (push, pull) and credentials."""
