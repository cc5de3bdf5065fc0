"""Stage 5: judging evidence: criteria profiles as data, one checker per kind, bands, and whether a log can be trusted."""
