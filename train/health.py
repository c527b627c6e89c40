"""``python -m trainbox health``: is the supervised run alive and making progress?

Reads ``RUN_DIR/state.json``, which the supervisor rewrites at least every
second while it watches a child. Healthy means: the supervisor is alive and
the child has been silent for less than its current budget.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, Tuple

import psutil

from trainbox.rundir import RunDir
from trainbox.supervisor import LIVE_STATES, State

#: How old state.json may be before the supervisor itself counts as hung.
STATE_STALE_S = 30.0


def check(run_dir: Path, now: float = 0.0) -> Tuple[bool, str]:
    """(healthy, one line saying why). A state.json that is not the supervisor's (hand-edited) is unhealthy."""
    now = now or time.time()
    path = RunDir(Path(run_dir)).state
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return False, f"no supervisor state at {path} (not started yet?)"
    except (OSError, ValueError) as exc:
        return False, f"unreadable supervisor state at {path} ({exc})"
    if not isinstance(state, dict):
        return False, f"unreadable supervisor state at {path} (not a JSON object)"
    try:
        return _judge(state, now)
    except (TypeError, ValueError, AttributeError) as exc:
        return False, f"unreadable supervisor state at {path} ({exc})"


def _judge(state: Dict[str, Any], now: float) -> Tuple[bool, str]:
    phase = State(state.get("state", State.STOPPED.value))
    if phase is State.SUCCEEDED:
        return True, "training completed"
    if phase not in LIVE_STATES:
        return False, f"supervisor is {phase.value}"
    if not psutil.pid_exists(int(state.get("supervisor_pid", 0))):
        return False, "supervisor process is gone"
    age = now - float(state.get("updated_ts", 0))
    if age > STATE_STALE_S:
        return False, f"supervisor state not updated for {age:.0f} s"
    if phase is State.BACKOFF:
        wait = max(0.0, float(state.get("next_attempt_ts") or now) - now)
        return True, f"backoff, attempt {state.get('attempt', 0)} starts in {wait:.0f} s"
    budget = state.get("budget") or {}
    silent = float(state.get("silent_s") or 0.0) + age
    limit = float(budget.get("seconds", 0) or 0)
    if limit and silent > limit:
        return False, f"silent {silent:.0f} s > {budget.get('name')} budget {limit:.0f} s"
    beat = state.get("heartbeat") or {}
    where = ", ".join(f"{k} {beat[k]}" for k in ("phase", "epoch", "batch") if k in beat)
    return True, f"{phase.value}, attempt {state.get('attempt', 0)}" + (f", {where}" if where else "") + (
        f", silent {silent:.0f}/{limit:.0f} s" if limit else ""
    )
