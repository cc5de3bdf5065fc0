"""`python -m harness grade-checkouts DIR`: re-run every student's own Megatron-LM checkout, one GPU each, via submitit.

Layout of DIR (one folder per student; any other file in DIR is ignored):

    DIR/<student>/Megatron-LM/        the student's checkout (or DIR/<student>/ itself, when it holds megatron/)
    DIR/<student>/train_script.py     optional: the student's own training script (--train-script)

Each student becomes one task (harness.cli.cluster.task): on Slurm, all of them are one job array (one GPU per task,
at most --parallelism at a time); otherwise submitit's local executor runs them on this machine, one per GPU;
`--cluster debug` runs them in this process (tests). Each task copies that student's checkout into its own folder
OUT/tasks/<student>/ and runs checkout mode there; it is given no path to another student or to the grades.
When every task has ended, the grades are merged into OUT/grades.json, .md, .csv, grades-junit.xml (harness.cli.grade's
writers) and OUT/gradescope/<student>/results.json. A task that died (time limit, node failure, preemption) is
graded "died" with the scheduler's reason; `--resume` submits again only the students not finished
(OUT/checkouts-state.json). Exit codes (harness.cli.args): 0 all passed, 1 any student failed, 2 interrupted, 3 any
task the grader could not judge (it died, or found no GPU: the machine's fault, never the student's; re-run those
with --resume), 4 usage error.

Every task runs on a GPU of its own: locally, never more tasks at once than GPU slots (--parallelism is capped at
the GPUs visible, and the output says so), unless --tasks-per-gpu N shares each GPU deliberately, checked against
the GPU's free memory. OUT (default DIR-grades/ beside DIR, a name no student folder can take) is the tool's own:
an OUT holding anything its marker (harness.cli.cluster.outdir) does not list is refused, removals walk from OUT without
following links, and each student's checkout is copied without following links out of it.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

from harness.cli.args import (EXIT_FAILED, EXIT_GRADER_ERROR, EXIT_INTERRUPTED, EXIT_PASSED, EXIT_USAGE,
                              add_time_limit, exit_codes_help)
from harness.cli.cluster import outdir
from harness.cli.cluster import task as tasks
from harness.base.paths import REPO, write_bytes_atomic
from harness.base.errors import CriteriaError
from harness.judge.profiles import Profile, load_profile

EXIT_CODES_HELP = exit_codes_help(grader_error="a task not judged: it died or found no GPU; re-run those with --resume")
STATE_FILE = "checkouts-state.json"
CHECKOUT_DIR = "Megatron-LM"
TRAIN_SCRIPT = "train_script.py"
JOB_NAME = "bert-checkout"
FINISHED, DIED, SUBMITTED = "finished", "died", "submitted"
# Slurm's job states (sacct) and submitit's local ones, as a grader should read them
DIED_REASONS = {"TIMEOUT": "the job reached its time limit (--time-limit)", "NODE_FAIL": "the node failed",
                "PREEMPTED": "the job was preempted by the scheduler", "BOOT_FAIL": "the node failed to boot",
                "OUT_OF_MEMORY": "the job ran out of host memory (--mem-gb)", "DEADLINE": "the job missed its deadline",
                "CANCELLED": "the job was cancelled", "FAILED": "the job failed outside the task (see its log)",
                "INTERRUPTED": "the job was interrupted", "FINISHED": "the job's process ended without a result "
                                                                      "(killed)"}


def add_arguments(parser) -> None:
    parser.add_argument("checkouts", metavar="DIR", help="one folder per student: <student>/Megatron-LM/ and "
                                                         "optionally <student>/train_script.py")
    parser.add_argument("--out", metavar="OUT", help="grades, task folders and the state file; a new or empty folder, or one this command made "
                             "(default: DIR-grades beside DIR)")
    parser.add_argument("--criteria", default="megatron-lm", metavar="PROFILE",
                        help="criteria profile for checkout mode (default: megatron-lm)")
    parser.add_argument("--weights", metavar="FILE", help="points per criterion for the Gradescope results "
                                                          "(default: fixtures/gradescope/checkout-weights.toml)")
    parser.add_argument("--resume", action="store_true",
                        help="submit only the students not finished in OUT/checkouts-state.json (died or never ended)")
    parser.add_argument("--cluster", choices=("auto", "slurm", "local", "debug"), default="auto",
                        help="auto (default): Slurm when srun is on PATH, else local; debug: in this process")
    parser.add_argument("--partition", help="Slurm partition")
    parser.add_argument("--account", help="Slurm account")
    parser.add_argument("--qos", help="Slurm quality of service")
    add_time_limit(parser, 1800.0, "time limit per task (Slurm gets it in whole minutes, rounded up; one checkout "
                                   "takes about 180 s on an H200)", old_minutes=("--time",))
    parser.add_argument("--parallelism", type=int, metavar="N",
                        help="tasks at once (Slurm: the array's %%N, default 16; local: default one per GPU)")
    parser.add_argument("--tasks-per-gpu", type=int, default=1, metavar="N",
                        help="local executor: share each GPU between N tasks deliberately (default 1), each needing "
                             "--task-gpu-mem-gb of the GPU's free memory")
    parser.add_argument("--task-gpu-mem-gb", type=float, default=TASK_GPU_MEM_GB, metavar="GB",
                        help=f"GPU memory one task needs, for --tasks-per-gpu (default {TASK_GPU_MEM_GB:g}; the course's "
                             "run reserves under 1 GB, docs/MEASURED.md)")
    parser.add_argument("--cpus", type=int, default=8, help="CPUs per task (default 8)")
    parser.add_argument("--mem-gb", type=int, default=64, help="host memory per task in GB (default 64)")
    parser.add_argument("--gpus", metavar="IDS", help="local executor: the GPUs to use, e.g. 0,1 (default: every "
                                                      "GPU nvidia-smi lists; none: run without)")
    parser.add_argument("--task-command", metavar="CMD",
                        help="the command each task runs, with {python} {checkout} {run_dir} {junit} {suite} "
                             "(default: checkout mode through pytest); e.g. to run it inside a container")
    parser.add_argument("--no-wait", action="store_true",
                        help="Slurm: submit and exit; collect later with --resume")
    parser.add_argument("--print-sbatch", action="store_true",
                        help="print the sbatch script the Slurm array would be submitted with, and exit")
    parser.add_argument("--keep-copies", action="store_true", help="keep each task's copy of the checkout")
    parser.epilog = EXIT_CODES_HELP


# ---------------------------------------------------------------- the students


def find_checkout(folder: Path) -> tuple[Path | None, Path | None, str | None]:
    """(checkout, train script or None, problem or None) for one student's folder; links out of it refused."""
    base = folder.resolve()
    leaving = [f"{p.relative_to(folder)} -> {os.readlink(p)}" for p in _links(folder)
               if not p.resolve().is_relative_to(base)]
    if leaving:
        return None, None, (f"links out of the student's folder: {'; '.join(leaving[:5])}: refused (a task must see "
                            "only its own student's files); replace each link by the file itself")
    checkout = folder / CHECKOUT_DIR if (folder / CHECKOUT_DIR).is_dir() else folder
    if not (checkout / "megatron").is_dir():
        return None, None, (f"no Megatron-LM checkout in {folder}: put the clone at {folder / CHECKOUT_DIR} "
                            "(a folder with megatron/ and tools/)")
    script = folder / TRAIN_SCRIPT
    return checkout, (script if script.is_file() else None), None


