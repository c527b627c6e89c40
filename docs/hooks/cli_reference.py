"""MkDocs hook: the CLI reference is the commands' own ``--help``, rendered when the site is built.

A page line ``<!-- help-tree: python -m trainbox -->`` becomes the top-level help and then, for every subcommand
argparse knows, a heading ``python -m trainbox NAME`` and that subcommand's help; ``<!-- help-tree: invoke -->`` does
the same for every invoke task in tasks.py (``invoke --list``, then each task's help). A new subcommand or task
appears by itself, and the text cannot drift from the code: it is what the code prints, never written twice.

Each tool's help is printed by one Python process (this environment's, from the repository root, at COLUMNS=100
so that the wrapping does not depend on a terminal): the parser's own ``format_help``, which ``--help`` prints,
and invoke's own ``--list`` and ``print_task_help``, which ``invoke TASK --help`` prints. One process per tool,
not one per command: each start imports trainbox or tasks.py, about half a second of CPU. tests/test_docs.py
runs the real ``--help`` of each command and compares it with the built page. A failure stops the build.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- help-tree: (?P<command>python -m trainbox|invoke) -->$", re.MULTILINE)
#: The width help is wrapped at, here and in the test that compares the page with --help.
COLUMNS = "100"

#: Prints [[subcommand, help], ...] as JSON, "" for the top level: what `python -m trainbox [NAME] --help` prints.
TRAINBOX = """
import argparse, json
from trainbox.cli import build_parser
parser = build_parser()
helps = [["", parser.format_help()]]
for action in parser._actions:
    if isinstance(action, argparse._SubParsersAction):
        helps += [[name, sub.format_help()] for name, sub in action.choices.items()]
print(json.dumps(helps))
"""
#: The same for invoke: `invoke --list`, then what `invoke TASK --help` prints for each task.
INVOKE = """
import contextlib, io, json
from invoke.main import program
def printed(call, *args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        call(*args)
    return out.getvalue()
helps = [["", printed(program.run, ["invoke", "--list"], False)]]
helps += [[name, printed(program.print_task_help, name)] for name in program.collection.task_names]
print(json.dumps(helps))
"""


def helps(command: str) -> List[Tuple[str, str]]:
    """``(subcommand, help)`` of ``command`` and each of its subcommands ("" first: the command's own)."""
    script = TRAINBOX if command == "python -m trainbox" else INVOKE
    env = {**os.environ, "COLUMNS": COLUMNS}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"the help of {command} could not be rendered: {done.stderr.strip()}")
    return [(name, text) for name, text in json.loads(done.stdout)]


def block(text: str) -> str:
    return f"```text\n{text.rstrip()}\n```\n"


def tree(command: str) -> str:
    """The command's help, then each subcommand's under a heading of its own."""
    (_, top), *subs = helps(command)
    return "\n".join([block(top), *(f"### `{command} {name}`\n\n{block(text)}" for name, text in subs)])


def on_page_markdown(markdown: str, **_: object) -> str:
    """Replace each help-tree marker with its command's help and its subcommands'."""
    return MARKER.sub(lambda match: tree(match.group("command")), markdown)
