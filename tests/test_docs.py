"""The documentation: README.md and the MkDocs site in docs/, checked as a reader would use them.

* The site builds with ``mkdocs build --strict``: no broken link, anchor or page, every page in the navigation.
* The CLI reference is each command's ``--help``: the site's hook renders it when it is built, and this compares
  the built page with the real ``python -m trainbox ... --help`` and ``invoke ... --help``.
* Every ``sh`` block of README.md and the getting-started page says whether it is run here (``<!-- test: run -->``)
  or why not (``<!-- test: skip. WHY -->``), and the runnable ones run, one block a test, in a fresh clone of this
  checkout (its working tree as it is now, committed or not; files git does not know are not in it, as in a clone),
  from the clone's root, with bash, as a user would type them. The clone's own code is on PYTHONPATH, where
  ``pip install -e .`` would put it; the dependencies are this environment's.
* The README's test command is what .ci/run runs, and the README fits on a few screens.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from tests.paths import REPO

README = REPO / "README.md"
#: The pages whose shell blocks a new user types first.
RUNNABLE_PAGES = (README, REPO / "docs" / "getting-started.md")
#: The width the site's hook renders help at (docs/hooks/cli_reference.py).
COLUMNS = "100"
#: "About 200 lines", the most a README on one page may take.
README_MAX_LINES = 200
#: Lines a reader sees before scrolling: the demo, the test command and "your own script" must be among them.
FIRST_SCREEN = 50

FENCE = re.compile(r"^```sh\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
MARK = re.compile(r"<!-- test: (?P<verdict>run|skip)(?P<why>[^>]*)-->\s*$", re.DOTALL)


def shell_blocks(page: Path) -> List[Tuple[str, str, str]]:
    """Each ``sh`` block of ``page``: its verdict (run, skip, or "" when it has no mark), the reason given, its text."""
    text = page.read_text()
    blocks = []
    for fence in FENCE.finditer(text):
        before = text[: fence.start()].rstrip("\n")
        comment = before[before.rfind("<!--") :] if before.endswith("-->") else ""
        mark = MARK.search(comment)
        verdict, why = (mark.group("verdict"), mark.group("why").strip(" .\n")) if mark else ("", "")
        blocks.append((verdict, why, fence.group("body")))
    return blocks


def runnable() -> Iterator[object]:
    for page in RUNNABLE_PAGES:
        for number, (verdict, _, body) in enumerate(shell_blocks(page)):
            if verdict == "run":
                yield pytest.param(body, id=f"{page.name}-{number}")


def test_every_shell_block_says_whether_it_runs_and_why_not() -> None:
    for page in RUNNABLE_PAGES:
        blocks = shell_blocks(page)
        assert blocks, f"{page.name} has no sh block"
        unmarked = [body for verdict, _, body in blocks if not verdict]
        assert not unmarked, f"{page.name}: sh blocks without <!-- test: run --> or <!-- test: skip. WHY -->: {unmarked}"
        skipped_silently = [body for verdict, why, body in blocks if verdict == "skip" and len(why) < 20]
        assert not skipped_silently, f"{page.name}: a skipped block must say why: {skipped_silently}"
    assert any(verdict == "run" for verdict, _, _ in shell_blocks(README)), "the README has a block a user can run here"


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh clone of this checkout at its working tree's state (``git stash create``: tracked files as they are)."""
    if not (REPO / ".git").exists():
        pytest.fail(f"{REPO} is not a git checkout: the documented commands are tried in a fresh clone of one")

    def git(*args: str) -> str:
        # A stash commit needs an author; a CI machine's git may have none configured.
        identity = ["-c", "user.name=trainbox tests", "-c", "user.email=tests@localhost"]
        return subprocess.run(["git", *identity, *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()

    commit = git("stash", "create") or git("rev-parse", "HEAD")  # stash create: nothing when the tree is clean
    target = tmp_path_factory.mktemp("clone") / "trainbox"
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(REPO), str(target)], check=True, timeout=120)
    subprocess.run(["git", "checkout", "-q", commit], cwd=target, check=True, timeout=120)
    return target


