"""Stage 4: observing and judging runs: log parser, checkpoint inspector, criteria, diagnosis, mutants, report."""
