"""bench/compare_trl.py's parts: rlpost against TRL and against the raw limit."""
