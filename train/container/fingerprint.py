"""``invoke fingerprint`` / ``invoke verify``: what makes this machine's training environment what it is.

A fingerprint is JSON: the image (ID, labels, ``pip freeze``, sha256 of
every MIOpen database and library file, Python/torch/HIP versions as seen
inside a container started from it) and this host (kernel, OS, Docker,
amdgpu driver, GPU arch and compute units from the KFD topology).
:func:`compare` names each difference in plain words; an empty list means
identical. The image side is measured in a throw-away container (no
network) through the image's own entry point, so it sees the environment a
training container sees; the host side never imports torch.
"""

from __future__ import annotations

import datetime
import json
import platform
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import docker
from docker.errors import APIError, ImageNotFound

from trainbox.atomic import write_text_atomic
from trainbox.container import compose, dotenv, engine
from trainbox.errors import UserError
from trainbox.system import kfd

FORMAT = "trainbox-fingerprint/1"
PROBE_TIMEOUT_S = 300

#: Runs inside the image (its Python, 3.8+); prints one JSON object.
PROBE = r"""
import hashlib, importlib, json, os, platform, subprocess, sys

def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

info = {"python": platform.python_version(), "torch": None, "hip": None, "cuda": None, "rocm": None}
torch_dir = None
try:
    torch = importlib.import_module("torch")
    info.update(torch=torch.__version__, hip=torch.version.hip, cuda=torch.version.cuda)
    torch_dir = os.path.dirname(torch.__file__)
except Exception as exc:
    info["torch"] = "import failed: %s: %s" % (type(exc).__name__, exc)
try:
    with open("/opt/rocm/.info/version") as handle:
        info["rocm"] = handle.read().strip()
except OSError:
    pass
freeze = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all"], check=True,
                        stdout=subprocess.PIPE, universal_newlines=True).stdout
info["pip_freeze"] = sorted(line for line in freeze.splitlines() if line.strip())

databases = [os.environ.get("MIOPEN_SYSTEM_DB_PATH"), "/opt/rocm/share/miopen/db", "/opt/rocm/miopen/share/miopen/db"]
libraries = ["/opt/rocm/lib", "/opt/rocm/miopen/lib"]
if torch_dir:
    databases.append(os.path.join(torch_dir, "share", "miopen"))
    libraries.append(os.path.join(torch_dir, "lib"))
files = {}
def record(path):
    files[path] = "symlink -> " + os.readlink(path) if os.path.islink(path) else sha256(path)
for top in sorted({os.path.realpath(p) for p in databases if p and os.path.isdir(p)}):
    for directory, _, names in os.walk(top):
        for name in names:
            record(os.path.join(directory, name))
for top in sorted({os.path.realpath(p) for p in libraries if os.path.isdir(p)}):
    for name in os.listdir(top):
        if name.lower().startswith("libmiopen"):
            record(os.path.join(top, name))
info["miopen_files"] = dict(sorted(files.items()))
print(json.dumps(info))
"""


def image_ref(flavor: str, root: Path) -> str:
    """The image compose.yaml's service for ``flavor`` runs (e.g. ``trainbox:cpu``)."""
    variables = dotenv.variables(dotenv.settings(flavor))
    return compose.service(flavor, variables, root).image


def probe_image(client: docker.APIClient, image_id: str) -> Dict[str, Any]:
    """Python/torch/HIP versions, ``pip freeze`` and MIOpen file hashes, measured in a container of ``image_id``."""
    container = client.create_container(
        image_id,
        command=["sh", "-c", 'exec python -c "$1"', "fingerprint", PROBE],
        network_disabled=True,
        host_config=client.create_host_config(network_mode="none"),
        labels={"io.trainbox.fingerprint": "probe"},
    )
    try:
        client.start(container)
        status = client.wait(container, timeout=PROBE_TIMEOUT_S)["StatusCode"]
        stdout = client.logs(container, stdout=True, stderr=False).decode(errors="replace")
        if status != 0:
            stderr = client.logs(container, stdout=False, stderr=True).decode(errors="replace").strip()
            last = stderr.splitlines()[-1] if stderr else f"exit status {status}"
            raise UserError(f"fingerprint probe failed inside {image_id[:19]}: {last}")
    finally:
        client.remove_container(container, force=True)
    return json.loads(stdout.strip().splitlines()[-1])


def image_part(client: docker.APIClient, ref: str) -> Optional[Dict[str, Any]]:
    """The image side of a fingerprint; None when ``ref`` is not on this engine."""
    try:
        attrs = client.inspect_image(ref)
    except ImageNotFound:
        return None
    return {
        "ref": ref,
        "id": attrs["Id"],
        "labels": dict(sorted(((attrs.get("Config") or {}).get("Labels") or {}).items())),
        **probe_image(client, attrs["Id"]),
    }


def _os_release() -> Optional[str]:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return None
    match = re.search(r'^PRETTY_NAME="?([^"\n]*)"?$', text, re.MULTILINE)
    return match.group(1) if match else None


def _gpu_driver(root: Path) -> Optional[str]:
    """amdgpu's module version (DKMS builds have one), ``in-kernel`` for the kernel's own, None without amdgpu."""
    module = root / "sys/module/amdgpu"
    if not module.is_dir():
        return None
    try:
        return (module / "version").read_text().strip()
    except OSError:
        return "in-kernel"


