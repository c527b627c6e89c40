"""Keep Ultralytics off the network, and prove it.

What Ultralytics 8.4.190 reads (checked in its source):

* ``YOLO_OFFLINE=1``: ``utils.is_online()`` returns False without its DNS
  probe, so ``ONLINE`` is False: no pip update check, no analytics events, no
  dataset or asset downloads are attempted by the code paths that ask.
* ``YOLO_AUTOINSTALL=0``: ``check_requirements`` never runs pip.
* ``YOLO_CONFIG_DIR``: ``USER_CONFIG_DIR`` is ``$YOLO_CONFIG_DIR/Ultralytics``,
  home of ``settings.json`` and of the fonts. Read once, at import.
* ``check_font("Arial.ttf")`` runs on every ``check_det_dataset`` (every
  train and val process) and, when the font is not in ``USER_CONFIG_DIR``,
  calls ``requests.head`` on GitHub *even when offline* (a 3 s stall through
  a silent proxy). A copy of matplotlib's DejaVuSans.ttf under both names
  Ultralytics asks for (``Arial.ttf``, ``Arial.Unicode.ttf``) ends that.
* Settings ``sync`` (analytics) and the integrations (clearml, comet, dvc,
  mlflow, raytune, tensorboard, wandb) are switched off after import.

Training from ``yolov8n.yaml`` needs no weights, and Ultralytics' ``check_amp``,
which would download a model, never runs: the trainer hands Ultralytics
``amp=False`` for its setup and checks AMP offline itself
(``trainbox.yolo.trainer``, ``trainbox.yolo.device_probe``).

``install_network_guard`` adds an audit hook that refuses every
``socket.connect``, ``sendto``, ``getaddrinfo`` and ``gethostbyname*`` to a
non-loopback host, and every process started (``subprocess``, ``os.system``,
``os.exec*``, ``posix_spawn``) whose command names a network program (curl,
wget, git, pip...), appending a line (with the Python stack) to
``RUN_DIR/network.log``. A data.yaml's ``download:`` never gets that far: the
dataset is resolved before training starts (:mod:`trainbox.yolo.dataset`). It is
installed in the training process before Ultralytics is imported and in every
DataLoader worker; tests assert the log stays absent. The log and the fonts are
written through :mod:`trainbox.rundir.safe` (both live in the run directory).

An unmodified ``yolo`` command under ``trainbox supervise`` is the user's own program, with their settings (its
datasets, weights and runs folders live in the same settings file) and perhaps weights still to download: none of
the above is done to it. :func:`advice` is the one line the supervisor says at start instead, on how to make it
offline (or to train through ``trainbox run``, which does all of it).
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Tuple

from trainbox.rundir.records import files_of
from trainbox.rundir.safe import RunFiles

FONT_NAMES = ("Arial.ttf", "Arial.Unicode.ttf")
#: Ultralytics' command-line program (its console script).
ULTRALYTICS_PROGRAM = "yolo"
INTEGRATIONS = ("clearml", "comet", "dvc", "mlflow", "raytune", "tensorboard", "wandb")


class NetworkBlocked(ConnectionRefusedError):
    """Raised inside the process that tried to reach the network (an OSError, as a failed connect is)."""


def _is_local(host: Any) -> bool:
    if host is None or not isinstance(host, (str, bytes)):
        return True  # passive lookups and non-IP families (netlink, ...)
    name = host.decode() if isinstance(host, bytes) else host
    if name in ("", "localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(name.split("%")[0]).is_loopback
    except ValueError:
        return False


#: Socket events and where their (host, port) is: ``socket.connect``/``sendto`` (sock, address),
#: ``getaddrinfo`` (host, port, ...), ``gethostbyname``/``gethostbyname_ex``/``gethostbyaddr`` (host,).
_SOCKET_EVENTS = (
    "socket.connect",
    "socket.sendto",
    "socket.getaddrinfo",
    "socket.gethostbyname",
    "socket.gethostbyname_ex",
    "socket.gethostbyaddr",
)
#: Programs that exist to reach the network. Ultralytics starts ``curl`` (``safe_download(curl=True)``) and runs a
#: data.yaml's ``download: bash ...`` through subprocess; pip and git would fetch too. Other programs (compilers
#: that torch.compile starts, say) are left alone.
NETWORK_PROGRAMS = frozenset({"curl", "wget", "git", "pip", "pip3", "aria2c", "ssh", "scp", "sftp", "rsync", "nc", "ncat", "ftp"})
_PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn")


def _socket_target(event: str, args: Tuple[Any, ...]) -> Optional[Tuple[Any, Any]]:
    """(host, port) a socket event goes to, or None when it stays on this machine."""
    if event in ("socket.connect", "socket.sendto"):
        address = args[1]
        if not isinstance(address, tuple):
            return None  # AF_UNIX path (multiprocessing, resource sharing)
        host, port = address[0], address[1] if len(address) > 1 else None
    elif event == "socket.getaddrinfo":
        host, port = args[0], args[1]
    else:
        host, port = args[0], None
    return None if _is_local(host) else (host, port)


def _network_program(event: str, args: Tuple[Any, ...]) -> Optional[str]:
    """The network program a process event would start (also inside ``sh -c '...'``), else None."""
    if event == "os.system":
        words = [str(args[0])]
    else:
        program, argv = args[0], args[1] if len(args) > 1 else ()
        words = [str(program)] + [str(word) for word in (argv if isinstance(argv, (list, tuple)) else [argv])]
    for token in re.split(r"[\s;|&()'\"`<>]+", " ".join(words)):
        if os.path.basename(token) in NETWORK_PROGRAMS:
            return os.path.basename(token)
    return None


def _destination(event: str, args: Tuple[Any, ...]) -> Optional[str]:
    """What the event would reach beyond this machine, in words, or None."""
    if event in _SOCKET_EVENTS:
        target = _socket_target(event, args)
        return None if target is None else f"host={target[0]!r} port={target[1]!r}"
    if event in _PROCESS_EVENTS:
        program = _network_program(event, args)
        return None if program is None else f"program={program!r}"
    return None


_guard_log: Optional[Path] = None


def _audit(event: str, args: Tuple[Any, ...]) -> None:
    if _guard_log is None or not event.startswith(("socket.", "subprocess.", "os.")):
        return
    target = _destination(event, args)
    if target is None:
        return
    stack = "".join(traceback.format_stack(limit=12)[:-1])
    line = f"{time.time():.3f} pid={os.getpid()} {event} {target}\n{stack}\n"
    files, name = files_of(_guard_log)
    files.append(name, line.encode("utf-8", "replace"))  # refused (a link planted there): the refusal below still holds
    raise NetworkBlocked(f"trainbox: network access ({event} {target}) blocked (see {_guard_log})")


def install_network_guard(log_path: Path) -> None:
    """Refuse and record non-loopback connects and lookups in this process (and its forks).

    Audit hooks cannot be removed; installing again only changes the log file.
    """
    global _guard_log
    first = _guard_log is None
    _guard_log = Path(log_path)
    if first:
        sys.addaudithook(_audit)


def matplotlib_font() -> Path:
    """matplotlib's DejaVuSans.ttf, located without importing matplotlib."""
    spec = importlib.util.find_spec("matplotlib")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("matplotlib is not installed (Ultralytics needs it)")
    font = Path(list(spec.submodule_search_locations)[0]) / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf"
    if not font.is_file():  # not the run directory: matplotlib's own font
        raise RuntimeError(f"matplotlib's font {font} is missing")
    return font


