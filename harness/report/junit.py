"""A pytest JUnit file read back: one Case per test, with its outcome, its properties (the checklist tests record
criterion, status, measured and expected) and its failure text. Read by the drift job (two runs compared) and by
the cluster grader (a checkout's task turned into a grade): one reader, so the two never disagree on a file."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from harness.base.errors import InputError

OUTCOMES = {"failure": "failed", "error": "error", "skipped": "skipped"}   # JUnit child tag -> pytest outcome


@dataclass(frozen=True)
class Case:
    """One test: outcome (passed/failed/error/skipped), its properties, and what its failure/error/skip said: the
    element's text (pytest's long report) and its message attribute (one line)."""

    classname: str
    name: str
    outcome: str
    properties: dict = field(default_factory=dict)
    text: str = ""
    message_attr: str = ""

    @property
    def test(self) -> str:
        """classname::name, unique within a file."""
        return f"{self.classname}::{self.name}"

    @property
    def report(self) -> str:
        """The whole failure text (the message attribute when the element has none)."""
        return self.text or self.message_attr

    @property
    def message(self) -> str:
        """The failure's first line (the message attribute first, as pytest writes its summary there)."""
        lines = (self.message_attr or self.text).splitlines()
        return lines[0] if lines else ""

    @property
    def criterion(self) -> str:
        """The criterion id it judged, else the test's name."""
        return self.properties.get("criterion") or self.test

    @property
    def measured(self) -> str:
        """What it measured, or its failure's first line."""
        return self.properties.get("measured") or self.message or "no measurement"


def read(path: str | os.PathLike) -> list[Case]:
    """Every testcase of a JUnit file, in file order; OSError or ET.ParseError when it cannot be read."""
    cases = []
    for node in ET.parse(path).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in node.iter("property")}
        outcome, text, message = "passed", "", ""
        for tag, name in OUTCOMES.items():
            child = node.find(tag)
            if child is not None:
                outcome, text, message = name, (child.text or "").strip(), (child.get("message") or "").strip()
                break
        cases.append(Case(node.get("classname", ""), node.get("name", ""), outcome, props, text, message))
    return cases


def load(path: str | os.PathLike) -> dict[str, Case]:
    """test id (classname::name) -> Case; InputError naming the file when it is not JUnit XML."""
    path = Path(path)
    try:
        return {case.test: case for case in read(path)}
    except (OSError, ET.ParseError) as exc:
        raise InputError(f"cannot read JUnit XML ({exc})", path=path,
                         fix="pass the file pytest --junitxml wrote") from None
