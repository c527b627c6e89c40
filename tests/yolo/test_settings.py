"""What one attempt applies, and the one line that says what trained (train/yolo/settings.py)."""

from __future__ import annotations

from trainbox.yolo import device_defaults, profiles
from trainbox.yolo.settings import for_device, from_profile, trained_with


def test_the_trained_with_line_names_the_values_the_profile_the_device_and_why() -> None:
    """Ultralytics' own argument dump (amp=True ... workers=8) comes first; this line is what trains."""
    settings = from_profile(profiles.load("safe"), {}, startup_timeout=60.0)
    cpu = device_defaults.Device(kind="cpu", name="cpu", cpu_count=2)
    decided = device_defaults.decide(cpu, settings.amp, settings.workers, batch=16)
    line = trained_with(for_device(settings, decided), decided.record(), cpu_threads=2)
    assert line == (
        "trainbox: trained with amp=False, workers=0, pin_memory=False, cpu_threads=2 (decided by profile safe for"
        " CPU (2 cores): amp: amp=False, not auto; workers: workers=0, not auto; CPU: nothing is copied to a device)."
        " Ultralytics' argument list above shows its own defaults for amp and workers, not these."
    )
