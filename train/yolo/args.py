"""Validate Ultralytics ``KEY=VALUE`` train arguments on the host, before anything starts.

Host side: this module imports neither torch nor Ultralytics. It finds
Ultralytics' ``cfg/default.yaml`` with ``importlib.util.find_spec`` (which
does not import the package) and checks each key and value against it:

* the key must exist in ``default.yaml``;
* values are parsed as Ultralytics' own CLI does (``none``/``true``/``false``,
  Python literals, else a string), then checked against the type the
  default's comment declares, e.g. ``batch: 16 # (int | float)``; where no
  type is declared, against the type of the default value (a ``None``
  default accepts anything);
* ``data=`` is required (Ultralytics' default would download coco8) and must
  be an existing YAML mapping with ``train``, ``val`` and ``names`` or ``nc``;
* ``model=`` / ``pretrained=`` never download: a ``.pt`` must be a local
  file, a ``.yaml`` a local file or one shipped with Ultralytics.

Keys the runner owns are rejected with the reason (see ``RUNNER_OWNED``): the
run directory layout (``project``, ``name``, ``exist_ok``), resuming
(``resume``: every attempt resumes from ``RUN_DIR/train/weights/last.pt`` by
itself), ``mode``/``task`` (detection training only), ``cfg`` (a second
source of arguments that would bypass this check) and ``save=False``
(without checkpoints nothing can resume). ``device=`` must name one device:
the runner does not support multi-GPU DDP. The DataLoader start method,
persistent workers, prefetch and CPU threads are not Ultralytics arguments
and come from the profile only. ``workers``, ``val``, ``amp`` and
``compile`` are Ultralytics arguments that the profile also sets: given
here, they override the profile (``amp=`` takes ``true``/``false``, ``auto``,
``fp16``, ``bf16`` or ``fp32``) (``python -m trainbox run`` drops them again
when it falls back to another profile).

Where the arguments are checked against: the Ultralytics installed here (the native route), or, for a
run in a trainbox image, the Ultralytics that image pins (``ULTRALYTICS_VERSION`` in ``env/stack.env``),
whose ``default.yaml`` and list of shipped model YAMLs are kept in ``env/ultralytics-cfg/``
(:func:`pinned`). So ``invoke train`` checks every ``--set`` on a host that has no Ultralytics (the
``host`` extra), with this module's code and messages, before any image, container or directory is
made; ``tests/yolo/test_args.py`` holds the copy to the pinned version (refresh it with
``python -m trainbox.yolo.args`` in an environment that has that version).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

import yaml

from trainbox import SOURCE_ROOT
from trainbox.errors import UserError
from trainbox.yolo import dataset
from trainbox.yolo.profiles import AUTO


class OverrideError(UserError):
    """A ``KEY=VALUE`` argument that cannot be used; the message is one line."""


RUNNER_OWNED: Dict[str, str] = {
    "project": "the run directory is --run-dir",
    "name": "checkpoints always go to RUN_DIR/train",
    "exist_ok": "the runner reuses RUN_DIR/train",
    "resume": "every attempt resumes from RUN_DIR/train/weights/last.pt by itself",
    "mode": "the runner only trains",
    "cfg": "pass each argument as KEY=VALUE so it can be checked",
}

#: Arguments that override the profile's settings of the same name.
PROFILE_KEYS = ("workers", "val", "amp", "compile")
#: ``amp=``: Ultralytics' precisions, and ``auto`` (decided for the device, as a profile's ``amp: auto``).
#: Any other string would switch Ultralytics' own AMP check on, which downloads weights.
AMP_WORDS = (AUTO, "fp16", "bf16", "fp32")

#: The pinned Ultralytics' ``default.yaml`` and shipped model YAMLs, for hosts without it (:func:`pinned`).
PINNED_DIR = SOURCE_ROOT / "env" / "ultralytics-cfg"
PINNED_MODELS = "models.txt"

_TYPE_NAMES = {"int": int, "float": float, "bool": bool, "str": str, "list": list, "tuple": list, "dict": dict}
_DECLARED = re.compile(r"#\s*\(([^)]*)\)")


def default_cfg_path() -> Path:
    """Ultralytics' ``cfg/default.yaml``, located without importing Ultralytics."""
    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        raise OverrideError("ultralytics is not installed (pip install 'trainbox[yolo]')")
    path = Path(list(spec.submodule_search_locations)[0]) / "cfg" / "default.yaml"
    if not path.is_file():
        raise OverrideError(f"ultralytics is installed but {path} is missing")
    return path


