"""One submission's grade as one typed, frozen record: built once (judged, not judged, a copy found, a cluster
task's outcome), written by every writer through `to_dict()` (grades.json/.md/.csv, JUnit, grade.json, Gradescope's
results.json, grade-checkouts' grades), read back with `from_dict()`.

`to_dict()` gives the keys in one order, the order every grade file has always had:

    submission, log, save_dir, [checkout], verdict, failed, not_measured, recipe, recipe_detected_by, [provenance],
    diagnosis, diagnosis_id, diagnosis_cause, criteria, loss_curve, [task]

A key in brackets is written only by the grades that have it (ABSENT otherwise): `checkout` and `task` by
grade-checkouts, `provenance` by a judged submission. Each criterion entry is `id, [label], status, measured,
expected, where, consequence_of, message` (`label` only in grade-checkouts' grades).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from functools import cached_property

from harness.judge.profiles import FAIL, NOT_MEASURABLE, Verdict


class _Absent:
    """A key this grade does not have (not None: None is written as null)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self):
        return (_Absent, ())


ABSENT = _Absent()


class GradeFormatError(ValueError):
    """A grade dict that is not one this module writes (a missing key, a wrong type)."""


def _text_or_none(value, key: str):
    if value is None or isinstance(value, str):
        return value
    raise GradeFormatError(f"{key}: {type(value).__name__}, not text or null")


def _texts(value, key: str) -> tuple:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise GradeFormatError(f"{key}: not a list of texts")
    return tuple(value)


@dataclass(frozen=True)
class CriterionEntry:
    """One criterion of a grade: its id, outcome, what was measured and expected, where, and its message."""

    id: str
    status: str
    measured: str
    expected: str
    where: str | None
    consequence_of: str | None
    message: str
    label: object = ABSENT           # written by grade-checkouts only

    @classmethod
    def of(cls, v: Verdict) -> "CriterionEntry":
        """A judged Verdict as the grade's entry (the one place a Verdict becomes a grade's criterion)."""
        return cls(v.criterion_id, v.status, v.measured, v.expected, v.where, v.consequence_of, v.message)

    def to_dict(self) -> dict:
        head = {"id": self.id} if self.label is ABSENT else {"id": self.id, "label": self.label}
        return {**head, "status": self.status, "measured": self.measured, "expected": self.expected,
                "where": self.where, "consequence_of": self.consequence_of, "message": self.message}

    @classmethod
    def from_dict(cls, d) -> "CriterionEntry":
        if not isinstance(d, dict):
            raise GradeFormatError("a criterion entry is not an object")
        try:
            return cls(d["id"], d["status"], d["measured"], d["expected"], d["where"], d["consequence_of"],
                       d["message"], d.get("label", ABSENT))
        except KeyError as exc:
            raise GradeFormatError(f"a criterion entry lacks {exc}") from None


