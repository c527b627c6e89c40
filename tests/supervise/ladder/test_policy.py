"""The ladder policy on scripted histories (milliseconds), its simulator's verdict, and properties under fuzzing.

Each scripted test builds the run's figures as the supervisor would after a
stall or a checkpoint and reads the decision; the simulator (bench/ladder_sim.py)
then plays whole runs, seeded, against the issue's goal.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Dict, Optional, Sequence, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.ladder_sim import FAST_SPEED, Scenario, SimRung, Strategy, mean_wall, scenario, simulate
from trainbox.supervise.ladder.policy import (
    PRIOR_HOURS,
    PRIOR_STALLS,
    Decision,
    Kind,
    PolicyName,
    Probation,
    Rung,
    RungHistory,
    Situation,
    Stall,
    Trigger,
    choose,
    p_at_most,
    stalls_per_hour,
    tally,
)
from trainbox.yolo import profiles

FAST, SAFE = Rung("fast", 1.0), Rung("safe", 0.8)
#: Ten hours of fast's work at 10 it/s.
WORK = 360_000


def hangs(count: int, cost_s: float = 20.0, first: int = 1000, every: int = 1000, phase: str = "train") -> Tuple[Stall, ...]:
    """``count`` stalls at distinct places, each costing ``cost_s`` (half silence, a quarter restart, a quarter redone)."""
    return tuple(
        Stall(f"step {first + i * every}", first + i * every, phase, cost_s / 2, cost_s / 4, cost_s / 4) for i in range(count)
    )


def on(
    current: str,
    history: Dict[str, RungHistory],
    step: int = 50_000,
    now: float = 10_000.0,
    rungs: Sequence[Rung] = (FAST, SAFE),
    **more: object,
) -> Situation:
    return Situation(rungs, current, WORK, now, history, step=step, restart_s=5.0, **more)  # type: ignore[arg-type]


def test_one_stall_in_ten_minutes_and_one_in_ten_hours_are_told_apart() -> None:
    assert stalls_per_hour(1, 10 / 60) == pytest.approx((PRIOR_STALLS + 1) / (PRIOR_HOURS + 10 / 60))
    assert stalls_per_hour(1, 10 / 60) > 30 * stalls_per_hour(1, 10.0)
    assert stalls_per_hour(0, 0.0) == pytest.approx(0.2), "the prior: seed 001's one stall per 5 hours"


def test_the_stall_count_is_poisson_once_the_rate_is_well_known() -> None:
    poisson_2 = math.exp(-2) * (1 + 2 + 2)  # P(N <= 2) for a mean of 2
    assert p_at_most(2, 100_000, 100_000.0, 2.0) == pytest.approx(poisson_2, abs=1e-3)
    assert p_at_most(-1, 3, 1.0, 2.0) == 0.0 and p_at_most(0, 3, 1.0, 0.0) == 1.0


def test_the_issue_example_stays_on_fast_and_says_why_with_its_numbers() -> None:
    stall = Stall("phase train, epoch 1 batch 2574", 2574, "train", silent_s=120.0, handling_s=4.0, redone_s=182.0)
    rungs = (FAST, Rung("safe", 2.1 / 2.6))
    situation = Situation(rungs, "fast", int(41.2 * 3600 * 2.6), 0.0, {"fast": RungHistory(2.6, 4.6, (stall,))}, step=2574)
    decision = choose(situation, Trigger.STALL)
    assert (decision.rung, decision.kind) == ("fast", Kind.STAY)
    assert decision.reason == (
        "fast: 2.6 it/s, 1 stall in 4.6 h, 5.1 min per stall -> 42.0 h to go; safe: 2.1 it/s -> 51.9 h to go; staying on fast"
    )
    event = json.loads(json.dumps(decision.as_dict(), allow_nan=False))
    assert [c["rung"] for c in event["candidates"]] == ["fast", "safe"]
    assert event["candidates"][1]["measured"] is False and event["candidates"][1]["rate"] == pytest.approx(2.1)


def test_a_random_hang_with_a_cheap_resume_stays_fast() -> None:
    decision = choose(on("fast", {"fast": RungHistory(10.0, 1.0, hangs(1))}), Trigger.STALL)
    assert (decision.rung, decision.kind) == ("fast", Kind.STAY)
    fast, safe = decision.candidates
    assert fast.to_go_s is not None and safe.to_go_s is not None and fast.to_go_s < safe.to_go_s


def test_frequent_hangs_step_down() -> None:
    decision = choose(on("fast", {"fast": RungHistory(10.0, 0.2, hangs(24))}), Trigger.STALL)  # one per 30 s
    assert (decision.rung, decision.kind) == ("safe", Kind.DOWN)
    assert "24 stalls in 12.0 min" in decision.reason and decision.reason.endswith("down to safe")


def test_where_safety_costs_ten_times_a_stall_every_ten_minutes_is_worth_staying_for() -> None:
    h100 = (Rung("fast", 0.756), Rung("balanced", 0.102), Rung("safe", 0.104))
    decision = choose(on("fast", {"fast": RungHistory(10.0, 1.0, hangs(6, cost_s=300.0))}, rungs=h100), Trigger.STALL)
    assert (decision.rung, decision.kind) == ("fast", Kind.STAY)
    assert [c.rung for c in decision.candidates] == ["fast", "balanced", "safe"]


def test_a_deterministic_hang_steps_down_at_once_and_never_probes_back_into_its_place() -> None:
    place = Stall("phase train, epoch 3 batch 40", 1040, "train", 10.0, 5.0, 5.0)
    cheap = choose(on("fast", {"fast": RungHistory(10.0, 2.0, (place,))}, step=1040), Trigger.STALL)
    assert cheap.rung == "fast", "one cheap stall alone is weighed, and stays"
    history = {"fast": RungHistory(10.0, 2.0, (place, place)), "safe": RungHistory(8.0, 1.0)}
    down = choose(on("fast", history, step=1040), Trigger.STALL)
    assert (down.rung, down.kind) == ("safe", Kind.DOWN)
    assert "fast: hung twice at phase train, epoch 3 batch 40, banned here" in down.reason
    for step in (900, 1000, 1040):  # checkpoints before the place, however long safe has run
        decision = choose(on("safe", history, step=step, now=1e6, probation=down.probation), Trigger.CHECKPOINT)
        assert decision.kind is Kind.STAY and decision.candidates[0].banned
    past = choose(on("safe", history, step=1041, now=1e6, probation=down.probation), Trigger.CHECKPOINT)
    assert (past.rung, past.kind) == ("fast", Kind.PROBE), "once the run is past the place, fast may be tried again"


def test_a_deterministic_hang_in_a_phase_that_repeats_bans_the_rung_for_the_rest_of_the_run() -> None:
    val = Stall("phase val, epoch 3 batch 99", 1099, "val", 10.0, 5.0, 5.0)
    history = {"fast": RungHistory(10.0, 2.0, (val, val)), "safe": RungHistory(8.0, 1.0)}
    for step in (1100, 10_000, 300_000):
        decision = choose(on("safe", history, step=step, now=1e7), Trigger.CHECKPOINT)
        assert decision.kind is Kind.STAY and decision.candidates[0].banned_at == "phase val, epoch 3 batch 99"


def test_a_deterministic_hang_on_the_last_rung_leaves_nothing_to_try() -> None:
    place = Stall("step 500", 500, "train", 10.0, 5.0, 5.0)
    history = {"fast": RungHistory(10.0, 1.0, hangs(30)), "safe": RungHistory(8.0, 1.0, (place, place))}
    for policy in PolicyName:
        decision = choose(on("safe", history, step=500, policy=policy), Trigger.STALL)
        assert (decision.rung, decision.kind, decision.exhausted) == ("safe", Kind.STAY, True)
        assert decision.reason.endswith("nothing left to try")


def probe_from_safe(failures: int, fast_stalls: int) -> Decision:
    """A checkpoint on safe long after fast stepped down (fast: 20 stalls in 0.2 h, 20 s each; restart 5 s)."""
    history = {"fast": RungHistory(10.0, 0.2, hangs(fast_stalls)), "safe": RungHistory(8.0, 1.0)}
    probation = Probation(since=0.0, failures={"fast": failures} if failures else {})
    return choose(on("safe", history, now=1e6, probation=probation), Trigger.CHECKPOINT)


def test_probation_doubles_its_wait_after_each_failed_probe() -> None:
    first = probe_from_safe(0, 20)
    assert (first.rung, first.kind, first.moves) == ("fast", Kind.PROBE, True)
    assert first.probation.probing == "fast" and first.probation.origin == "safe"
    base = first.probation.window_s
    assert base == pytest.approx((5.0 + 20.0) / (1 - 8 / 10)), "ski rental: (restart + cost per stall) / rent"
    probation = first.probation
    for failures in (1, 2):
        history = {"fast": RungHistory(10.0, 0.2, hangs(20 + failures)), "safe": RungHistory(8.0, 1.0)}
        stall_at = probation.since + base / 2
        back = choose(on("fast", history, now=stall_at, probation=probation), Trigger.STALL)
        assert (back.rung, back.kind) == ("safe", Kind.BACK)
        assert back.probation.failures == {"fast": failures} and back.probation.since == stall_at
        wait = base * 2**failures
        early = choose(on("safe", history, now=stall_at + wait - 1, probation=back.probation), Trigger.CHECKPOINT)
        assert early.kind is Kind.STAY and not early.moves and f"probing fast after {wait / 60:.1f} min stable" in early.reason
        again = choose(on("safe", history, now=stall_at + wait + 1, probation=back.probation), Trigger.CHECKPOINT)
        assert (again.rung, again.kind) == ("fast", Kind.PROBE)
        probation = again.probation


def test_a_probe_that_holds_through_probation_passes_and_later_stalls_are_weighed() -> None:
    probe = probe_from_safe(1, 20).probation
    history = {"fast": RungHistory(10.0, 0.4, hangs(20)), "safe": RungHistory(8.0, 1.0)}
    held = choose(on("fast", history, now=probe.since + probe.window_s + 1, probation=probe), Trigger.CHECKPOINT)
    assert held.kind is Kind.STAY and held.probation.probing is None and held.probation.failures == {"fast": 1}
    history["fast"] = RungHistory(10.0, 4.0, hangs(21))
    later = choose(on("fast", history, now=probe.since + 10 * probe.window_s, probation=held.probation), Trigger.STALL)
    assert later.kind is Kind.STAY, "21 stalls in 4 hours at 20 s each are worth staying for"


def test_a_probe_climbs_to_the_fastest_rung_that_pays_not_merely_the_next_one() -> None:
    h100 = (Rung("fast", 0.756), Rung("balanced", 0.102), Rung("safe", 0.104))
    history = {"fast": RungHistory(7.56, 0.5, hangs(10, cost_s=300.0)), "safe": RungHistory(1.04, 2.0)}
    decision = choose(on("safe", history, now=1e6, rungs=h100), Trigger.CHECKPOINT)
    assert (decision.rung, decision.kind) == ("fast", Kind.PROBE), "balanced is slower than safe here: never a probe"
    assert decision.reason.startswith("fast: 7.6 it/s, 10 stalls in 30.0 min, 5.0 min per stall")


def test_no_probe_near_the_end_or_from_the_top() -> None:
    history = {"fast": RungHistory(10.0, 0.2, hangs(20)), "safe": RungHistory(8.0, 1.0)}
    near_end = replace(on("safe", history, now=1e6), remaining_steps=400)
    assert choose(near_end, Trigger.CHECKPOINT).kind is Kind.STAY, "saving 10 s cannot pay for a failed probe"
    top = choose(on("fast", {"fast": RungHistory(10.0, 1.0)}, now=1e6), Trigger.CHECKPOINT)
    assert (top.rung, top.kind) == ("fast", Kind.STAY)


def deadline_case(deadline: Optional[float]) -> Decision:
    """fast: 5 stalls of 20 min in 10 h, 8 h of work to go on it; safe: 0.85 of its speed, 5 h without a stall."""
    long_hangs = hangs(5, cost_s=1200.0)
    history = {"fast": RungHistory(10.0, 10.0, long_hangs), "safe": RungHistory(8.5, 5.0)}
    return choose(Situation((FAST, SAFE), "fast", 288_000, 0.0, history, step=5000, deadline=deadline), Trigger.STALL)


def test_a_deadline_that_only_safe_is_sure_to_meet_picks_it() -> None:
    assert deadline_case(None).rung == "fast", "without a deadline fast finishes first, on average"
    decision = deadline_case(9.6 * 3600)
    fast, safe = decision.candidates
    assert fast.p_deadline is not None and safe.p_deadline is not None and fast.p_deadline < 0.8 < 0.95 < safe.p_deadline
    assert (decision.rung, decision.kind) == ("safe", Kind.DOWN) and "% by the deadline" in decision.reason


def test_no_probe_while_the_deadline_is_safe_on_the_current_rung() -> None:
    history = {"fast": RungHistory(10.0, 0.2, hangs(20)), "safe": RungHistory(8.0, 1.0)}
    decision = choose(on("safe", history, now=1e6, deadline=1e6 + 100 * 3600), Trigger.CHECKPOINT)
    assert decision.kind is Kind.STAY and "sure enough of the deadline" in decision.reason


def test_down_is_todays_rule_one_stall_moves_down_the_profile_fallbacks_for_good() -> None:
    chain = [p for p in profiles.fallback_chain(profiles.load("fast")) if p.name != "safe-native"]
    rungs = [Rung(p.name) for p in chain]
    cheap = {p.name: RungHistory(10.0, 5.0, hangs(1)) for p in chain}
    for profile in chain:
        situation = on(profile.name, cheap, rungs=rungs, policy=PolicyName.DOWN)
        decision = choose(situation, Trigger.STALL)
        assert decision.rung == (profile.fallback or profile.name), "one cheap stall moves down where cost would stay"
        assert decision.kind is (Kind.DOWN if profile.fallback else Kind.STAY)
        climb = choose(replace(situation, now=1e9), Trigger.CHECKPOINT)
        assert (climb.rung, climb.kind) == (profile.name, Kind.STAY), "down never climbs"
    assert choose(on("fast", cheap, rungs=rungs), Trigger.STALL).rung == "fast"


def test_without_a_measured_rate_the_cost_policy_steps_down_as_today() -> None:
    decision = choose(on("fast", {"fast": RungHistory(None, 0.001, hangs(1))}), Trigger.STALL)
    assert (decision.rung, decision.kind) == ("safe", Kind.DOWN)
    assert decision.reason.startswith("no step rate measured yet: down to safe")


def test_the_tally_sets_time_lost_to_stalls_against_what_safety_would_have_cost() -> None:
    history = {"fast": RungHistory(10.0, 2.0, hangs(3, cost_s=60.0)), "safe": RungHistory(8.0, 1.0)}
    result = tally(on("fast", history))
    assert result.lost_to_stalls_s == pytest.approx(180.0)
    assert result.safety_would_cost_s == pytest.approx(2 * 3600 * (10 / 8 - 1))


def test_a_bad_ladder_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="at least one rung"):
        choose(Situation((), "fast", 1, 0.0), Trigger.STALL)
    with pytest.raises(ValueError, match="'turbo' is not on the ladder"):
        choose(Situation((FAST, SAFE), "turbo", 1, 0.0), Trigger.STALL)


# -- the simulator --------------------------------------------------------------------------------------------


def test_the_simulator_is_deterministic_and_ideal_is_the_limit() -> None:
    case = scenario(120.0, 10.0, 5.0, hours=0.25)
    assert simulate(case, Strategy.COST, 7).wall_s == simulate(case, Strategy.COST, 7).wall_s
    ideal = simulate(case, Strategy.IDEAL, 7)
    assert ideal.wall_s == pytest.approx(0.25 * 3600) and ideal.stalls == 0
    assert simulate(case, Strategy.SAFE, 7).wall_s == pytest.approx(0.25 * 3600 / 0.8)


def test_simulated_cost_policy_meets_the_issue_goal_at_a_20_s_resume() -> None:
    """(b) within 10 % of the best of (a) and (c) at every rate, and better than both at one hang per 2 minutes."""
    seeds = range(3)
    for per_hour in (0.0, 30.0, 120.0):
        case = scenario(per_hour, 10.0, 5.0, hours=0.5)
        down, cost, safe = (mean_wall(case, s, seeds) for s in (Strategy.DOWN, Strategy.COST, Strategy.SAFE))
        assert cost <= 1.10 * min(down, safe), f"{per_hour}/h: cost {cost:.0f} s, down {down:.0f} s, safe {safe:.0f} s"
        if per_hour == 30.0:
            assert cost < min(down, safe), f"cost {cost:.0f} s, down {down:.0f} s, safe {safe:.0f} s"


def test_a_simulated_deterministic_hang_is_passed_on_safe_and_never_probed_into() -> None:
    rungs = (SimRung("fast", FAST_SPEED, hangs_at=(40_000,)), SimRung("safe", 80.0))
    result = simulate(Scenario(rungs, 90_000), Strategy.COST, 0)
    assert result.stalls == 2, "the first stall is weighed, the second at the same place bans fast there"
    assert [kind for kind, _, _ in result.moves] == ["down", "probe"]
    assert result.last is not None and result.last.rung == "fast"


# -- properties -----------------------------------------------------------------------------------------------

NAMES = ("fast", "balanced", "safe")
numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**6), 10**12))
stall = st.builds(
    Stall,
    at=st.sampled_from(("step 5", "step 9", "phase val, epoch 1 batch 0", "")),
    step=st.one_of(st.none(), st.integers(-10, 10**6)),
    phase=st.sampled_from(("train", "val", "setup", None)),
    silent_s=numbers,
    handling_s=numbers,
    redone_s=numbers,
)
history = st.builds(
    RungHistory,
    rate=st.one_of(st.none(), numbers),
    hours=numbers,
    stalls=st.lists(stall, max_size=6).map(tuple),
)
probation = st.builds(
    Probation,
    since=numbers,
    probing=st.one_of(st.none(), st.sampled_from(NAMES + ("gone",))),
    origin=st.one_of(st.none(), st.sampled_from(NAMES + ("gone",))),
    window_s=numbers,
    failures=st.dictionaries(st.sampled_from(NAMES), st.integers(-5, 10**6)),
)


@st.composite
def situations(draw: st.DrawFn) -> Situation:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4))
    rungs = [Rung(name, draw(numbers)) for name in names]
    return Situation(
        rungs=rungs,
        current=draw(st.sampled_from(names)),
        remaining_steps=draw(st.integers(-100, 10**15)),
        now=draw(numbers),
        history=draw(st.dictionaries(st.sampled_from(NAMES + ("other",)), history)),
        step=draw(st.one_of(st.none(), st.integers(-10, 10**6))),
        deadline=draw(st.one_of(st.none(), numbers)),
        restart_s=draw(st.one_of(st.none(), numbers)),
        probation=draw(probation),
        policy=draw(st.sampled_from(PolicyName)),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(situations(), st.sampled_from(Trigger))
def test_any_figures_give_a_known_rung_never_a_banned_one_and_strict_json(situation: Situation, trigger: Trigger) -> None:
    decision = choose(situation, trigger)
    names = [r.name for r in situation.rungs]
    assert decision.rung in names and isinstance(decision.reason, str) and decision.reason
    chosen = next(c for c in decision.candidates if c.rung == decision.rung)
    if decision.exhausted:
        assert decision.rung == situation.current and decision.kind is Kind.STAY
    else:
        assert not chosen.banned, decision.reason
    if trigger is Trigger.STALL:
        assert names.index(decision.rung) >= names.index(situation.current) or decision.kind is Kind.BACK
    json.dumps(decision.as_dict(), allow_nan=False)
    tally(situation)
