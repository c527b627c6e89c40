"""Profiles: the shipped ones load and chain; broken ones fail with one line naming file and field."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

import pytest

from tests.supervised import train_cli
from trainbox.supervise.policy import Outcome, OutcomeKind, Retry
from trainbox.yolo import profiles
from trainbox.yolo.device_defaults import Device, decide
from trainbox.yolo.ladder import ProfileLadder


def test_shipped_profiles_load_and_fall_back_to_safe() -> None:
    assert profiles.available() == ["balanced", "fast", "fast-compile", "safe", "safe-native"]
    compiled = profiles.fallback_chain(profiles.load("fast-compile"))
    assert [p.compile for p in compiled] == [True, False, False, False, False], "a fallback rung without compile"
    chain = profiles.fallback_chain(profiles.load("fast"))
    assert [p.name for p in chain] == ["fast", "balanced", "safe", "safe-native"]
    assert profiles.load("safe-native").conv_backend == "native"
    safe, balanced, fast = (profiles.load(n) for n in ("safe", "balanced", "fast"))
    assert (safe.workers, safe.cuda_workers, safe.amp, safe.fallback) == (0, "auto", False, None)
    assert (balanced.workers, balanced.multiprocessing_context, balanced.persistent_workers) == (2, "spawn", False)
    assert balanced.cuda_workers == "auto" and fast.cuda_workers is None
    assert balanced.prefetch_factor == 2 and balanced.cpu_threads is not None and balanced.amp == "auto"
    assert (fast.workers, fast.amp, fast.multiprocessing_context, fast.persistent_workers) == ("auto", "auto", "forkserver", True)


def _write(directory: Path, name: str, text: str) -> Path:
    base = (profiles.default_profiles_dir() / "safe.yaml").read_text()
    path = directory / f"{name}.yaml"
    path.write_text(base + text)
    return path


@pytest.mark.parametrize(
    "extra, field, words",
    [
        ("workers: many\n", "workers", "expected a whole number of workers (0 or more) or auto, got 'many'"),
        ("workers: -1\n", "workers", "expected a whole number of workers (0 or more) or auto, got -1"),
        ("amp: fp16\n", "amp", "expected true, false or auto, got 'fp16'"),
        ("cuda_workers: 0\n", "(profile)", "multiprocessing_context needs workers > 0"),  # safe's spawn, for CUDA
        ("multiprocessing_context: thread\n", "multiprocessing_context", "'fork', 'spawn' or 'forkserver'"),
        ("wrokers: 2\n", "wrokers", "Extra inputs are not permitted"),
        ("fallback: nowhere\n", "fallback", "no profile 'nowhere'"),
        ("conv_backend: cudnn\n", "conv_backend", "'miopen' or 'native'"),
        ("stall_retry:\n  deadlock: [same]\n", "(profile)", "stall_retry: unknown cause 'deadlock'"),
        ("stall_retry:\n  idle: [wait]\n", "stall_retry.idle.0", "'ladder', 'same', 'native' or 'gpu_release'"),
        ("idle_timeout: -1\n", "idle_timeout", "greater than or equal to 0"),
        ("slow_ratio: 1\n", "slow_ratio", "greater than 1"),
        ("slow_ratio: .nan\n", "slow_ratio", "finite number"),
    ],
)
def test_invalid_profile_names_file_and_field(tmp_path: Path, extra: str, field: str, words: str) -> None:
    path = _write(tmp_path, "broken", extra)
    with pytest.raises(profiles.ProfileError) as caught:
        profiles.load("broken", tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{path}: field '{field}'") and words in message
    assert "\n" not in message


def test_compile_with_fork_workers_is_refused(tmp_path: Path) -> None:
    text = (profiles.default_profiles_dir() / "balanced.yaml").read_text().replace("spawn", "fork")
    (tmp_path / "compiled.yaml").write_text(text + "compile: true\n")
    with pytest.raises(profiles.ProfileError, match="compile needs spawn or forkserver workers"):
        profiles.load("compiled", tmp_path)


def _outcome(kind: str, stepped: bool, cause: Optional[str] = None) -> Outcome:
    return Outcome(OutcomeKind(kind), first_step_ts=1.0 if stepped else None, detail={"cause": cause} if cause else {})


def test_ladder_steps_down_on_stalls_and_ends_with_native_convolutions() -> None:
    chain = profiles.fallback_chain(profiles.load("fast"))
    ladder = ProfileLadder(chain, ["workers=8", "epochs=3"], profiles.default_profiles_dir())
    first = ladder.first()
    assert first.profile == "fast" and first.argv[-2:] == ["workers=8", "epochs=3"]
    assert ladder.after(_outcome("exited", stepped=True)).launch.profile == "fast", "a crash keeps the profile"
    second = ladder.after(_outcome("stalled", stepped=True)).launch
    assert second.profile == "balanced" and "workers=8" not in second.argv and "epochs=3" in second.argv
    assert ladder.after(_outcome("stalled", stepped=True)).launch.profile == "safe"
    assert ladder.after(_outcome("stalled", stepped=True)).launch.profile == "safe", "mid-training stalls stay on safe"
    assert ladder.after(_outcome("stalled", stepped=False)).launch.profile == "safe-native"
    assert ladder.after(_outcome("stalled", stepped=False)).launch.profile == "safe-native"


def _after(ladder: ProfileLadder, cause: str, stepped: bool = True) -> Tuple[str, Optional[Retry], str]:
    following = ladder.after(_outcome("stalled", stepped, cause))
    return following.launch.profile or "", following.retry, following.reason


def test_the_retry_is_chosen_by_the_cause() -> None:
    def fresh(name: str) -> ProfileLadder:
        return ProfileLadder(profiles.fallback_chain(profiles.load(name)), ["epochs=3"], profiles.default_profiles_dir())

    assert _after(fresh("fast"), "loader_deadlock") == ("balanced", Retry.LADDER, "loader_deadlock: down the ladder to balanced")
    profile, retry, reason = _after(fresh("fast"), "kernel_compile")
    assert (profile, retry) == ("safe-native", Retry.NATIVE) and "trainbox warmup" in reason

    gpu = fresh("fast")
    assert _after(gpu, "gpu_wait")[:2] == ("fast", Retry.GPU_RELEASE), "first: the same profile, once the memory is free"
    assert _after(gpu, "gpu_wait")[:2] == ("safe-native", Retry.NATIVE), "then FP32/native convolutions"

    busy = fresh("balanced")
    assert _after(busy, "busy_python") == ("balanced", Retry.SAME, "busy_python: balanced once more")
    assert _after(busy, "busy_python")[:2] == ("safe", Retry.LADDER), "a second spin in a row steps down"
    assert _after(busy, "busy_native")[:2] == ("safe", Retry.SAME), "a new rung starts a new streak"
    assert _after(fresh("safe"), "idle") == ("safe", Retry.LADDER, "idle: safe again: no rung left below it")
    assert _after(fresh("safe"), "unknown", stepped=False)[:2] == ("safe-native", Retry.LADDER)
    assert _after(fresh("safe"), "no-such-cause", stepped=False)[:2] == ("safe-native", Retry.LADDER), "unknown words: ladder"


def test_a_profile_overrides_the_retry_table(tmp_path: Path) -> None:
    native = profiles.default_profiles_dir() / "safe-native.yaml"
    (tmp_path / native.name).write_text(native.read_text())
    _write(tmp_path, "patient", "stall_retry:\n  loader_deadlock: [same, ladder]\n  kernel_compile: [same]\n")
    chain = profiles.fallback_chain(profiles.load("patient", tmp_path), tmp_path)
    ladder = ProfileLadder(chain, [], tmp_path)
    assert _after(ladder, "loader_deadlock")[:2] == ("patient", Retry.SAME)
    assert _after(ladder, "kernel_compile")[:2] == ("patient", Retry.SAME)
    assert _after(ladder, "busy_native")[:2] == ("patient", Retry.SAME), "a cause it does not name keeps the table's row"


#: Devices the shipped ladders must stay strictly safer on, rung by rung, for any batch.
DEVICES = [
    Device("cpu", "CPU", 2),
    Device("cpu", "CPU", 64),
    Device("cuda", "NVIDIA H100 80GB HBM3", 16, capability=(9, 0)),
    Device("cuda", "NVIDIA H100 80GB HBM3", 1, capability=(9, 0)),
    Device("cuda", "NVIDIA GeForce GTX 1660 SUPER", 6, capability=(7, 5)),
    Device("rocm", "AMD Radeon RX 5600 XT", 12, arch="gfx1010", reported_arch="gfx1030"),
    Device("rocm", "AMD Radeon RX 6800 XT", 2, arch="gfx1030"),
]
#: How much of the training process a worker starts from: fork copies it, a forkserver's fork copies a clean process
#: that imported modules only, spawn starts a new program; no workers, nothing.
START_RISK = {"fork": 3, None: 3, "forkserver": 2, "spawn": 1}


def _risk(profile: profiles.Profile, device: Device, batch: object) -> tuple:
    """What can go wrong on a rung, each part larger = riskier, with ``auto`` resolved for ``device``."""
    chosen = decide(device, profile.amp, profile.workers, batch, profile.cuda_workers)
    amp = chosen.amp.value is not False
    vendor_kernels = profile.conv_backend == "miopen"
    workers = chosen.workers.value
    start = START_RISK[profile.multiprocessing_context] if workers else 0
    prefetch = profile.prefetch_factor or 0 if workers else 0
    return (workers, start, profile.persistent_workers, prefetch, amp, profile.compile, vendor_kernels)


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: f"{d.kind}-{d.arch or d.capability or ''}-{d.cpu_count}cores")
@pytest.mark.parametrize("top", ["fast-compile", "fast"])
def test_every_rung_is_strictly_safer_than_the_one_above_on_every_device(device: Device, top: str) -> None:
    chain = profiles.fallback_chain(profiles.load(top))
    for batch in (1, 2, 8, 64, -1):
        risks = [_risk(profile, device, batch) for profile in chain]
        for upper, lower, above, below in zip(chain, chain[1:], risks, risks[1:]):
            no_riskier = all(b <= a for a, b in zip(above, below))
            assert no_riskier and below != above, f"batch {batch}: {lower.name} {below} is not safer than {upper.name} {above}"


def test_fallback_loop_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, "a", "fallback: b\n")
    _write(tmp_path, "b", "fallback: a\n")
    with pytest.raises(profiles.ProfileError, match="loops back to 'a'"):
        profiles.load("a", tmp_path)


def test_unknown_profile_lists_the_choices() -> None:
    choices = "balanced, fast, fast-compile, safe, safe-native"
    with pytest.raises(profiles.ProfileError, match=f"unknown profile 'turbo': choose one of {choices}"):
        profiles.load("turbo")


def test_cli_reports_profile_errors_in_one_line(tmp_path: Path) -> None:
    _write(tmp_path, "broken", "workers: many\n")
    for args, words in (
        (["run", "--profile", "turbo"], "unknown profile 'turbo'"),
        (["run", "--profile", "broken", "--profiles-dir", str(tmp_path)], "field 'workers'"),
    ):
        result = train_cli([*args, "--run-dir", str(tmp_path / "run")])
        assert result.code == 2
        assert result.stderr.count("\n") == 1 and words in result.stderr
        assert not (tmp_path / "run" / "events.jsonl").exists(), "nothing may start on bad input"


def test_a_profile_s_slow_ratio_reaches_its_launch_and_the_option_overrides_it(tmp_path: Path) -> None:
    native = profiles.default_profiles_dir() / "safe-native.yaml"
    (tmp_path / native.name).write_text(native.read_text())
    _write(tmp_path, "patient", "slow_ratio: 2.0\n")
    chain = profiles.fallback_chain(profiles.load("patient", tmp_path), tmp_path)
    assert ProfileLadder(chain, [], tmp_path).first().slow_ratio == 2.0
    given = ProfileLadder(chain, [], tmp_path, {"slow_ratio": 1.5}).first()
    assert given.slow_ratio == 1.5, "--slow-ratio given on the command line wins over the profile's"
