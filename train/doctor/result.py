"""The one result type every doctor check returns."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Status(enum.Enum):
    OK = "ok"
    FAIL = "FAIL"
    WARN = "warn"
    #: The check does not apply here (no AMD GPU, CPU torch, ...); never a failure.
    NOT_APPLICABLE = "n/a"


@dataclass(frozen=True)
class Check:
    """One finding: ``detail`` says what was seen; ``fix`` what to do (needed for FAIL and WARN)."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status in (Status.FAIL, Status.WARN) and not self.fix:
            raise ValueError(f"check {self.name!r}: a {self.status.value} needs a fix")


def ok(name: str, detail: str) -> Check:
    return Check(name, Status.OK, detail)


def fail(name: str, detail: str, fix: str) -> Check:
    return Check(name, Status.FAIL, detail, fix)


def warn(name: str, detail: str, fix: str) -> Check:
    return Check(name, Status.WARN, detail, fix)


def not_applicable(name: str, detail: str) -> Check:
    return Check(name, Status.NOT_APPLICABLE, detail)