def prepare_environment(config_dir: Path) -> Path:
    """Set the offline environment and put the fonts in place; call before importing Ultralytics.

    Returns Ultralytics' user config directory (``config_dir/Ultralytics``).
    """
    files, user_dir = RunFiles(config_dir), Path(config_dir) / "Ultralytics"  # walked below config_dir, no link followed
    font = matplotlib_font()
    size = font.stat().st_size  # not the run directory: matplotlib's own font
    for name in FONT_NAMES:
        there = files.stat(user_dir / name).value
        if there is None or there.st_size != size:
            files.replace(user_dir / name, font.read_bytes(), fsync=False)  # not the run directory: read from matplotlib's
    os.environ["YOLO_OFFLINE"] = "1"
    os.environ["YOLO_AUTOINSTALL"] = "0"
    os.environ["YOLO_CONFIG_DIR"] = str(config_dir)
    return user_dir


def disable_settings_sync() -> None:
    """Switch off analytics sync and the logging integrations in Ultralytics' settings."""
    from ultralytics.utils import SETTINGS

    wanted = {key: False for key in ("sync",) + INTEGRATIONS if key in SETTINGS}
    if any(SETTINGS.get(key) is not False for key in wanted):
        SETTINGS.update(wanted)


def advice(argv: Sequence[str], env: Mapping[str, str]) -> Optional[str]:
    """The line said once at the start of a supervised ``yolo`` command on how to keep it off the network; None for
    any other command, or when its environment already says ``YOLO_OFFLINE``."""
    if not argv or os.path.basename(argv[0]) != ULTRALYTICS_PROGRAM or env.get("YOLO_OFFLINE"):
        return None
    return (
        "an Ultralytics command: it may reach the network (update checks, analytics, a font fetched from GitHub at "
        "every run, weights). To keep it offline, give it YOLO_OFFLINE=1 and YOLO_AUTOINSTALL=0 in its environment, "
        "run `yolo settings sync=False` once, train from a model at hand (model=yolov8n.yaml, or a .pt file you have), "
        "and copy any .ttf font (matplotlib's DejaVuSans.ttf) as Arial.ttf into the folder `yolo settings` shows; "
        "`trainbox run` does all of this itself."
    )
