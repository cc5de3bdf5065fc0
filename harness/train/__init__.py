"""Stage 2: the reference trainer (python -m harness train)."""
