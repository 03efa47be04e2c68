"""The command flows the CLI calls: init, pack, inspect, unpack, fetch, run."""
