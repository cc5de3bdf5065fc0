"""Below every stage: paths, errors, processes, imports, and the bounded workers that read untrusted input."""
