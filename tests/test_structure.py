"""The house's plan, pinned: which folder may import which, and how big a unit may grow.

The package's folders are layers, from the words of a run directory up to the command line
(:data:`LAYERS`). A module imports only from its own layer or those below it, so there is no cycle
between folders and no arrow back up; the core (everything below ``view``) never imports
presentation code. Functions stay under 60 lines and classes under 250: past that a unit does
several things, and the next feature belongs in a module of its own. Tests mirror the folders.
Imports inside functions count as well: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

from tests.paths import REPO

PACKAGE = REPO / "train"
#: Low to high. A unit is a folder of train/ or a top-level module; each may import its own layer and those below.
LAYERS: Tuple[Tuple[str, ...], ...] = (
    ("__init__", "errors", "atomic", "interrupt"),  # the ground floor: standard library only
    ("rundir",),  # the run's files and their words
    ("heartbeat", "faults"),  # the child's side of the contract
    ("system",),  # facts about the machine and its processes
    ("diagnose",),  # why a child is silent
    ("supervise",),  # the supervisor and what only it uses
    ("job",),  # a job of several nodes, one supervisor each, seen as one thing
    ("slurm",),  # a Slurm job step: its variables, its run directory, its warning signal
    ("view",),  # what a person sees: status, live view, report
    ("yolo",),  # everything Ultralytics
    ("container",),  # the images and containers
    ("doctor",),  # what stands between the machine and a run
    ("cli", "__main__"),  # the front door
)
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}
#: Presentation libraries: only ``view`` (and what stands above it) may import them.
PRESENTATION = ("rich", "matplotlib")
CORE = ("rundir", "system", "diagnose", "supervise")
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 250
#: Test folders that mirror no package folder: shared helpers and recorded data.
TEST_ONLY = {"fixtures", "__pycache__"}


def modules() -> Iterator[Tuple[str, Path]]:
    """(dotted name under trainbox, path) of every module in train/."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        yield ".".join(parts), path


def unit_of(dotted: str) -> str:
    """The folder (or top-level module) a module belongs to: ``supervise.monitor`` -> ``supervise``."""
    return dotted.split(".", 1)[0]


def imported(path: Path, dotted: str) -> Iterator[str]:
    """Every trainbox module ``path`` imports, as a dotted name under trainbox ("" for the package itself)."""
    package = dotted.split(".")[:-1] if path.name != "__init__.py" else dotted.split(".")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(["trainbox", *package[: len(package) - node.level + 1], *([base] if base else [])])
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            if name == "trainbox" or name.startswith("trainbox."):
                yield name[len("trainbox.") :] if name != "trainbox" else "__init__"


def third_party(path: Path) -> Set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def unit_graph() -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {}
    for dotted, path in modules():
        source = unit_of(dotted)
        graph.setdefault(source, set()).update(unit_of(name) for name in imported(path, dotted) if unit_of(name) != source)
    return graph


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(dotted) for dotted, _ in modules()}
    assert units <= set(RANK), f"give these a layer in LAYERS: {sorted(units - set(RANK))}"


def test_no_import_runs_back_up() -> None:
    upward = [
        f"{dotted} imports trainbox.{name} ({unit_of(dotted)} is below {unit_of(name)})"
        for dotted, path in modules()
        for name in imported(path, dotted)
        if unit_of(name) in RANK and RANK[unit_of(name)] > RANK.get(unit_of(dotted), len(LAYERS))
    ]
    assert not upward, "\n".join(upward)


def test_no_cycle_between_folders() -> None:
    graph = unit_graph()

    def reaches(start: str, goal: str, seen: Set[str]) -> bool:
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})) for nxt in graph.get(start, ()))

    cycles = [f"{a} <-> {b}" for a, b in itertools.combinations(sorted(graph), 2) if reaches(a, b, {a}) and reaches(b, a, {b})]
    assert not cycles, cycles


