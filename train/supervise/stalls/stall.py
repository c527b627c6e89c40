"""A stall, from the moment it is called to the decision: its findings, its incident, and the kill.

:func:`examine` captures what the silent run looks like before anything is touched: the incident report
(:mod:`trainbox.diagnose.incident`: stacks, the tree, the evidence window, GPU state), the cause named from it
(:mod:`trainbox.diagnose.causes`), and where the run stood (:func:`trainbox.supervise.policy.position`, which the
same-place rule compares). The result is a :class:`StallFindings`, the ``stall`` event's content as a typed record.

Then one of two things happens, as ``--on-stall`` says: ``report`` writes the event and kills nothing (observe
mode, one report per silence); ``restart`` ends the tree (:func:`kill`) and turns the attempt's outcome into a
stall with the findings the planner and the policy decide on. A child that ended by itself while its report was
written is not a stall: an exit status 0 then is a success.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from trainbox.diagnose import incident
from trainbox.errors import Stuck, say
from trainbox.rundir.state import State
from trainbox.supervise import policy
from trainbox.supervise.attempt import Attempt, stuck_result
from trainbox.supervise.policy import Outcome, OutcomeKind
from trainbox.supervise.stalls.budgets import Budget, rounded_up
from trainbox.supervise.stalls.silence import Call, stall_line

#: The findings the attempt's outcome keeps for the planner, the policy and the give-up message.
OUTCOME_KEYS = ("budget", "budget_s", "silent_s", "phase", "incident", "cause", "evidence", "at", "rule")


@dataclass(frozen=True)
class StallFindings:
    """What a stall was: the ``stall`` event's fields before the kill (see the events table in docs/contract.md)."""

    profile: Optional[str]
    budget: str
    budget_s: float
    silent_s: float
    phase: Optional[str]
    rule: Optional[str]
    cause: str
    evidence: List[str]
    incident: Optional[str]
    incident_bytes: int
    silent_ranks: Optional[List[int]]
    at: Optional[str]
    incident_s: float
    learned: Dict[str, Any]
    beats: int
    first_beat_ts: Optional[float]
    first_step_ts: Optional[float]
    last_beat: Optional[Dict[str, Any]]
    #: What the tree did when a learned or declared budget ran out, and why a busy silence went on past it
    #: (:meth:`~trainbox.supervise.stalls.silence.SilenceWatch.busy_fields`); None when no such budget ran out.
    busy: Optional[Dict[str, Any]]
    #: Why the incident report could not be written (a full disk); absent from the event when it was.
    incident_error: Optional[str] = field(default=None)

    def fields(self) -> Dict[str, Any]:
        found = asdict(self)
        if found["incident_error"] is None:
            del found["incident_error"]
        return found


def _write_incident(attempt: Attempt, outcome: Outcome, reason: Dict[str, Any], call: Call, session: int) -> Dict[str, Any]:
    """Write the incident report; the findings' ``incident``, ``incident_bytes`` (and ``incident_error``)."""
    where = attempt.run_dir.incident_dir(session, attempt.number)
    try:
        # Declared to `health` (trainbox.supervise.watchdog); ending the tree, which comes next, ends the declaration.
        attempt.record.publish(force=True, quiet_until_ts=time.time() + incident.time_limit(len(attempt.tree.alive())))
        summary = incident.write_incident(
            attempt.run_dir,
            where,
            tree=attempt.tree,
            reason=reason,
            last_beat=outcome.last_beat,
            output_tail=attempt.tee.tail(),
            samples=attempt.watch.window.to_json(),
            diagnose=lambda stacks, kernel: attempt.watch.diagnose(call, stacks, kernel),
        )
    except OSError as exc:  # a full disk: the report is lost, killing and restarting go on
        say(f"cannot write the incident report to {where}: {exc.strerror or exc}")
        return {"incident": None, "incident_bytes": 0, "incident_error": f"{exc.strerror or exc}: {exc.filename or where}"}
    say(f"incident written to {where} ({summary['write_s']:.1f} s)")
    return {"incident": str(where), "incident_bytes": summary["bytes"]}


