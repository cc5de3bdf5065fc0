"""The pytest side: options, hooks, a verdict turned into a test outcome, and --from-log."""
