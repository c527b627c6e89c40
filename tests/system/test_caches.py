"""Kernel-cache locations: one definition, as each tool picks them from an environment."""

from __future__ import annotations

from pathlib import Path

from trainbox.system import caches


def test_miopen_locations() -> None:
    environ = {"HOME": "/home/trainbox", "MIOPEN_CUSTOM_CACHE_DIR": "/cache/miopen/kernels"}
    assert caches.miopen_dirs(environ) == (Path("/home/trainbox/.config/miopen"), Path("/cache/miopen/kernels"))


def test_compile_cache_locations() -> None:
    assert caches.compile_dirs({}, "alice") == (
        Path("/tmp/torchinductor_alice"),
        Path("/tmp/torchinductor_alice/triton/0"),
    )
    assert caches.compile_dirs({"TMPDIR": "/scratch", "TORCHINDUCTOR_CACHE_DIR": "/cache/ind"}, "alice") == (
        Path("/cache/ind"),
        Path("/cache/ind/triton/0"),
    )
    image = {"TORCHINDUCTOR_CACHE_DIR": "/cache/torch/inductor", "TRITON_CACHE_DIR": "/cache/torch/triton"}
    assert caches.compile_dirs(image, "uid_1000") == (Path("/cache/torch/inductor"), Path("/cache/torch/triton"))


def test_watched_caches_follow_the_child_environment(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "TMPDIR": "/scratch", "USER": "ana", "TRITON_CACHE_DIR": "/cache/triton"}
    assert dict(caches.watched(env)) == {
        "MIOPEN_USER_DB_PATH (default)": f"{tmp_path}/.config/miopen",
        "MIOPEN_CUSTOM_CACHE_DIR (default)": f"{tmp_path}/.cache/miopen",
        "TORCHINDUCTOR_CACHE_DIR (default)": "/scratch/torchinductor_ana",
        "TRITON_CACHE_DIR": "/cache/triton",
    }


def test_a_uid_without_a_passwd_entry_is_named_as_torch_names_it() -> None:
    """A container run as ``--user 4242`` has no passwd entry and often no USER: the name must not crash anything."""
    env = {"HOME": "/nonexistent"}
    name = caches.user(env)
    assert name == caches.user({}) or name.startswith("uid_")
    assert caches.user({"USER": "ana"}) == "ana" and caches.user({"LOGNAME": "bo", "USER": "ana"}) == "bo"
    assert caches.inductor_dir({"TMPDIR": "/t"}, "a/b") == Path("/t/torchinductor_a_b"), "as torch sanitises it"