def examine(attempt: Attempt, outcome: Outcome, budget: Budget, call: Call, silent_s: float, session: int) -> StallFindings:
    """Announce a stall, write its incident report and name its cause."""
    by_rank = attempt.progress.report(time.monotonic())  # under torchrun: silent_ranks and each rank's last beat
    phase = (outcome.last_beat or {}).get("phase")
    say(stall_line(attempt.number, silent_s, budget, call, attempt.watch.limits, phase) + "; writing incident report")
    reason = {
        "profile": attempt.launch.profile,
        "budget": budget.name,
        "budget_s": call.budget_s,
        "silent_s": rounded_up(silent_s, 3),  # called because it exceeds the budget: recorded so
        "phase": phase,
    }
    detected = time.monotonic()
    written = _write_incident(attempt, outcome, dict(reason, attempt=attempt.number, **by_rank), call, session)
    found = attempt.watch.diagnosis_fields(call)
    first = (found["evidence"] or ["no evidence"])[0]
    say(f"attempt {attempt.number} stall cause: {found['cause']} ({first})")
    attempt.record.publish(force=True, last_stall={"attempt": attempt.number, "cause": found["cause"], "evidence": first})
    return StallFindings(
        **reason,
        **found,
        **written,
        silent_ranks=by_rank.get("silent_ranks"),
        at=policy.position(outcome.last_beat, attempt.launch.profile),
        incident_s=round(time.monotonic() - detected, 3),
        learned=attempt.policy.learned(),
        busy=attempt.watch.busy_fields(),
        **outcome.timing(),
        last_beat=outcome.last_beat,
    )


def report_only(attempt: Attempt, findings: StallFindings) -> None:
    """``--on-stall report``: the stall is recorded, nothing is killed."""
    attempt.record.emit("stall", attempt.number, action="report", **findings.fields())


def kill(attempt: Attempt, outcome: Outcome, findings: StallFindings) -> Outcome:
    """``--on-stall restart``: end the tree, record the stall with the kill, and return the attempt's outcome.

    Raises Stuck (after recording the stall with its survivors) when a process outlives SIGKILL.
    """
    diagnosed = time.monotonic()
    code_before_kill = attempt.exit_code()  # the child may have ended by itself while the report was written
    pids = [process.pid for process in attempt.tree.scan()]
    stuck: Optional[Stuck] = None
    try:
        result = attempt.end_tree()
    except Stuck as error:  # recorded as the stall's survivors first, then the run ends on it
        stuck, result = error, stuck_result(error)
    killed = time.monotonic()
    attempt.record.emit(
        "stall",
        attempt.number,
        action="restart",
        kill_s=round(killed - diagnosed, 3),
        killed_ts=round(time.time(), 3),
        sigkilled=result["killed"],
        survivors=result["survivors"],
        continued=result["continued"],  # stopped processes woken after SIGTERM, so that they could act on it
        code_before_kill=code_before_kill,
        **findings.fields(),
    )
    if stuck is not None:
        raise stuck
    say(f"tree killed in {killed - diagnosed:.1f} s")
    found = findings.fields()
    outcome.detail.update({key: found[key] for key in OUTCOME_KEYS}, pids=pids, gpu_before_mib=attempt.gpu_before_mib)
    if code_before_kill == 0:
        say(f"attempt {attempt.number} completed (exit status 0) while its incident report was written")
        outcome.kind, outcome.code = OutcomeKind.EXITED, 0
    return outcome


def stalled(attempt: Attempt, outcome: Outcome, budget: Budget, call: Call, silent_s: float, session: int) -> Outcome:
    """The stall ``call`` called, with ``--on-stall restart``: counted, examined, killed."""
    outcome.kind = OutcomeKind.STALLED
    attempt.record.count(outcome)
    attempt.record.set_state(State.STALLED)
    findings = examine(attempt, outcome, budget, call, silent_s, session)
    return kill(attempt, outcome, findings)