def _links(root: Path):
    for folder, dirs, files in os.walk(root, followlinks=False):
        yield from (Path(folder, n) for n in dirs + files if Path(folder, n).is_symlink())


def student_folders(root: Path, out: Path) -> list[Path]:
    """Every sub-folder of DIR but OUT and hidden ones, sorted."""
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
                  and p.resolve() != out.resolve())


# ---------------------------------------------------------------- the executor


def _minutes(args) -> int:
    """--time-limit (seconds) as Slurm's and submitit's whole minutes, rounded up."""
    return max(1, -(-int(args.time_limit) // 60))


def slurm_parameters(args, count: int) -> dict:
    """The sbatch parameters (submitit's names) of the array: one GPU per task."""
    params = {"job_name": JOB_NAME, "time": _minutes(args), "gpus_per_node": 1, "ntasks_per_node": 1,
              "cpus_per_task": args.cpus, "mem": f"{args.mem_gb}GB", "array_parallelism": min(count, args.parallelism or 16),
              "setup": [f"export PYTHONPATH={shlex.quote(str(REPO))}${{PYTHONPATH:+:$PYTHONPATH}}"]}
    params.update({k: v for k, v in (("partition", args.partition), ("account", args.account), ("qos", args.qos))
                   if v})
    return params


def sbatch_script(args, folder: Path, count: int) -> str:
    """The sbatch file submitit writes for an array of `count` tasks (what --print-sbatch shows)."""
    from submitit.slurm.slurm import _make_sbatch_string

    command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(folder))])
    return _make_sbatch_string(command=command, folder=folder, map_count=count, **slurm_parameters(args, count))


