"""The harness's own exceptions, under one base (HarnessError), and the one interrupt (Interrupted).

InputError is bad input a user can fix: it names the file, the line and the fix. Interrupted is SIGINT or SIGTERM
reaching the harness, raised like Ctrl-C and naming the signal, whichever command or stage received it.
"""

from __future__ import annotations

from pathlib import Path


class HarnessError(Exception):
    """The base of every exception the harness raises on purpose (a bad input, a bad profile, a bad OUT)."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the caller: raised like Ctrl-C, naming the signal."""

    def __init__(self, signame: str = "SIGTERM"):
        super().__init__(signame)
        self.signame = signame


class InputError(HarnessError, ValueError):
    """Bad input a user can fix; str() reads "<path>:<line>: <message>. Fix: <fix>"."""

    def __init__(self, message: str, *, path: str | Path | None = None, line: int | None = None,
                 fix: str | None = None) -> None:
        self.message = message.rstrip(". ")
        self.path = None if path is None else str(path)
        self.line = line
        self.fix = fix
        super().__init__(self._render())

    def _render(self) -> str:
        where = ":".join(str(part) for part in (self.path, self.line) if part is not None)
        text = f"{where}: {self.message}" if where else self.message
        return f"{text}. Fix: {self.fix}" if self.fix else text

    def __reduce__(self):
        """Survive pickling across a process pool (keyword-only arguments defeat the default)."""
        return _rebuild, (type(self), self.message, self.path, self.line, self.fix)


def _rebuild(cls, message, path, line, fix):
    """Recreate an InputError (or subclass) from its fields."""
    return cls(message, path=path, line=line, fix=fix)


class CriteriaError(HarnessError, ValueError):
    """A profile, recipe or golden file is wrong; the message names the file and the criterion."""