def user_environment(clone: Path, home: Path) -> Dict[str, str]:
    """This environment's programs, the clone's trainbox, and nothing of the supervisor's own contract."""
    installed = home / "site"
    installed.mkdir(exist_ok=True)
    link = installed / "trainbox"
    if not link.exists():
        link.symlink_to(clone / "train")  # what `pip install -e .` maps: the package trainbox is the folder train/
    env = {key: value for key, value in os.environ.items() if not key.startswith(("TRAIN_", "TRAINBOX_", "PYTEST_"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(installed))
    return env


@pytest.mark.parametrize("block", list(runnable()))
def test_a_runnable_block_runs_in_a_fresh_clone(block: str, clone: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=clone,
        env=user_environment(clone, tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = f"$ {block}\n{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, said
    assert "Traceback" not in done.stdout + done.stderr, said


def test_the_readmes_test_command_is_what_ci_runs() -> None:
    """.ci/run ends in the README's test command (plus -ra, pytest's summary of what did not pass)."""
    section = README.read_text().split("## Run the tests", 1)[1]
    (command,) = FENCE.search(section).group("body").splitlines()  # one line
    last = [line for line in (REPO / ".ci/run").read_text().splitlines() if line.strip()][-1]
    assert last == f"{command} -ra", (command, last)
    assert command.startswith("pip install -e '.[test]' && "), "from a fresh clone, the test extra comes first"


def test_the_readme_fits_on_a_few_screens_and_the_first_shows_the_way_in() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move the rest into docs/"
    first_screen = "\n".join(lines[:FIRST_SCREEN])
    for what in ("python -m trainbox demo", "python -m pytest", "python -m trainbox supervise"):
        assert what in first_screen, f"{what} is not on the README's first screen"


# -- the site -------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


#: The site is built once per worker (about 3 s of CPU), and the tests that read it share it: one worker for them.
ON_THE_SITE = pytest.mark.xdist_group("docs-site")


@ON_THE_SITE
def test_the_site_builds_strictly(site: Path) -> None:
    pages = sorted(path.stem for path in (REPO / "docs").glob("*.md"))
    built = sorted(path.parent.name if path.parent != site else "index" for path in site.glob("**/index.html"))
    assert set(pages) <= set(built) | {"index"}, (pages, built)
    assert (site / "report.png").exists() and (site / "images" / "lost_work.png").exists()


def code_blocks(page: Path) -> List[str]:
    """The text of every code block of a built page, as a reader sees it."""
    blocks = re.findall(r"<code>(.*?)</code>", page.read_text(), flags=re.DOTALL)
    return [html.unescape(re.sub(r"<[^>]+>", "", block)).rstrip() for block in blocks]


def printed(argv: List[str]) -> str:
    done = subprocess.run(argv, cwd=REPO, env={**os.environ, "COLUMNS": COLUMNS}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.rstrip()


@ON_THE_SITE
def test_the_cli_reference_is_every_commands_help(site: Path) -> None:
    from trainbox.cli import build_parser

    blocks = code_blocks(site / "cli" / "index.html")
    subcommands = next(action for action in build_parser()._actions if action.dest == "command").choices
    trainbox = [[sys.executable, "-m", "trainbox", *words, "--help"] for words in [[], *([name] for name in subcommands)]]
    # invoke: its list, one task with options, one whose positional argument tasks.py answers --help for.
    invoke = [[sys.executable, "-m", "invoke", *words] for words in (["--list"], ["train", "--help"], ["bundle", "--help"])]
    with ThreadPoolExecutor(max_workers=4) as pool:  # each is a Python starting: side by side, they wait less
        shown = list(pool.map(printed, trainbox + invoke))
    for argv, text in zip(trainbox + invoke, shown):
        assert text in blocks, f"the CLI reference does not show `{' '.join(argv[2:])}` as it prints"
    names = re.findall(r"^  (\w[\w-]*)", shown[len(trainbox)], flags=re.MULTILINE)
    assert "train" in names and len(names) >= 10, shown[len(trainbox)]
    headings = set(re.findall(r'<h3 id="invoke-([\w-]+)"', (site / "cli" / "index.html").read_text()))
    assert headings == set(names), "a heading for every task"