LOCAL_RESULT_GRACE_S = 2
TASK_GPU_MEM_GB = 4.0


def make_executor(args, folder: Path, count: int):
    """submitit's AutoExecutor: Slurm (every sbatch parameter prefixed slurm_), local or debug."""
    import submitit

    cluster = None if args.cluster == "auto" else args.cluster
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    executor.update_parameters(timeout_min=_minutes(args), **{f"slurm_{k}": v for k, v in
                                                         slurm_parameters(args, count).items()})
    return executor


def local_gpus(spec: str | None) -> list[str]:
    """--gpus as a list; by default every GPU nvidia-smi lists (none when there is no nvidia-smi)."""
    if spec is not None:
        return [] if spec in ("", "none") else [g.strip() for g in spec.split(",") if g.strip()]
    import subprocess

    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(listed.splitlines()) if line.startswith("GPU ")]


def gpu_free_memory_gb(ids: list[str]) -> dict[str, float | None]:
    """Free memory of each GPU in GB (nvidia-smi); None for a GPU it does not report."""
    import subprocess

    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.free", "--format=csv,noheader,nounits"],
                                capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        listed = ""
    free = {}
    for line in listed.splitlines():
        index, _, mib = line.partition(",")
        try:
            free[index.strip()] = float(mib) / 1024
        except ValueError:
            continue
    return {g: free.get(g) for g in ids}


