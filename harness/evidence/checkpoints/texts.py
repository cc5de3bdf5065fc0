"""The checkpoint inspector's failure texts (harness.evidence.checkpoints.inspector), as constants: the self-tests match the
same words users see. Each names the file, what is wrong, and one remedy; every name is importable from
harness.evidence.checkpoints.inspector too."""

MSG_NO_SAVE_DIR = "{path}: save directory not found; pass the run's --save directory (add --save DIR --save-interval 100 to the course flags)"
MSG_NO_ITERATIONS = "{path}: no iter_NNNNNNN checkpoint directory; train with --save DIR --save-interval N past iteration N"
MSG_NO_TRACKER = "{path}: missing; Megatron writes it after a save finished, so the save was interrupted: re-run training"
MSG_TRACKER_NOT_A_FILE = "{path}: not a regular file (a directory, a pipe or a device); Megatron writes a text file with the iteration number: submit the --save folder as training left it"
MSG_BAD_TRACKER = "{path}: content {content!r} is neither an iteration number nor 'release'; the save was interrupted: re-run training"
MSG_TRACKER_DANGLING = "{path}: names iteration {iteration} but {missing} does not exist; re-run training (or restore the deleted directory)"
MSG_TRACKER_BEHIND = "{path}: names iteration {tracker} but {newer} is newer; that save did not finish: re-run training"
MSG_LINK_LEAVES = "{path}: refused: unsafe content: a symlink to {target}, outside {root}; only files inside the --save folder are read: submit the files themselves"
MSG_NO_SUCH_ITERATION = "{path}: iteration {iteration} was requested but not saved (saved: {saved}); pick a saved iteration"
MSG_EMPTY_DIR = "{path}: checkpoint directory is empty; the save was interrupted: re-run training"
MSG_UNKNOWN_FORMAT = "{path}: neither torch_dist files (.metadata, *.distcp) nor torch files (mp_rank_00/model_optim_rng.pt), found {found}; the save was interrupted: re-run training"
MSG_MISSING_FILE = "{path}: missing; the save was interrupted: re-run training"
MSG_UNREADABLE = "{path}: unreadable ({error}); the file is corrupt, the save was interrupted: re-run training"
MSG_TRUNCATED = "{path}: {size} bytes but .metadata needs {needed}; the file is truncated (save interrupted or disk full): re-run training"
MSG_UNSAFE_PICKLE = "{path}: refused: unsafe content: unpickling needs {name}, which no checkpoint Megatron-LM or torch writes holds; the file was not loaded. Re-save the checkpoint with Megatron and submit that"
MSG_TOO_COMPLEX = "{path}: refused: unsafe content: {reason}; the file was not loaded. Re-save the checkpoint with Megatron and submit that"
MSG_SUITE_CANNOT_READ = "this suite cannot read this Megatron-LM release's checkpoint yet: {path} holds {name}{why}, which no release it knows pickles ({releases}); not the student's fault: update harness/judge/megatron_classes.json (python -m harness release-classes MEGATRON_GIT_DIR REF...)"
MSG_MORE_PROBLEMS = "... and {count:,} more problems not listed"
MSG_MORE_ITER_DIRS = "{path}: {count:,} iteration folders; the files of the first {checked:,} and the chosen one were checked. Megatron saves one per --save-interval: submit the --save folder training left"
MSG_STORAGE_CORRUPT = "{path}: entry {entry} fails its CRC check; the file is corrupt, the save was interrupted: re-run training"
MSG_NO_MODEL_KEY = "{path}: no 'model' entry (top-level keys: {keys}); not a Megatron checkpoint: save with Megatron's save_checkpoint"
MSG_PARALLEL_RANKS = "{path}: {count} model-parallel rank directories ({names}); the course trains with TP=1, PP=1: re-run with --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1"
MSG_MISSING_TENSOR = "{path}: model tensor {name} missing (expected shape {expected}); train with the course model flags ({flags})"
MSG_UNEXPECTED_TENSOR = "{path}: unexpected model tensor {name} with shape {actual}; train with the course model flags ({flags})"
MSG_WRONG_SHAPE = "{path}: tensor {name} has shape {actual}, expected {expected}; train with the course model flags ({flags})"
MSG_MORE_MISMATCHES = "{path}: {count} more {kind} tensors not listed; train with the course model flags ({flags})"
MSG_LOAD_FAILED = "{path}: loading the model tensors failed ({error}); a shard is corrupt or the save was interrupted: re-run training"
MSG_NO_EXPECTED = "cannot derive the expected tensor shapes from megatron-core ({error}); install megatron-core 0.16.1 (pip install megatron-core==0.16.1)"
MSG_INTERNAL = "{path}: the checkpoint inspector failed ({error}); report this together with `ls -laR {path}`"
MSG_OVER_BUDGET = "{path}: the checkpoint inspector stopped: {what}; inspecting a --save folder takes seconds and under 2 GB: submit the --save folder training left (a crafted file is refused, not read)"


def _unwrap(exc: BaseException) -> BaseException:
    """The first rank's original error inside a DCP CheckpointException (its text is a dict dump)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        return first[0] if isinstance(first, tuple) and isinstance(first[0], BaseException) else exc
    return exc


def _short(exc: BaseException) -> str:
    """One-line error text: type and the first line of the message, at most 200 characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:200] if text else type(exc).__name__