def host_part(client: docker.APIClient, root: Path = Path("/")) -> Dict[str, Any]:
    """Kernel, OS, CPU architecture, Docker version, amdgpu driver and GPUs (arch, compute units) of this host."""
    return {
        "kernel": platform.release(),
        "os": _os_release(),
        "machine": platform.machine(),
        "docker": client.version().get("Version"),
        "gpu_driver": _gpu_driver(root),
        "gpus": [
            {"arch": node.arch, "compute_units": node.compute_units, "device_id": f"0x{node.device_id:04x}"}
            for node in kfd.gpu_nodes(root)
        ],
    }


def collect(ref: str, client: Optional[docker.APIClient] = None, root: Path = Path("/")) -> Dict[str, Any]:
    """The fingerprint of image ``ref`` on ``client``'s engine (default: the environment's) and of this host."""
    client = client or engine.api()
    try:
        image = image_part(client, ref)
        host = host_part(client, root)
    except APIError as exc:
        raise UserError(f"Docker Engine refused the fingerprint probe: {exc.explanation or exc}") from None
    return {
        "format": FORMAT,
        "taken": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "image_ref": ref,
        "image": image,
        "host": host,
    }


def dumps(fingerprint: Mapping[str, Any]) -> str:
    return json.dumps(fingerprint, indent=2, sort_keys=True) + "\n"


def load(path: Path) -> Dict[str, Any]:
    """Read a fingerprint file; anything else is a one-line error."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read fingerprint {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"{path} is not a trainbox fingerprint (expected format {FORMAT})")
    return data


def _show(value: Any) -> str:
    if value is None or value == "":
        return "none"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _freeze(lines: List[str]) -> Dict[str, str]:
    """``pip freeze`` lines by normalized project name: ``numpy==1.26.4`` -> ``{"numpy": "1.26.4"}``."""
    packages = {}
    for line in lines:
        name, sep, version = line.partition("==")
        if not sep:
            name, _, version = line.partition(" @ ")
            version = version or line
        packages[re.sub(r"[-_.]+", "-", name.strip()).lower()] = version.strip()
    return packages


def _mapping(what: str, a: Mapping[str, Any], b: Mapping[str, Any], names: Tuple[str, str]) -> List[str]:
    differences = []
    for key in sorted(set(a) | set(b)):
        if key not in b:
            differences.append(f"{what} {key}: only {names[0]} ({_show(a[key])})")
        elif key not in a:
            differences.append(f"{what} {key}: only {names[1]} ({_show(b[key])})")
        elif a[key] != b[key]:
            differences.append(f"{what} {key}: {_show(a[key])} ({names[0]}) vs {_show(b[key])} ({names[1]})")
    return differences


def _gpus(gpus: List[Mapping[str, Any]]) -> Dict[str, str]:
    return {
        str(index): f"{gpu.get('arch')} with {gpu.get('compute_units')} CUs (PCI device {gpu.get('device_id')})"
        for index, gpu in enumerate(gpus)
    }


def compare(a: Mapping[str, Any], b: Mapping[str, Any], names: Tuple[str, str] = ("recorded", "here")) -> List[str]:
    """Each difference between fingerprints ``a`` and ``b`` in plain words; ``[]`` means identical.

    ``names`` say what ``a`` and ``b`` are in the sentences (default: a
    recorded fingerprint versus this machine). The time taken is not compared.
    """
    differences = []
    image_a, image_b = a.get("image"), b.get("image")
    if a.get("image_ref") != b.get("image_ref"):
        differences.append(f"image name: {a.get('image_ref')} ({names[0]}) vs {b.get('image_ref')} ({names[1]})")
    if image_a is None or image_b is None:
        if image_a is not image_b:
            present, missing = (names[0], names[1]) if image_b is None else (names[1], names[0])
            differences.append(f"image {a.get('image_ref')}: present {present}, missing {missing}")
    else:
        scalars = {key: image_a.get(key) for key in ("id", "python", "torch", "hip", "cuda", "rocm")}
        differences += _mapping("image", scalars, {key: image_b.get(key) for key in scalars}, names)
        differences += _mapping("image label", image_a.get("labels", {}), image_b.get("labels", {}), names)
        differences += _mapping(
            "pip package", _freeze(image_a.get("pip_freeze", [])), _freeze(image_b.get("pip_freeze", [])), names
        )
        differences += _mapping("MIOpen file", image_a.get("miopen_files", {}), image_b.get("miopen_files", {}), names)
    host_a, host_b = dict(a.get("host") or {}), dict(b.get("host") or {})
    gpus_a, gpus_b = _gpus(host_a.pop("gpus", [])), _gpus(host_b.pop("gpus", []))
    differences += _mapping("host", host_a, host_b, names)
    differences += _mapping("GPU", gpus_a, gpus_b, names)
    return differences


def write(path: Path, fingerprint: Mapping[str, Any]) -> None:
    """Write a fingerprint file atomically."""
    write_text_atomic(path, dumps(fingerprint))


def verify(path: Path, client: Optional[docker.APIClient] = None, root: Path = Path("/")) -> List[str]:
    """Differences between the fingerprint in ``path`` and this machine (same image name); ``[]`` = identical."""
    recorded = load(path)
    return compare(recorded, collect(str(recorded.get("image_ref")), client, root))