def gpu_slots(gpus: list[str], parallelism: int | None, per_gpu: int = 1, need_gb: float = TASK_GPU_MEM_GB,
              free_gb: dict | None = None) -> tuple[dict[str, int], int, list[str]]:
    """(tasks each GPU may run at once, tasks at once, what to tell the user): never more tasks than GPU slots.

    One task per GPU unless per_gpu > 1 is asked for; then each GPU takes as many as its free memory holds at
    need_gb each (at least 1, at most per_gpu). --parallelism above the slots is capped and the cap said."""
    notes = []
    if not gpus:
        width = max(1, parallelism or 1)
        notes.append(f"running {width} task(s) at once without a GPU (--gpus none): a task that needs one is not "
                     "judged (died, no-gpu), never failed")
        return {}, width, notes
    per_gpu = max(1, per_gpu)
    capacity = {}
    free_gb = free_gb if free_gb is not None else (gpu_free_memory_gb(gpus) if per_gpu > 1 else {})
    for gpu in gpus:
        fits = per_gpu
        if per_gpu > 1:
            free = free_gb.get(gpu)
            fits = per_gpu if free is None else max(1, min(per_gpu, int(free // need_gb)))
            if free is None:
                notes.append(f"GPU {gpu}: free memory unknown (nvidia-smi), sharing it between {per_gpu} tasks as "
                             "asked (--tasks-per-gpu)")
            elif fits < per_gpu:
                notes.append(f"GPU {gpu}: {free:.1f} GB free holds {fits} task(s) of {need_gb:g} GB, not "
                             f"{per_gpu} (--tasks-per-gpu {per_gpu}, --task-gpu-mem-gb {need_gb:g})")
        capacity[gpu] = fits
    slots = sum(capacity.values())
    width = min(parallelism or slots, slots)
    if parallelism and parallelism > slots:
        notes.append(f"--parallelism {parallelism} capped at {slots}: {len(gpus)} GPU(s) visible ({', '.join(gpus)})"
                     + (f", {per_gpu} task(s) each" if per_gpu > 1 else ", one task each")
                     + "; a task without a GPU of its own would be graded for the machine, not for the student"
                     + ("" if per_gpu > 1 else " (share a GPU deliberately with --tasks-per-gpu N)"))
    elif per_gpu > 1:
        notes.append(f"sharing: {slots} task(s) at once on {len(gpus)} GPU(s) (--tasks-per-gpu {per_gpu})")
    return capacity, width, notes


# ---------------------------------------------------------------- the state file


def load_state(out: Path) -> dict:
    path = out / STATE_FILE
    if not path.is_file() or path.is_symlink():
        return {"students": {}}
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise SystemExit(f"error: {path}: not JSON ({exc}); delete it to start over (every student is re-run)")


def save_state(out: Path, state: dict) -> None:
    outdir.write_text(out, (STATE_FILE,), json.dumps(state, indent=2) + "\n")


def died(job, exc: BaseException | None) -> str:
    """Why a job ended without a result, in the scheduler's words and ours."""
    try:
        state = str(job.state).split()[0]
    except Exception:   # noqa: BLE001 - the state is a courtesy; the exception says the rest
        state = "UNKNOWN"
    reason = DIED_REASONS.get(state, f"the job ended in state {state}")
    detail = " ".join(str(exc).split())[:300] if exc else ""
    return f"{reason} [{state}, job {job.job_id}]" + (f": {detail}" if detail else "")


# ---------------------------------------------------------------- running and merging


def run_jobs(executor, specs: list, args, state: dict, out: Path, gpus: list) -> None:
    """Submit the tasks and wait for each; every end (result or death) is written to the state file at once."""
    entries = state["students"]
    if executor.cluster == "slurm":
        jobs = executor.map_array(tasks.run_task, specs)
        for spec, job in zip(specs, jobs):
            entries[spec.student].update(status=SUBMITTED, job_id=job.job_id)
        save_state(out, state)
        if args.no_wait:
            return
        for spec, job in zip(specs, jobs):
            _collect(spec, job, entries)
            save_state(out, state)
        return
    # local / debug: never more tasks at once than GPU slots, each with its GPU
    capacity, width, notes = gpu_slots(gpus, args.parallelism, getattr(args, "tasks_per_gpu", 1),
                                       getattr(args, "task_gpu_mem_gb", TASK_GPU_MEM_GB))
    if executor.cluster == "local":
        for note in notes:
            print(f"note: {note}")
    pending, running = list(specs), []
    while pending or running:
        while pending and len(running) < width:
            load = {g: sum(1 for _, _, slot in running if slot == g) for g in capacity}
            slot = min((g for g in capacity if load[g] < capacity[g]), key=lambda g: load[g], default=None)
            if capacity and slot is None:
                break
            spec = pending.pop(0)
            if slot is not None:
                spec = tasks.TaskSpec(**{**spec.__dict__, "env": {**spec.env, "CUDA_VISIBLE_DEVICES": slot}})
            job = executor.submit(tasks.run_task, spec)
            if executor.cluster != "slurm":
                # submitit waits 15 s for a missing result file, for slow shared filesystems; a local job writes
                # it on this machine before it ends, so a job that died without one is known at once
                job._results_timeout_s = LOCAL_RESULT_GRACE_S
            entries[spec.student].update(status=SUBMITTED, job_id=str(job.job_id))
            running.append((spec, job, slot))
        save_state(out, state)
        ended = next(((s, j, g) for s, j, g in running if j.done()), None)
        if ended is None:
            time.sleep(1.0)
            continue
        running.remove(ended)
        _collect(ended[0], ended[1], entries)
        save_state(out, state)


def _collect(spec, job, entries: dict) -> None:
    """The job's result, or why it died, into the state."""
    student = spec if isinstance(spec, str) else spec.student
    try:
        result = job.result()
    except Exception as exc:   # noqa: BLE001 - submitit raises UncompletedJobError/FailedJobError, or the task's
        entries[student].update(status=DIED, reason=died(job, exc), result=None)
        return
    entries[student].update(status=FINISHED, reason=None, result=result)


def reattach(executor, students: list, entries: dict) -> None:
    """--resume after --no-wait on Slurm: wait for the tasks submitted before, by their job ids."""
    import submitit

    for name in students:
        _collect(name, submitit.SlurmJob(folder=executor.folder, job_id=entries[name]["job_id"]), entries)


def which_cluster(args) -> str:
    """--cluster, with auto resolved as submitit resolves it (slurm when srun is on PATH, else local)."""
    import submitit

    return submitit.AutoExecutor.which() if args.cluster == "auto" else args.cluster


MERGED = ("grades.json", "grades.md", "grades.csv", "grades-junit.xml")


def clear_outputs(out: Path) -> None:
    """Remove the merged grades of an earlier run (the state file keeps what --resume needs)."""
    for name in (*MERGED, "gradescope"):
        outdir.remove(out, name)


def merge(students: list, state: dict, profile: Profile, weights, out: Path) -> list:
    """Every student's grade (harness.judge.grade_record.Grade), in DIR order, written with the grades writers
    (harness.report.gradebook) and as Gradescope results."""
    from harness.cli import gradescope
    from harness.report import gradebook

    grades = []
    for name, checkout, problem in students:
        entry = state["students"].get(name, {})
        base = tasks.base_grade(name, str(checkout) if checkout else None)
        if problem:
            grade = tasks.not_judged(base, "no-checkout", problem, "fix the student's folder and run again")
        elif entry.get("status") == FINISHED:
            grade = tasks.grade_from_task(name, str(checkout), entry["result"], profile)
        elif entry.get("status") == DIED:
            grade = tasks.not_judged(base, "task-died", f"the grading job died: {entry.get('reason')}",
                                     "re-run only the unfinished ones with --resume", verdict="died")
        else:
            grade = tasks.not_judged(base, "not-finished", f"the grading job has not ended ({entry.get('status')}, "
                                                           f"job {entry.get('job_id')})",
                                     "collect it with --resume once it has ended", verdict="died")
        grades.append(grade)
        seconds = ((entry.get("result") or {}).get("seconds") or 0.0)
        results = gradescope.results(grade, profile, weights, seconds)
        outdir.write_text(out, ("gradescope", name, "results.json"), json.dumps(results, indent=2) + "\n")
    outdir.write_text(out, ("grades.json",), gradebook.to_json(grades))
    outdir.write_text(out, ("grades.md",), gradebook.markdown(grades, profile.name))
    outdir.write_text(out, ("grades.csv",), gradebook.csv_text(grades, profile.ids))
    write_bytes_atomic(out / "grades-junit.xml", gradebook.junit_bytes(grades, profile.name))
    return grades


def main(args, command: tuple | None = None) -> int:
    """Grade every student's checkout; the exit code is one of harness.cli.args' (the module docstring)."""
    try:
        return _main(args, command)
    except KeyboardInterrupt:
        print("interrupted: finished tasks are recorded in OUT/checkouts-state.json; --resume runs the rest",
              file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(args, command: tuple | None = None) -> int:
    from harness.cli import gradescope

    try:
        import submitit  # noqa: F401 - only this command needs it
    except ImportError:
        print("error: grade-checkouts submits through submitit, which is not installed: "
              "python -m pip install -e \".[cluster]\"", file=sys.stderr)
        return EXIT_USAGE
    root = Path(args.checkouts).expanduser()
    if not root.is_dir():
        print(f"error: {root}: no such folder; give a folder with one <student>/Megatron-LM/ each", file=sys.stderr)
        return EXIT_USAGE
    out = Path(args.out).expanduser() if args.out else outdir.default_out(root)
    try:
        profile = load_profile(args.criteria)
        weights = gradescope.load_weights(args.weights or gradescope.WEIGHTS_DIR / "checkout-weights.toml")
        weights.max_scores(profile)
    except (CriteriaError, gradescope.GradescopeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    found = {f.name: find_checkout(f) for f in student_folders(root, out)}
    if not found:
        print(f"error: {root}: no student folders; put each student's checkout at {root}/<student>/{CHECKOUT_DIR}",
              file=sys.stderr)
        return EXIT_USAGE
    students = [(name, checkout, problem) for name, (checkout, _script, problem) in found.items()]
    runnable = [s for s in students if s[2] is None]
    if args.print_sbatch:
        print(sbatch_script(args, out.resolve() / "submitit", max(1, len(runnable))))
        return 0
    if command is None and args.task_command:
        command = tuple(shlex.split(args.task_command))
    try:
        outdir.claim(out, root, student_folders(root, out))
        clear_outputs(out)         # no task sees an earlier run's grades; they are written again at the merge
        outdir.real_dir(out, "tasks")
        outdir.real_dir(out, "submitit")    # submitit writes its job folders there: never through a link
    except (outdir.OutError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    state = load_state(out) if args.resume else {"students": {}}
    entries = state["students"] = {n: e for n, e in state["students"].items() if n in found}
    # a Slurm task submitted before (--no-wait) is waited for; a local one died with the process that ran it
    cluster = which_cluster(args)
    waiting = [s[0] for s in runnable if cluster == "slurm" and entries.get(s[0], {}).get("status") == SUBMITTED
               and entries[s[0]].get("job_id")]
    todo = [s for s in runnable if entries.get(s[0], {}).get("status") != FINISHED and s[0] not in waiting]
    specs = []
    for name, checkout, _ in todo:
        script = found[name][1]
        specs.append(tasks.TaskSpec(student=name, checkout=str(checkout.resolve()),
                                    task_dir=str((out / "tasks" / name).resolve()), suite=str(REPO),
                                    command=command or tasks.DEFAULT_COMMAND,
                                    train_script=str(script.resolve()) if script else None, criteria=args.criteria,
                                    timeout_s=max(60.0, args.time_limit * 0.9), keep_copy=args.keep_copies,
                                    out_root=str(out.resolve())))
        entries[name] = {"status": "pending", "job_id": None, "reason": None, "result": None}
    kept = len(runnable) - len(todo) - len(waiting)
    print(f"{len(specs)} checkout(s) to run" + (f", {kept} already finished" if kept else "")
          + (f", {len(waiting)} submitted before" if waiting else "")
          + (f", {len(students) - len(runnable)} without a usable checkout" if len(students) > len(runnable) else ""))
    if specs or waiting:
        try:
            executor = make_executor(args, out.resolve() / "submitit", max(1, len(specs)))
        except (RuntimeError, ValueError, NameError) as exc:      # e.g. --cluster slurm where there is no srun
            print(f"error: --cluster {args.cluster}: {exc}; use --cluster local on a machine without Slurm",
                  file=sys.stderr)
            return EXIT_USAGE
        if waiting:
            reattach(executor, waiting, entries)
        gpus = local_gpus(args.gpus) if executor.cluster == "local" else []
        if executor.cluster == "local" and args.gpus is None and not gpus and specs:
            print("error: this machine shows no GPU (nvidia-smi lists none) and checkout mode needs one per task: "
                  "no student was run or graded; run on a GPU machine, name the GPUs with --gpus IDS, or --gpus none "
                  "to run the tasks without one", file=sys.stderr)
            save_state(out, state)
            return EXIT_GRADER_ERROR
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), saved]))   # the jobs import this suite
        try:
            if specs:
                run_jobs(executor, specs, args, state, out, gpus)
        except (OSError, RuntimeError, ValueError) as exc:     # sbatch refused the array, a bad parameter, ...
            save_state(out, state)
            print(f"error: submitting to {executor.cluster} failed: {exc}; check --partition/--account/--qos/--time-limit "
                  f"against the cluster's limits (sinfo, sacctmgr show assoc), then run again with --resume",
                  file=sys.stderr)
            return EXIT_USAGE
        finally:
            os.environ.pop("PYTHONPATH") if saved is None else os.environ.update(PYTHONPATH=saved)
        if args.no_wait and executor.cluster == "slurm":
            print(f"submitted {len(specs)} task(s); collect the grades once the array has ended with: "
                  f"python -m harness grade-checkouts {root} --out {out} --resume")
            return 0
    save_state(out, state)
    grades = merge(students, state, profile, weights, out)
    bad = [g.submission for g in grades if g.verdict != "pass"]
    died_ = [g.submission for g in grades if g.verdict == "died"]   # the grader's outcome, not the student's
    print(f"{len(grades) - len(bad)} of {len(grades)} checkouts passed; grades in {out}/grades.md"
          + (f"; failed: {', '.join(sorted(set(bad) - set(died_)))}" if set(bad) - set(died_) else "")
          + (f"; died (re-run with --resume): {', '.join(died_)}" if died_ else ""))
    return EXIT_GRADER_ERROR if died_ else EXIT_FAILED if bad else EXIT_PASSED
