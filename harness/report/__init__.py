"""Stage 6: the writers: gradebook files (JSON, Markdown, CSV, JUnit), the session report, the loss-curve pictures, JUnit read back."""
