"""Doctor results as text: one line per check, and each failure's fix on the line itself."""

from __future__ import annotations

from typing import Iterable, List

from trainbox.doctor.result import Check, Status

_MARK = {Status.OK: "ok  ", Status.FAIL: "FAIL", Status.WARN: "warn", Status.NOT_APPLICABLE: "n/a "}


def line(check: Check) -> str:
    text = f"{_MARK[check.status]}  {check.name}: {check.detail}"
    return f"{text} -> fix: {check.fix}" if check.fix else text


def format_report(checks: Iterable[Check]) -> str:
    """Every check on its own line, then a summary line that counts failures and warnings."""
    checks = list(checks)
    lines: List[str] = [line(c) for c in checks]
    failed = sum(c.status is Status.FAIL for c in checks)
    warned = sum(c.status is Status.WARN for c in checks)
    if failed or warned:
        lines.append(f"{failed} failure(s), {warned} warning(s): fix the lines marked FAIL first")
    else:
        lines.append("all checks passed")
    return "\n".join(lines) + "\n"


def exit_status(checks: Iterable[Check]) -> int:
    """1 when any check failed (warnings do not fail), else 0."""
    return 1 if any(c.status is Status.FAIL for c in checks) else 0
