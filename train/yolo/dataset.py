"""A dataset YAML resolved on the host as Ultralytics 8.4 resolves it, before anything starts.

Why here and not in the training process: Ultralytics checks a dataset's
folders only inside training, after the first beat, so a missing folder is a
crash the supervisor restarts (and, in the container, Docker too) instead of
one line; and when the validation images are missing it *runs the YAML's
``download:`` field* (``bash ...`` through subprocess, anything else through
``exec``). A dataset whose every split resolves to an existing path never
reaches that code, so trainbox refuses any other before it starts.

Ultralytics' rules (``ultralytics/data/utils.py``, ``check_det_dataset``):

* the root is ``path:`` when given, else the YAML's folder; a relative ``path:``
  is taken from the *working directory* (and, when absent there, under
  Ultralytics' datasets folder, which trainbox never uses: refused);
* ``train``, ``val``, ``test`` and ``minival`` are a string or a list; each
  entry is ``root / entry``; a string entry that does not exist and starts
  with ``../`` is tried again without it (Roboflow exports rely on this);
* an entry is a folder of images or a ``.txt`` list of image paths.

Host-side: PyYAML only, no torch and no Ultralytics.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from trainbox.errors import UserError

#: The splits Ultralytics resolves against the root, in its order.
SPLITS = ("train", "val", "test", "minival")


@dataclass(frozen=True)
class Dataset:
    """A dataset YAML and the paths it names, all absolute."""

    yaml_file: Path
    root: Path
    splits: Dict[str, List[Path]]
    #: The YAML's ``path:`` is relative, so it depends on the folder the training runs in.
    root_from_cwd: bool = False

    def paths(self) -> List[Path]:
        """Every folder or list file the training reads, the YAML's own folder first."""
        found = [self.yaml_file.parent, self.root]
        for entries in self.splits.values():
            found.extend(entries)
        return list(dict.fromkeys(found))


def _load(yaml_file: Path, shown: str) -> Dict[str, Any]:
    if yaml_file.is_dir():
        hint = " (its data.yaml?)" if (yaml_file / "data.yaml").is_file() else ""
        raise UserError(f"data={shown}: is a folder; give the path of its dataset YAML{hint}")
    if not yaml_file.is_file():
        raise UserError(f"data={shown}: no such file (give the path of a dataset YAML; nothing is downloaded)")
    try:
        content = yaml.safe_load(yaml_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UserError(f"data={shown}: cannot read it as YAML ({type(exc).__name__})") from None
    if not isinstance(content, dict):
        raise UserError(f"data={shown}: expected a YAML mapping with train, val and names")
    return content


def _root(content: Dict[str, Any], yaml_file: Path, cwd: Path, shown: str) -> Tuple[Path, bool]:
    """(the dataset root, whether it depends on the working directory), as Ultralytics takes it (no ``~``)."""
    given = content.get("path")
    if not given:
        return yaml_file.parent, False
    root = Path(str(given))
    from_cwd = not root.is_absolute()
    if from_cwd:
        root = cwd / root
    if not root.exists():
        raise UserError(
            f"data={shown}: path: {given} does not exist (a relative path: is taken from the folder you run in, "
            f"{cwd}); make it absolute, or leave it out to mean the YAML's own folder"
        )
    return root.resolve(), from_cwd


def _entry(root: Path, entry: str, allow_parent_retry: bool) -> Path:
    path = (root / entry).resolve()
    if not path.exists() and allow_parent_retry and entry.startswith("../"):
        path = (root / entry[3:]).resolve()
    return path


def resolve(data: str, cwd: Optional[Path] = None) -> Dataset:
    """Resolve ``data=`` as the training will; a missing split or folder is a :class:`UserError` (one line)."""
    cwd = cwd or Path.cwd()
    yaml_file = (cwd / Path(data).expanduser()).resolve()
    content = _load(yaml_file, data)
    missing = [key for key in ("train", "val") if not content.get(key)]
    if content.get("names") is None and "nc" not in content:
        missing.append("names")
    if missing:
        raise UserError(f"data={data}: missing {', '.join(missing)}")
    root, root_from_cwd = _root(content, yaml_file, cwd, data)
    splits: Dict[str, List[Path]] = {}
    for split in SPLITS:
        value = content.get(split)
        if not value:
            continue
        entries = [value] if isinstance(value, str) else [str(item) for item in value]
        splits[split] = [_entry(root, entry, isinstance(value, str)) for entry in entries]
        absent = next((path for path in splits[split] if not path.exists()), None)
        if absent is not None:
            raise UserError(
                f"data={data}: {split} images not found at {absent} (trainbox never downloads, and never runs "
                "a YAML's download:); fix the YAML's path:/"
                f"{split}: or put the images there"
            )
    return Dataset(yaml_file=yaml_file, root=root, splits=splits, root_from_cwd=root_from_cwd)