@dataclass(frozen=True)
class Grade:
    """One submission's grade (the fields in the order to_dict writes them)."""

    submission: str
    log: str | None = None
    save_dir: str | None = None
    checkout: object = ABSENT                    # str | None in grade-checkouts' grades
    verdict: str = "fail"                        # pass, fail, error, incomplete; grade-checkouts: died
    failed: tuple = ()
    not_measured: tuple = ()
    recipe: str | None = None
    recipe_detected_by: str | None = None
    provenance: object = ABSENT                  # tuple of texts in a judged submission's grade
    diagnosis: str | None = None
    diagnosis_id: str | None = None
    diagnosis_cause: str | None = None
    criteria: tuple = ()                         # CriterionEntry, in the order judged
    loss_curve: str | None = None
    task: object = ABSENT                        # dict: grade-checkouts' task (host, returncode, ...)

    # ------------------------------------------------------------ built

    @classmethod
    def judged(cls, submission: str, log, save_dir, j, loss_curve: str | None) -> "Grade":
        """A judged submission's grade from its criteria.Judgement."""
        return cls(submission, str(log) if log else None, str(save_dir) if save_dir else None, verdict=j.verdict,
                   failed=tuple(j.ids(FAIL)), not_measured=tuple(j.ids(NOT_MEASURABLE)), recipe=j.recipe,
                   recipe_detected_by=j.recipe_how, provenance=tuple(j.provenance),
                   diagnosis=j.diagnosis.summary() if j.diagnosis else None,
                   diagnosis_id=j.diagnosis.cause_id if j.diagnosis else None,
                   diagnosis_cause=j.diagnosis.cause if j.diagnosis else None,
                   criteria=tuple(CriterionEntry.of(v) for v in j.verdicts), loss_curve=loss_curve)

    @classmethod
    def not_judged(cls, submission: str, verdict: str, cause_id: str, cause: str, log=None, save=None) -> "Grade":
        """A grade without criteria: refused, no log, grader error, or not graded (interrupted); `diagnosis` is
        `cause_id: cause` (cause as given when it already starts so)."""
        return cls(submission, str(log) if log else None, str(save) if save else None, verdict=verdict,
                   failed=("submission",) if verdict == "fail" else (),
                   diagnosis=cause if cause.startswith(f"{cause_id}:") else f"{cause_id}: {cause}",
                   diagnosis_id=cause_id, diagnosis_cause=cause)

    def with_copy(self, v: Verdict) -> "Grade":
        """This grade with the failing log-copy verdict `v` added: its verdict fail (an error stays an error), the
        id in `failed`, the copy its root cause (a root cause the log had is kept after it)."""
        earlier = self.diagnosis
        return replace(self, criteria=(*self.criteria, CriterionEntry.of(v)), failed=(*self.failed, v.criterion_id),
                       verdict="fail" if self.verdict == "pass" else self.verdict,
                       diagnosis=f"{v.criterion_id}: {v.measured}" + (
                           f" (and the log's own: {earlier})" if earlier else ""),
                       diagnosis_id=v.criterion_id, diagnosis_cause=v.measured)

    def update(self, **changes) -> "Grade":
        """A copy with these fields changed."""
        return replace(self, **changes)

    # ------------------------------------------------------------ written and read back

    def to_dict(self) -> dict:
        """The grade as JSON-able data, keys in the order of the module docstring."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is ABSENT:
                continue
            if f.name == "criteria":
                value = [c.to_dict() for c in value]
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, dict):
                value = dict(value)
            out[f.name] = value
        return out

    @cached_property
    def json_text(self) -> str:
        """grade.json's text: json.dumps(to_dict(), indent=2) and a newline (made once per record)."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, d) -> "Grade":
        """A grade read back (grade.json, grades.json, a worker's report); GradeFormatError when it is not one."""
        if not isinstance(d, dict):
            raise GradeFormatError("a grade is not an object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise GradeFormatError(f"unknown key(s) {', '.join(map(repr, unknown))}")
        if not isinstance(d.get("submission"), str):
            raise GradeFormatError("submission: missing or not text")
        if not isinstance(d.get("verdict"), str):
            raise GradeFormatError("verdict: missing or not text")
        criteria = d.get("criteria", [])
        if not isinstance(criteria, list):
            raise GradeFormatError("criteria: not a list")
        kwargs = {"submission": d["submission"], "verdict": d["verdict"],
                  "criteria": tuple(CriterionEntry.from_dict(c) for c in criteria)}
        for key in ("log", "save_dir", "recipe", "recipe_detected_by", "diagnosis", "diagnosis_id",
                    "diagnosis_cause", "loss_curve"):
            kwargs[key] = _text_or_none(d.get(key), key)
        for key in ("failed", "not_measured"):
            kwargs[key] = _texts(d.get(key, []), key)
        if "provenance" in d:
            kwargs["provenance"] = _texts(d["provenance"], "provenance")
        if "checkout" in d:
            kwargs["checkout"] = _text_or_none(d["checkout"], "checkout")
        if "task" in d:
            if not isinstance(d["task"], dict):
                raise GradeFormatError("task: not an object")
            kwargs["task"] = dict(d["task"])
        return cls(**kwargs)


def as_dict(grade) -> dict:
    """A grade as a dict: a Grade's to_dict(), a dict as it is (the writers take either)."""
    return grade.to_dict() if isinstance(grade, Grade) else grade
