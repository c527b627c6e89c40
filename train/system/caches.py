"""Where the kernel compilers keep their caches, defined once for the doctor, the warm-up and the evidence sampler.

Each location is the one the tool itself picks from a process's environment:

* MIOpen 2.17 (ROCm 5.2.3 ``src/db_path.cpp.in``): the user find-db ``$MIOPEN_USER_DB_PATH``, else
  ``~/.config/miopen``; compiled kernels ``$MIOPEN_CUSTOM_CACHE_DIR``, else ``~/.cache/miopen``.
* torch Inductor (``torch/_inductor/runtime/cache_dir_utils.default_cache_dir``): ``$TORCHINDUCTOR_CACHE_DIR``,
  else ``torchinductor_<user>`` in the temporary directory (``$TMPDIR``, ``$TEMP``, ``$TMP``, else /tmp). The user
  is the one ``getpass`` finds in that environment; a UID with no passwd entry (a container run as ``--user
  1000``) is ``uid_<n>``, as torch names it.
* Triton: ``$TRITON_CACHE_DIR``; else, when Inductor drives it, ``<inductor>/triton/<device>``, and when a
  program calls it directly, ``$TRITON_HOME/.triton/cache`` (``triton/knobs.py``; TRITON_HOME defaults to home).

Functions take the environment as a mapping, so the supervisor can ask about its child's environment rather than
its own, and tests can ask about any.
"""

from __future__ import annotations

import os
import pwd
import re
from pathlib import Path
from typing import List, Mapping, Tuple

MIOPEN_USER_DB = "MIOPEN_USER_DB_PATH"
MIOPEN_KERNELS = "MIOPEN_CUSTOM_CACHE_DIR"
INDUCTOR = "TORCHINDUCTOR_CACHE_DIR"
TRITON = "TRITON_CACHE_DIR"
#: Every cache variable, in the order the sampler lists them.
CACHE_VARS = (MIOPEN_USER_DB, MIOPEN_KERNELS, INDUCTOR, TRITON)
#: The variables ``getpass.getuser`` reads before the passwd entry, in its order.
USER_VARS = ("LOGNAME", "USER", "LNAME", "USERNAME")
#: The device whose Triton cache Inductor's default names (the first GPU).
TRITON_DEVICE = "0"


def home(env: Mapping[str, str]) -> Path:
    return Path(env.get("HOME") or os.path.expanduser("~"))


def user(env: Mapping[str, str]) -> str:
    """The user name as ``getpass.getuser`` would find it in ``env``; ``uid_<n>`` without a passwd entry."""
    for var in USER_VARS:
        if env.get(var):
            return env[var]
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid_{os.getuid()}"


def miopen_dirs(env: Mapping[str, str]) -> Tuple[Path, Path]:
    """(user find-db, kernel cache) directories MIOpen 2.17 uses."""
    user_db = env.get(MIOPEN_USER_DB) or home(env) / ".config" / "miopen"
    kernels = env.get(MIOPEN_KERNELS) or home(env) / ".cache" / "miopen"
    return Path(user_db), Path(kernels)


def inductor_dir(env: Mapping[str, str], name: str = "") -> Path:
    """Inductor's cache directory (``name``: the user, when known; else as ``getpass`` finds it in ``env``)."""
    if env.get(INDUCTOR):
        return Path(env[INDUCTOR])
    tmp = next((env[key] for key in ("TMPDIR", "TEMP", "TMP") if env.get(key)), "/tmp")
    return Path(tmp) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", name or user(env)))


def compile_dirs(env: Mapping[str, str], name: str = "") -> Tuple[Path, Path]:
    """(inductor, triton) cache directories of ``torch.compile``: Triton's under Inductor's unless it is set."""
    inductor = inductor_dir(env, name)
    return inductor, Path(env.get(TRITON) or inductor / "triton" / TRITON_DEVICE)


def watched(env: Mapping[str, str]) -> List[Tuple[str, str]]:
    """(label, path) of every cache a process with ``env`` could write; a default is labelled ``VAR (default)``.

    Triton's default here is its own (``$TRITON_HOME/.triton/cache``): the one under Inductor's folder is inside a
    folder already watched.
    """
    unset = {key: value for key, value in env.items() if key not in CACHE_VARS}
    user_db, kernels = miopen_dirs(unset)
    defaults = {
        MIOPEN_USER_DB: str(user_db),
        MIOPEN_KERNELS: str(kernels),
        INDUCTOR: str(inductor_dir(unset)),
        TRITON: str(Path(env.get("TRITON_HOME") or home(env)) / ".triton" / "cache"),
    }
    found: List[Tuple[str, str]] = []
    for var in CACHE_VARS:
        path, label = (env[var], var) if env.get(var) else (defaults[var], f"{var} (default)")
        if path not in (p for _, p in found):
            found.append((label, path))
    return found
