"""Grading every student's own Megatron-LM checkout on a cluster (`python -m harness grade-checkouts DIR`).

harness.cli.cluster.task: what one job does (copy that student's checkout, run checkout mode, return what it wrote),
and how its JUnit file and report become a grade; harness.cli.cluster.checkouts: the command line, the layout of DIR,
the submitit executor (Slurm job array, local or debug), the state file behind --resume, and the merged outputs.
"""
