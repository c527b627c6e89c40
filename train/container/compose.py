"""compose.yaml as the one definition of a training container.

``docker compose`` reads compose.yaml directly; ``invoke train`` resolves the
same service here (YAML merge keys, ``${VAR}`` interpolation from the
environment and .env with compose's precedence) and converts it to Docker SDK
arguments, so both start identical containers. A key this module does not
know is an error, not silently dropped (tests compare the result with
``docker compose config``).

The project name is compose's own (:func:`project_name`): ``COMPOSE_PROJECT_NAME``, else the
checkout's folder name as compose normalizes it, since compose.yaml sets no ``name:``. So two
checkouts on one machine are two projects: ``docker compose up`` in one never recreates the
other's container, and ``invoke train``'s containers (``<project>-<run>``) and ``invoke
logs``/``stop``/``status`` stay within their checkout. The kernel-cache volumes are the
exception, on purpose: they carry fixed names (compose.yaml's ``volumes:``), so every checkout
shares the MIOpen and Inductor caches (hours of compiling on a cold gfx1010 cache; their entries
are keyed by what they compile, so sharing them is safe).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import yaml

from trainbox import SOURCE_ROOT
from trainbox.errors import UserError

COMPOSE_FILE = SOURCE_ROOT / "compose.yaml"

#: Service keys that shape the container (everything else is rejected).
RUN_KEYS = frozenset(
    {
        "image",
        "user",
        "network_mode",
        "restart",
        "shm_size",
        "stop_grace_period",
        "environment",
        "healthcheck",
        "volumes",
        "devices",
        "group_add",
        "init",
        "command",
        "deploy",
        "cap_drop",
        "security_opt",
        "read_only",
        "tmpfs",
        "pids_limit",
        "mem_limit",
    }
)
#: Service keys that do not affect a created container.
OTHER_KEYS = frozenset({"build", "profiles"})

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)
_UNITS = {"b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)")
_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def interpolate(text: str, variables: Mapping[str, str]) -> str:
    """Compose's ``$VAR``, ``${VAR}``, ``${VAR-d}``, ``${VAR:-d}``, ``${VAR?e}``, ``${VAR:?e}``, ``$$``."""

    def replace(match: re.Match[str]) -> str:
        if match.group("escaped"):
            return "$"
        name = match.group("braced") or match.group("named")
        op, arg = match.group("op"), match.group("arg") or ""
        value = variables.get(name)
        missing = value is None or (value == "" and op is not None and op.startswith(":"))
        if not missing or op is None:
            return value or ""
        if op.endswith("?"):
            raise UserError(f"compose.yaml needs {name}: {arg or 'not set'}")
        return interpolate(arg, variables)

    return _VARIABLE.sub(replace, text)


def _walk(node: Any, variables: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, variables)
    if isinstance(node, list):
        return [_walk(item, variables) for item in node]
    if isinstance(node, dict):
        return {key: _walk(value, variables) for key, value in node.items()}
    return node


def parse_bytes(value: Any) -> int:
    """``8gb`` / ``512m`` / 1024 -> bytes."""
    match = re.fullmatch(r"(\d+)\s*([a-z]*)", str(value).strip().lower())
    if match is None or match.group(2) not in _UNITS:
        raise UserError(f"compose.yaml: cannot read size {value!r}")
    return int(match.group(1)) * _UNITS[match.group(2) or "b"]


def parse_duration(value: Any) -> float:
    """``1m30s`` / ``20s`` / 90 -> seconds."""
    text = str(value).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise UserError(f"compose.yaml: cannot read duration {value!r}")
    return sum(float(number) * _SECONDS[unit] for number, unit in parts)


@dataclass
class Service:
    """One resolved service of compose.yaml: everything needed to create its container."""

    name: str
    project: str
    image: str
    user: Optional[str] = None
    network_mode: Optional[str] = None
    restart: Optional[str] = None
    shm_size: Optional[int] = None
    stop_grace_s: Optional[float] = None
    environment: Dict[str, str] = field(default_factory=dict)
    healthcheck: Optional[Dict[str, Any]] = None
    binds: List[Dict[str, Any]] = field(default_factory=list)
    named_volumes: List[Dict[str, str]] = field(default_factory=list)
    devices: List[str] = field(default_factory=list)
    group_add: List[str] = field(default_factory=list)
    init: Optional[bool] = None
    command: Optional[List[str]] = None
    build: Dict[str, Any] = field(default_factory=dict)
    #: GPUs to reserve, as the Engine API's DeviceRequests (Driver, Count, DeviceIDs, Capabilities, Options).
    device_requests: List[Dict[str, Any]] = field(default_factory=list)
    cap_drop: List[str] = field(default_factory=list)
    security_opt: List[str] = field(default_factory=list)
    read_only: Optional[bool] = None
    #: tmpfs mounts as compose writes them: ``PATH`` or ``PATH:OPTIONS``.
    tmpfs: List[str] = field(default_factory=list)
    pids_limit: Optional[int] = None
    mem_limit: Optional[int] = None


def load(variables: Mapping[str, str], path: Path = COMPOSE_FILE) -> Dict[str, Any]:
    """compose.yaml with merge keys applied and variables interpolated."""
    raw = yaml.safe_load(path.read_text())
    document = _walk(raw, variables)
    if not isinstance(document, dict) or "services" not in document:
        raise UserError(f"{path}: no services")
    return document


def _environment(value: Any) -> Dict[str, str]:
    if isinstance(value, dict):
        return {str(key): "" if item is None else str(item) for key, item in value.items()}
    pairs = [str(item).split("=", 1) for item in value or []]
    return {pair[0]: pair[1] if len(pair) > 1 else "" for pair in pairs}


