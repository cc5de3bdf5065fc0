"""Compare two pytest JUnit XML files test by test: the verdict of each test (passed, failed, error, skipped,
xfailed) in run A against run B. Usage: python compare.py A.xml B.xml  (exit 1 when any verdict differs)."""

import sys
import xml.etree.ElementTree as ET


def verdicts(path):
    out = {}
    for case in ET.parse(path).iter("testcase"):
        key = f"{case.get('classname')}::{case.get('name')}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        skipped = case.find("skipped")
        if skipped is not None and (skipped.get("type") == "pytest.xfail" or "xfail" in (skipped.get("message") or "")):
            out[key] = "xfailed"
        else:
            out[key] = kinds[0] if kinds else "passed"
    return out


a, b = verdicts(sys.argv[1]), verdicts(sys.argv[2])
counts = lambda v: {k: list(v.values()).count(k) for k in sorted(set(v.values()))}
print(f"A: {len(a)} tests {counts(a)}")
print(f"B: {len(b)} tests {counts(b)}")
only = sorted(set(a) ^ set(b))
differ = sorted(k for k in set(a) & set(b) if a[k] != b[k])
print(f"in one run only: {len(only)}" + "".join(f"\n  {k}" for k in only[:20]))
print(f"verdicts that differ: {len(differ)}" + "".join(f"\n  {k}: {a[k]} / {b[k]}" for k in differ))
sys.exit(1 if only or differ else 0)
