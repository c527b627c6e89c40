"""The corpus: real programs' recorded output replayed through the reader, with the verdicts written beside each.

Each ``tests/fixtures/corpus/NAME.ttyrec`` is what one real program wrote to a pseudo-terminal, every chunk with the
second it was read (tests/fixtures/corpus/README.md: which program, which version, how). :func:`tests.reading.replay`
feeds it to TerminalLines and OutputProgress as the supervisor's reader does, at the recorded times, in
milliseconds. ``NAME.yaml`` says what a person reading that output knows:

* ``progress``: display lines whose counter (the regex's groups, else the whole match) shows a new value are
  progress, and a redraw of the same value is not (``again: maybe``: the same value may also be a new pass of a bar
  whose line does not show which); ``phase`` and ``place`` (a beat's field: the group it equals) where the line
  names them; ``min``: how many new values the recording shows at least;
* ``still``: lines that are never progress (chatter, rates, reports);
* ``silences``: healthy silent phases (an evaluation, a save): from each line matching ``after`` (its ``first``
  N, where given) to the next matching ``until`` nothing is progress, the recording is silent for ``min_s`` at
  least, and the place in force names ``phase`` where given;
* ``hang``: where a hang began (a program hung with trainbox.faults): nothing after the line matching ``after`` is
  progress, for ``min_s`` of recording at least, and the place in force is ``place``.

Every change to the reader must pass the whole corpus. A new format: record it, write its verdicts (README.md there).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
import yaml

from tests.reading import Read, load_ttyrec, replay

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus"
NAMES = sorted(path.stem for path in CORPUS.glob("*.ttyrec"))
#: The issue's floor: real programs and formats, recorded.
MIN_RECORDINGS = 15
#: The corpus stays small enough to live in the repository and replay in milliseconds.
MAX_CORPUS_BYTES = 600 * 1024


@dataclass(frozen=True)
class Replayed:
    name: str
    reads: List[Read]
    verdicts: Dict[str, Any]
    #: When the recording ended (its last chunk, empty when the recorder cut it).
    ended_at: float

    def matching(self, pattern: str) -> Iterator[Tuple[int, re.Match[str]]]:
        regex = re.compile(pattern)
        for index, read in enumerate(self.reads):
            match = regex.search(read.line)
            if match is not None:
                yield index, match

    def place_at(self, index: int) -> Optional[Dict[str, Any]]:
        """The last beat read at or before ``index``: the place in force then."""
        return next((read.beat for read in reversed(self.reads[: index + 1]) if read.beat is not None), None)

    def where(self, index: int) -> str:
        return f"{self.name} at {self.reads[index].at:.3f} s: {self.reads[index].line[:160]!r}"


def having(section: str) -> List[str]:
    """The recordings whose verdicts hold ``section``."""
    return [path.stem for path in sorted(CORPUS.glob("*.yaml")) if section in (yaml.safe_load(path.read_text()) or {})]


@functools.lru_cache(maxsize=None)
def replayed(name: str) -> Replayed:
    """``NAME.ttyrec`` through the reader, once per test session, with ``NAME.yaml``'s verdicts."""
    verdicts = yaml.safe_load((CORPUS / f"{name}.yaml").read_text())
    chunks = load_ttyrec(CORPUS / f"{name}.ttyrec")
    return Replayed(name, replay(chunks), verdicts, chunks[-1][0])


def test_the_corpus_holds_enough_real_programs_each_with_its_verdicts_and_its_note() -> None:
    assert len(NAMES) >= MIN_RECORDINGS, NAMES
    assert having("progress") == NAMES, "every recording says where its progress is"
    assert sorted(path.stem for path in CORPUS.glob("*.yaml")) == NAMES, "every recording has its verdicts, and no more"
    readme = (CORPUS / "README.md").read_text()
    assert [name for name in NAMES if f"`{name}`" not in readme] == [], "README.md says how each was recorded"
    assert sum(path.stat().st_size for path in CORPUS.glob("*.ttyrec")) <= MAX_CORPUS_BYTES


@pytest.mark.parametrize("name", having("progress"))
def test_progress(name: str) -> None:
    run = replayed(name)
    for rule in run.verdicts["progress"]:
        moves, last = 0, None
        for index, match in run.matching(rule["line"]):
            value = match.groups() if any(group is not None for group in match.groups()) else match.group(0)
            beat = run.reads[index].beat
            if value == last:
                # the same value again is a redraw, unless the rule says it may be a new pass (the line cannot tell)
                assert beat is None or rule.get("again") == "maybe", f"a redraw read as progress: {run.where(index)}"
                continue
            last = value
            moves += 1
            assert beat is not None, f"a new {value!r} not read as progress: {run.where(index)}"
            if "phase" in rule:
                assert beat.get("phase") == rule["phase"], f"{beat}: {run.where(index)}"
            for key, group in rule.get("place", {}).items():
                assert beat.get(key) == int(match.group(group)), f"{key} of {beat}: {run.where(index)}"
        assert moves >= rule.get("min", 1), f"{name}: {rule['line']!r} shows a new value only {moves} times"


@pytest.mark.parametrize("name", having("still"))
def test_still(name: str) -> None:
    run = replayed(name)
    for pattern in run.verdicts["still"]:
        seen = list(run.matching(pattern))
        assert seen, f"{name}: no line matches {pattern!r}"
        assert [run.where(index) for index, _ in seen if run.reads[index].beat is not None] == []


@pytest.mark.parametrize("name", having("silences"))
def test_healthy_silences(name: str) -> None:
    run = replayed(name)
    for rule in run.verdicts["silences"]:
        untils = [index for index, _ in run.matching(rule["until"])]
        starts = [index for index, _ in run.matching(rule["after"])][: rule.get("first")]
        assert starts, f"{name}: no line matches {rule['after']!r}"
        for start in starts:
            end = next((index for index in untils if index > start), None)
            assert end is not None, f"the silence never ends: {run.where(start)}"
            between = [run.where(i) for i in range(start + 1, end) if run.reads[i].beat is not None]
            assert between == [], f"progress read inside a silent {rule['kind']}"
            silent_s = run.reads[end].at - run.reads[start].at
            assert silent_s >= rule.get("min_s", 0), f"silent {silent_s:.2f} s only: {run.where(start)}"
            if "phase" in rule:
                place = run.place_at(start)
                assert place is not None and place.get("phase") == rule["phase"], f"{place}: {run.where(start)}"


@pytest.mark.parametrize("name", having("hang"))
def test_where_a_hang_began(name: str) -> None:
    run = replayed(name)
    rule = run.verdicts["hang"]
    start = next(index for index, _ in run.matching(rule["after"]))
    after = [run.where(i) for i in range(start + 1, len(run.reads)) if run.reads[i].beat is not None]
    assert after == [], "progress read after the hang began"
    assert run.ended_at - run.reads[start].at >= rule["min_s"], "the recording holds the hang's silence"
    place = run.place_at(start)
    assert place is not None and {key: place.get(key) for key in rule["place"]} == rule["place"], place