def module_graph() -> Dict[str, Set[str]]:
    """Module -> the modules it imports (a name imported from a module counts as that module; a package is its
    ``__init__``)."""
    known = {dotted for dotted, _ in modules()}

    def module_of(name: str) -> str:
        parts = name.split(".")
        while parts and ".".join(parts) not in known and ".".join([*parts, "__init__"]) not in known:
            parts.pop()
        dotted = ".".join(parts)
        return dotted if dotted in known else ".".join([*parts, "__init__"]) if parts else "__init__"

    return {dotted: {module_of(name) for name in imported(path, dotted)} - {dotted, "__init__"} for dotted, path in modules()}


def test_no_import_circle_between_files() -> None:
    """Within a folder too: a circle of modules is one module in several files (and an import-order trap)."""
    graph = module_graph()
    on_path: List[str] = []
    done: Set[str] = set()
    circles: List[str] = []

    def visit(node: str) -> None:
        on_path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                circles.append(" -> ".join([*on_path[on_path.index(nxt) :], nxt]))
            elif nxt not in done:
                visit(nxt)
        on_path.pop()
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            visit(start)
    assert not circles, "\n".join(circles)


def test_the_settings_table_imports_no_feature() -> None:
    """The one table of settings sits under every feature that reads it: what it imports of the supervisor are
    leaves (the words a flag accepts), never a module that imports more of it."""
    graph = module_graph()
    supervise = {name for name in graph if name.startswith("supervise.")}
    feeding = sorted(graph["supervise.settings"] & supervise)
    not_leaves = [f"{name} imports {sorted(graph[name] & supervise)}" for name in feeding if graph[name] & supervise]
    assert not not_leaves, not_leaves


def test_the_core_never_imports_presentation() -> None:
    found = [
        f"{dotted} imports {name}"
        for dotted, path in modules()
        if unit_of(dotted) in CORE
        for name in sorted(third_party(path) & set(PRESENTATION))
    ]
    assert not found, found


def _sizes(kinds: Tuple[type, ...]) -> List[Tuple[int, str]]:
    found = []
    for dotted, path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, kinds):
                found.append((node.end_lineno - node.lineno + 1, f"{dotted}.{node.name}"))  # type: ignore[attr-defined]
    return sorted(found, reverse=True)


def test_no_function_over_60_lines() -> None:
    long = [f"{name}: {lines}" for lines, name in _sizes((ast.FunctionDef, ast.AsyncFunctionDef)) if lines > MAX_FUNCTION_LINES]
    assert not long, long


def test_no_class_over_250_lines() -> None:
    long = [f"{name}: {lines}" for lines, name in _sizes((ast.ClassDef,)) if lines > MAX_CLASS_LINES]
    assert not long, long


def package_folders() -> Set[str]:
    """Every package folder under train/, as a path: ``supervise``, ``supervise/output``, ..."""
    return {str(p.parent.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py")} - {"."}


def test_tests_mirror_the_folders() -> None:
    """Every package folder has its tests folder, nested ones too; a top-level tests folder mirrors a package folder
    (a nested one may also group the tests of one module, as ``container/bundle`` does)."""
    folders = package_folders()
    tests = REPO / "tests"
    mirrored = {str(p.parent.relative_to(tests)) for p in tests.rglob("__init__.py") if p.parent != tests}
    assert folders <= mirrored, f"no tests/ folder for {sorted(folders - mirrored)}"
    top = {name for name in mirrored if "/" not in name} - TEST_ONLY
    assert top <= folders, f"tests/ folders that mirror no package folder: {sorted(top - folders)}"


def test_every_folder_is_packaged() -> None:
    """pyproject.toml lists every package folder, so an install (the images, pip install) carries it."""
    text = (REPO / "pyproject.toml").read_text()
    folders = sorted(name.replace("/", ".") for name in package_folders())
    missing = [name for name in folders if f'"trainbox.{name}"' not in text]
    assert not missing, f"add to [tool.setuptools] packages: {missing}"
