"""Every user command, `python -m harness CMD` (the table in harness/__main__.py)."""
