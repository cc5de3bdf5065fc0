"""bert-acceptance harness: one module per pipeline stage.

corpus -> preprocess -> launch -> observe (logs, gpumem, checkpoints) -> judge (criteria) -> report.
"""

__version__ = "0.1.0"
