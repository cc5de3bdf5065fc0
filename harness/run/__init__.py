"""Stage 3: launching runs with timeouts, the session of runs, NVML memory, failure modes, Megatron-LM checkouts."""
