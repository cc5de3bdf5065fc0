"""A stand-in for checkout mode (`pytest -m gpu acceptance/test_checkout.py --megatron-lm ...`) in CPU tests of
`python -m harness grade-checkouts`: no GPU, no Megatron-LM. It reads what to do from the file STUB in the checkout
it is given, writes the JUnit file and report.json checkout mode would write, and appends one JSON line about the
run (its arguments, what it could see) to $CHECKOUT_STUB_RUNS.

STUB: pass | fail-final-loss | die (kills the job process that runs it) | hang | no-junit | gpu (needs a GPU: with
no CUDA_VISIBLE_DEVICES every test is skipped, as an older suite skipped `-m gpu` tests without one; it records when it
ran) | gpu-stop (needs a GPU: with no CUDA_VISIBLE_DEVICES it stops before any test, exit 3 with one line and a JUnit
file of no test, as conftest.py stops `-m gpu` now)
"""

import argparse
import json
import os
import signal
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

CRITERIA = ("recipe", "datasets-built", "training-started", "exit-code", "ran-on-gpu", "first-loss", "loss-decreases",
            "final-loss", "golden-final-loss", "golden-curve", "no-nan", "skips-early-only", "checkpoints-saved",
            "checkpoint-tracker", "checkpoint-loads", "gpu-memory")

parser = argparse.ArgumentParser()
parser.add_argument("--megatron-lm", required=True)
parser.add_argument("--run-dir", required=True)
parser.add_argument("--junitxml", required=True)
parser.add_argument("--train-script")
parser.add_argument("--criteria")
args = parser.parse_args()

checkout, run_dir, junit = Path(args.megatron_lm), Path(args.run_dir), Path(args.junitxml)
behaviour = (checkout / "STUB").read_text().strip()
out = junit.parent.parent.parent          # OUT/tasks/<student>/junit.xml
with open(os.environ["CHECKOUT_STUB_RUNS"], "a") as fh:
    fh.write(json.dumps({"argv": sys.argv[1:], "behaviour": behaviour, "cwd": os.getcwd(),
                         "grades_visible": any((out / n).exists() for n in ("grades.json", "gradescope")),
                         "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}) + "\n")
no_gpu = behaviour == "gpu" and not os.environ.get("CUDA_VISIBLE_DEVICES")
if behaviour == "gpu":
    started = time.time()
    time.sleep(0.3)
    with open(os.environ["CHECKOUT_STUB_RUNS"] + ".spans", "a") as fh:
        fh.write(json.dumps({"gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": started, "end": time.time()})
                 + "\n")
if behaviour == "gpu-stop" and not os.environ.get("CUDA_VISIBLE_DEVICES"):
    ET.ElementTree(ET.Element("testsuite", name="pytest", tests="0")).write(junit)
    print("! _pytest.outcomes.Exit: bert-acceptance: `pytest --megatron-lm PATH`: no usable CUDA GPU on this machine: "
          "gpu: no GPU visible: NVML: NVMLError_LibraryNotFound: NVML Shared Library Not Found (needs >= 1 NVIDIA GPU "
          "with >= 8 GiB free); fix: run on a machine with an NVIDIA GPU and its driver !")
    sys.exit(3)
if behaviour == "die":
    os.kill(os.getppid(), signal.SIGKILL)      # the job's process dies, as on a node failure
    sys.exit(1)
if behaviour == "hang":
    time.sleep(600)
if behaviour == "no-junit":
    print("ERROR: usage: pytest [options]", file=sys.stderr)
    sys.exit(4)

suite = ET.Element("testsuite", name="pytest")
can_train = ET.SubElement(suite, "testcase", classname="acceptance.test_checkout", name="test_checkout_can_train_here")
SKIP = "needs 1 CUDA GPU(s), found 0: run `pytest -m gpu` on a GPU machine"
if no_gpu:
    ET.SubElement(can_train, "skipped", message=SKIP).text = SKIP
verdicts = []
for cid in CRITERIA:
    failed = behaviour == "fail-final-loss" and cid == "final-loss"
    status, measured = ("fail", "lm loss 9.1 at iteration 200") if failed else ("pass", "ok")
    case = ET.SubElement(suite, "testcase", classname="acceptance.test_checkout",
                         name=f"test_checkout_meets_criterion[{cid}]")
    props = ET.SubElement(case, "properties")
    for name, value in (("criterion", cid), ("status", status), ("measured", measured), ("expected", "in band")):
        if not no_gpu:      # a skipped test records no property
            ET.SubElement(props, "property", name=name, value=value)
    if no_gpu:
        ET.SubElement(case, "skipped", message=SKIP).text = SKIP
    if failed:
        ET.SubElement(case, "failure", message="FAIL: final lm loss [final-loss]").text = (
            "FAIL: final lm loss [final-loss]\n  measured:  lm loss 9.1 at iteration 200\n  expected:  in band")
    verdicts.append({"id": cid, "status": status, "measured": measured, "expected": "in band", "where": "-",
                     "consequence_of": None})
ET.ElementTree(suite).write(junit)
(run_dir / "megatron-lm").mkdir(parents=True, exist_ok=True)
(run_dir / "megatron-lm" / "report.json").write_text(json.dumps(
    {"profile": args.criteria, "runs": [{"name": "checkout", "recipe": "a", "diagnosis": None, "log": None,
                                         "verdicts": verdicts}]}))
sys.exit(1 if behaviour == "fail-final-loss" else 0)
