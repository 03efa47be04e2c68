"""The bundle format: the Kitfile, the ModelKit config and manifest, layer tars written and read, bounded JSON."""