def _healthcheck(value: Dict[str, Any]) -> Dict[str, Any]:
    nanoseconds = 1_000_000_000
    check: Dict[str, Any] = {"test": list(value["test"])}
    for key, sdk_key in (("interval", "interval"), ("timeout", "timeout"), ("start_period", "start_period")):
        if key in value:
            check[sdk_key] = int(parse_duration(value[key]) * nanoseconds)
    if "retries" in value:
        check["retries"] = int(value["retries"])
    return check


def _strings(value: Any) -> List[str]:
    """A compose key that takes one string or a list of them."""
    if value is None:
        return []
    return [str(item) for item in (value if isinstance(value, list) else [value])]


def _device(value: Any) -> str:
    parts = str(value).split(":")
    if len(parts) == 1:
        parts.append(parts[0])
    if len(parts) == 2:
        parts.append("rwm")
    return ":".join(parts)


def _device_requests(name: str, deploy: Any) -> List[Dict[str, Any]]:
    """``deploy.resources.reservations.devices`` as compose hands them to the Engine (``count: all`` is -1, absent
    lists are null);
    any other ``deploy`` setting is refused, since ``docker compose up`` ignores or rejects it outside swarm."""
    devices = (((deploy or {}).get("resources") or {}).get("reservations") or {}).get("devices")
    if deploy != {"resources": {"reservations": {"devices": devices}}} or not isinstance(devices, list):
        raise UserError(f"compose.yaml service {name}: only deploy.resources.reservations.devices is supported by invoke")
    requests = []
    for device in devices:
        count = device.get("count")
        requests.append(
            {
                "Driver": str(device.get("driver", "")),
                "Count": -1 if count == "all" else int(count or 0),
                "DeviceIDs": [str(i) for i in device["device_ids"]] if device.get("device_ids") else None,
                "Capabilities": [[str(c) for c in device.get("capabilities") or []]],
                "Options": {str(k): str(v) for k, v in device["options"].items()} if device.get("options") else None,
            }
        )
    return requests


#: What compose keeps of a folder's name for a project name (compose-go's NormalizeProjectName): lowercase
#: letters, digits, '_' and '-', not starting with '_' or '-'.
_PROJECT_CHARACTERS = re.compile(r"[a-z0-9_-]")


def project_name(variables: Mapping[str, str], root: Path = COMPOSE_FILE.parent) -> str:
    """compose's project name for the checkout at ``root`` (see the module docstring)."""
    document = load(variables, root / COMPOSE_FILE.name)
    given = variables.get("COMPOSE_PROJECT_NAME") or document.get("name")
    name = str(given) if given else "".join(_PROJECT_CHARACTERS.findall(root.resolve().name.lower())).lstrip("_-")
    if not name:
        raise UserError(f"no compose project name from the folder {root.resolve().name!r}: set COMPOSE_PROJECT_NAME")
    return name


def service(name: str, variables: Mapping[str, str], root: Path = COMPOSE_FILE.parent) -> Service:
    """Resolve service ``name``; relative bind sources are taken from ``root`` like compose does."""
    document = load(variables, root / COMPOSE_FILE.name)
    services = document["services"]
    if name not in services:
        raise UserError(f"compose.yaml has no service {name!r} (services: {', '.join(services)})")
    spec = services[name]
    unknown = set(spec) - RUN_KEYS - OTHER_KEYS
    if unknown:
        raise UserError(f"compose.yaml service {name}: keys not supported by invoke: {', '.join(sorted(unknown))}")
    project = project_name(variables, root)
    result = Service(
        name=name,
        project=project,
        image=str(spec["image"]),
        user=spec.get("user"),
        network_mode=spec.get("network_mode"),
        restart=spec.get("restart"),
        shm_size=parse_bytes(spec["shm_size"]) if "shm_size" in spec else None,
        stop_grace_s=parse_duration(spec["stop_grace_period"]) if "stop_grace_period" in spec else None,
        environment=_environment(spec.get("environment")),
        healthcheck=_healthcheck(spec["healthcheck"]) if "healthcheck" in spec else None,
        devices=[_device(item) for item in spec.get("devices", [])],
        group_add=[str(item) for item in spec.get("group_add", [])],
        init=spec.get("init"),
        command=[str(item) for item in spec["command"]] if "command" in spec else None,
        build=dict(spec.get("build") or {}),
        device_requests=_device_requests(name, spec["deploy"]) if "deploy" in spec else [],
        cap_drop=_strings(spec.get("cap_drop")),
        security_opt=_strings(spec.get("security_opt")),
        read_only=spec.get("read_only"),
        tmpfs=_strings(spec.get("tmpfs")),
        pids_limit=int(spec["pids_limit"]) if "pids_limit" in spec else None,
        mem_limit=parse_bytes(spec["mem_limit"]) if "mem_limit" in spec else None,
    )
    for volume in spec.get("volumes", []):
        if not isinstance(volume, dict):
            raise UserError(f"compose.yaml service {name}: use the long volume syntax")
        if volume["type"] == "bind":
            source = Path(volume["source"])
            result.binds.append(
                {
                    "source": str(source if source.is_absolute() else (root / source).resolve()),
                    "target": volume["target"],
                    "read_only": bool(volume.get("read_only", False)),
                }
            )
        elif volume["type"] == "volume":
            declared = (document.get("volumes") or {}).get(volume["source"]) or {}
            volume_name = declared.get("name") or f"{project}_{volume['source']}"
            result.named_volumes.append({"source": volume_name, "target": volume["target"]})
        else:
            raise UserError(f"compose.yaml service {name}: volume type {volume['type']!r} not supported")
    return result