def _declared_types(line: str) -> Optional[Tuple[type, ...]]:
    """Types from a ``# (int | float, optional)`` comment; None when the line declares none."""
    match = _DECLARED.search(line)
    if not match:
        return None
    types: List[type] = []
    for token in re.split(r"[|,]", match.group(1)):
        name = token.strip().split("[")[0]
        if name == "optional":
            types.append(type(None))
        elif name in _TYPE_NAMES:
            types.append(_TYPE_NAMES[name])
    return tuple(types) or None


Defaults = Dict[str, Tuple[Any, Optional[Tuple[type, ...]]]]


def load_defaults(path: Optional[Path] = None) -> Defaults:
    """Each key of ``default.yaml`` with its default value and declared types."""
    path = path or default_cfg_path()
    text = path.read_text(encoding="utf-8")
    values = yaml.safe_load(text)
    declared: Dict[str, Optional[Tuple[type, ...]]] = {}
    for line in text.splitlines():
        key, sep, _ = line.partition(":")
        if sep and key and not key.startswith((" ", "#")):
            declared[key.strip()] = _declared_types(line)
    return {key: (value, declared.get(key)) for key, value in values.items()}


@dataclass(frozen=True)
class Vocabulary:
    """What ``KEY=VALUE`` is checked against: Ultralytics' train arguments and the model YAMLs it ships."""

    defaults: Defaults
    model_yamls: FrozenSet[str]


def _model_yamls(cfg: Path) -> FrozenSet[str]:
    return frozenset(path.name for path in (cfg.parent / "models").rglob("*.yaml"))


def installed() -> Vocabulary:
    """The Ultralytics installed here (OverrideError without one)."""
    cfg = default_cfg_path()
    return Vocabulary(load_defaults(cfg), _model_yamls(cfg))


def pinned(directory: Path = PINNED_DIR) -> Vocabulary:
    """The Ultralytics the trainbox images pin, from its copy in ``env/ultralytics-cfg/`` (see the module docstring)."""
    names = (directory / PINNED_MODELS).read_text(encoding="utf-8").splitlines()
    return Vocabulary(load_defaults(directory / "default.yaml"), frozenset(n for n in names if n and not n.startswith("#")))


def write_pinned(directory: Path = PINNED_DIR) -> Path:
    """Copy the installed Ultralytics' ``default.yaml`` and model YAML names into ``directory``; return it."""
    import importlib.metadata

    cfg = default_cfg_path()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "default.yaml").write_bytes(cfg.read_bytes())
    header = f"# Ultralytics {importlib.metadata.version('ultralytics')}: the model YAMLs it ships (cfg/models)"
    (directory / PINNED_MODELS).write_text("\n".join([header, *sorted(_model_yamls(cfg))]) + "\n", encoding="utf-8")
    return directory


def parse_value(text: str) -> Any:
    """Parse a CLI value as Ultralytics does: none/true/false, a Python literal, else the string."""
    lowered = text.strip().lower()
    if lowered == "none":
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return list(value) if isinstance(value, tuple) else value


def _type_ok(value: Any, default: Any, declared: Optional[Tuple[type, ...]]) -> bool:
    allowed = declared or ((type(default),) if default is not None else None)
    if allowed is None or value is None and (default is None or type(None) in allowed):
        return True
    if isinstance(value, bool):
        return bool in allowed
    if isinstance(value, int) and float in allowed:
        return True
    return isinstance(value, allowed)


def _type_names(default: Any, declared: Optional[Tuple[type, ...]]) -> str:
    types = declared or (type(default),)
    return " or ".join(sorted({"none" if t is type(None) else t.__name__ for t in types}))


def _check_data(value: Any) -> str:
    """Check the dataset YAML and every folder it names; return its absolute path (the child may run elsewhere)."""
    return str(dataset.resolve(str(value)).yaml_file)


#: Whole-number ranges Ultralytics leaves unchecked; outside them a run fails late (after its first
#: beat, so the supervisor would restart it) or never ends. imgsz: one stride-32 cell at least, and
#: 8192 px is past any YOLO use. epochs: 10**20 never ends. save_period < 1 means "off" (its default, -1).
BOUNDS: Dict[str, Tuple[int, int]] = {
    "epochs": (1, 100_000),
    "imgsz": (32, 8192),
    "workers": (0, 256),
    "save_period": (-1, 100_000),
    "patience": (0, 100_000),
}


