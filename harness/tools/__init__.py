"""Offline tools for the suite's maintainers: benchmarks, band derivation, the failure catalogue's hit rate, parity."""
