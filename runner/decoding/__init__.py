"""Decoding: the one speculative step (step.py) run over one sequence (speculative.py) or many (batching.py), its
acceptance rule, proposers, guard and statistics, and the run history."""