def _check_bounds(key: str, value: Any) -> None:
    low, high = BOUNDS[key]
    numbers = value if isinstance(value, list) else [value]
    for number in numbers:
        if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high:
            raise OverrideError(f"{key}={value}: must be a whole number from {low} to {high}")


def _shipped_model_yaml(name: str, vocabulary: Vocabulary) -> bool:
    """True when Ultralytics ships ``name`` (``yolov8n.yaml`` is ``yolov8.yaml`` at scale n)."""
    unscaled = re.sub(r"(\d+)([nslmx])(.*)\.ya?ml$", r"\1\3.yaml", name)
    return name in vocabulary.model_yamls or unscaled in vocabulary.model_yamls


def _check_weights(key: str, value: Any, vocabulary: Vocabulary) -> Any:
    """Check a model or weights argument; return a local file's absolute path, else the value."""
    if isinstance(value, bool) and key == "pretrained":
        return value
    path = Path(str(value)).expanduser()
    if path.is_file():
        return str(path.resolve())
    if (
        path.suffix in (".yaml", ".yml")
        and key == "model"
        and path.name == str(value)
        and _shipped_model_yaml(path.name, vocabulary)
    ):
        return value
    raise OverrideError(
        f"{key}={value}: no such local file (trainbox never downloads weights; "
        "train from a model YAML such as yolov8n.yaml or give the path of a .pt)"
    )


def check_pairs(pairs: Sequence[str], vocabulary: Optional[Vocabulary] = None) -> Dict[str, Any]:
    """Parse and check ``KEY=VALUE`` arguments against ``vocabulary`` (default: :func:`installed`); return them typed.

    Everything :func:`validate_overrides` checks but the dataset, which a caller may supply itself.
    """
    vocabulary = vocabulary or installed()
    result: Dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise OverrideError(f"{pair!r}: expected KEY=VALUE (an Ultralytics train argument, e.g. epochs=3)")
        if key in result:
            raise OverrideError(f"{key}= given twice")
        result[key] = _check_pair(key, text, vocabulary)
    return result


def _check_pair(key: str, text: str, vocabulary: Vocabulary) -> Any:
    """One argument's value, typed and checked (see the module docstring)."""
    if key in RUNNER_OWNED:
        raise OverrideError(f"{key}= is set by trainbox: {RUNNER_OWNED[key]}")
    if key not in vocabulary.defaults:
        close = [k for k in vocabulary.defaults if k.startswith(key[:3])][:3]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise OverrideError(f"unknown argument {key!r}{hint}: not in Ultralytics' default.yaml")
    value = parse_value(text)
    default, declared = vocabulary.defaults[key]
    if not _type_ok(value, default, declared):
        raise OverrideError(f"{key}={text}: expected {_type_names(default, declared)}")
    if key == "task" and value != "detect":
        raise OverrideError(f"task={text}: trainbox trains detection models only")
    if key == "save" and value is not True:
        raise OverrideError("save=False would write no checkpoint, and nothing could resume")
    if key == "device" and (isinstance(value, list) and len(value) > 1 or "," in str(value)):
        raise OverrideError(f"device={text}: one device per run (the runner does not support DDP)")
    if key == "amp" and isinstance(value, str) and value not in AMP_WORDS:
        raise OverrideError(f"amp={text}: expected true, false or one of {', '.join(AMP_WORDS)}")
    if key == "batch" and isinstance(value, int) and value == 0:
        raise OverrideError("batch=0: must not be 0 (-1 lets Ultralytics choose)")
    if key in BOUNDS:
        _check_bounds(key, value)
    if key in ("model", "pretrained") and value is not None:
        value = _check_weights(key, value, vocabulary)
    return value


def validate_overrides(pairs: Sequence[str]) -> Dict[str, Any]:
    """Parse and check ``KEY=VALUE`` arguments against the installed Ultralytics; return them typed, or raise OverrideError.

    Local paths (``data``, a local ``model`` or ``pretrained``) come back absolute.
    """
    result = check_pairs(pairs)
    if "data" not in result or result["data"] is None:
        raise OverrideError("data= is required: the path of a dataset YAML (python -m trainbox demo-data DIR writes one)")
    result["data"] = _check_data(result["data"])
    return result


if __name__ == "__main__":
    print(f"wrote {write_pinned()}")
