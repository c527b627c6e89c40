"""Progress read from what a child prints: a counter that advances, not any output.

A command that never calls ``beat()`` still tells a person how far it is: its
progress bar moves, its ``step 1200`` lines count up. Seed 001's check is the
rule here: "Run twice, 60 seconds apart. If batch number doesn't change =
HUNG." So progress is a *counter* that takes a new value, never output as
such: a thread that prints "GPU memory 5.1 GB" while the loop is stuck, a
bar redrawn at the same count by tqdm's monitor thread or by rich's refresh
thread, and a log line repeated with the same number are chatter. PortOS
(#1330, PR #1381) met exactly that: a flat watchdog was defeated by a thread
that kept printing, and was fixed by reading the step rate from the output.

:func:`read` is the pure recogniser: one display line (as
:class:`trainbox.supervise.output.terminal.TerminalLines` gives them, ``\\r`` redraws
included) in, a :class:`Reading` out, or None. The built-in :data:`PATTERNS`
cover the bars and log lines of the tools below, in this order, the first that
matches wins (:func:`describe` lists them with a sample line each):

* Ultralytics' own bars (8.x ``ultralytics.utils.tqdm``): the epoch bar
  ``1/50  1.2G  1.234 ...: 45% ━━━── 4886/41163``, the validation bar headed
  ``Class Images Instances Box(P ...`` and the dataset scans;
* tqdm's bars (``45%|####5 | 45/100 [00:04<00:05, 9.80it/s]``, ``s/it``, an
  unknown total ``45it [...]``), which are also Lightning's
  (``Epoch 3: ...``, ``Validation DataLoader 0: ...``) and Hugging Face
  Trainer's bars;
* rich's bars (``Epoch 0/1 ━━━ 4/20 ...`` as Lightning's RichProgressBar draws
  them, or a percentage as ``rich.progress.track`` does);
* Keras' step lines (``12/100 ━━━━ 1s 10ms/step - loss: 0.1``, Keras 2's
  ``[====>...]``) under its ``Epoch 3/10`` line;
* pytorch/examples' prints (mnist ``Train Epoch: 1 [640/60000 (1%)]``,
  imagenet ``Epoch: [0][ 10/5005]`` and ``Test: [ 1/196]``) and timm's
  ``Train: 3 [ 100/1251 (  8%)]``;
* Hugging Face Trainer's log dicts (``{'loss': 0.69, ..., 'epoch': 0.5}``);
* words: ``global_step N``, ``iteration N``, ``iter N``, ``step N``, a field's
  ``steps: N`` and ``batch N/total`` (with ``=``/``:``/``[``/``/total``: the
  PyTorch tutorials' ``Epoch [1/5], Step [100/600]``, Megatron's
  ``iteration      100/    1000 |``, DeepSpeed's ``step=10, skipped=0`` and
  ``epoch=0/micro_step=20/global_step=10``, torchtitan's ``step:  1``, a
  ``logging`` line), and ``epoch N`` alone; not a rate's unit (``ms/step: 530``,
  ``time per iter: 12``) nor a measure (``avg step: 1.23s``, ``step: 530ms``,
  ``batch size 32``): a timing thread's lines are chatter.

A user's ``--progress-pattern REGEX`` (:func:`user_pattern`) is tried before
them. The phase is taken from a bar's own label, never from the rest of the
line (Lightning's train bar ends ``val_loss=1.74``): ``val``, ``Validation``,
``Validating``, ``eval``, ``Evaluating``, ``Test``, ``Sanity Checking`` and
Ultralytics' ``Class Images Instances`` header are ``val``; ``train``,
``Training``, ``Epoch`` are ``train``; ``Scanning``, ``Caching``, ``Loading``,
``Downloading`` are ``setup``; ``Saving``, ``Writing``, ``checkpoint``, ``shards``
(Hugging Face's ``Writing model shards``) are ``save``. Numbers are kept as printed (Lightning counts
epochs from 0, Ultralytics and Keras from 1).

:class:`OutputProgress` is the stateful reader: it is given every display
state with the time it was read and answers with a beat (``phase``, ``epoch``,
``batch``, ``step`` as ``trainbox.heartbeat.beat`` writes them, plus
``pattern`` and ``counter``, and the training ``loss`` when the line shows one:
:func:`loss_in`) when a reading was progress. What counts as
progress, and which counter gives the place, is one model, written once in
:mod:`trainbox.supervise.output.counters` (and docs/progress.md): a counter (the
pattern with its bar's label or the words before a line's number, digits
masked, and total) makes progress when its value moves forward by any amount,
goes back to its start, or shows a new total; a value that only repeats is not
progress. A reading with a batch but no epoch takes the epoch of the last
reading that had one (Keras' ``Epoch 3/10`` line, Ultralytics' epoch bar before
its validation bar).

The forms are taken from the tools' own code and recorded output
(tests/fixtures/output/): tqdm's ``format_meter`` (``{l_bar}{bar}| {n_fmt}/{total_fmt}
[{elapsed}<{remaining}, {rate_fmt}{postfix}]``), Ultralytics'
``utils/tqdm.py`` ``_display`` and ``DetectionValidator.get_desc``, rich's
``BarColumn``/``MofNCompleteColumn``/``TaskProgressColumn``, Keras'
``Progbar``, pytorch/examples' ``mnist/main.py`` and ``imagenet/main.py``
``ProgressMeter``, timm's ``train.py``, Megatron-LM's ``training_log``,
DeepSpeed's ``_report_progress`` and ``ThroughputTimer``, and Hugging Face
``Trainer.log``.

How the supervisor uses it: the thread that reads the child's terminal feeds
each chunk to ``TerminalLines.feed`` and every state it returns to
:meth:`OutputProgress.observe` with ``time.monotonic()``; the supervisor loop
asks :meth:`OutputProgress.latest` for the last beat that was progress and when.

Limits: a counter is recognised only in one of these forms or the user's;
scaled counts (``4.5k/10k``) are read to the precision shown; a bar with no
epoch in its label reads as ``step`` and restarts at each epoch, so two stalls
at the same step of different epochs look like the same place; two processes
drawing the same bar (every DDP rank with its own tqdm) share a track, which
moves with the furthest of them. A line
that shows a counter costs about 30 µs to read here (a line that cannot, one
regex search), so a child that prints tens of thousands of counter lines a
second costs the reader a core.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from trainbox.errors import UserError
from trainbox.supervise.output.counters import Counters, Number, Reading
from trainbox.supervise.output.pattern import COUNTER_GROUPS, PATTERN_FLAG, pattern_problem
from trainbox.supervise.output.starts import Starts

#: Only this much of a line is read: every counter form above sits well inside it, and it bounds the regex work
#: per line whatever the child prints (TerminalLines already cuts lines at 4096 characters).
MAX_READ_CHARS = 4096
#: A counter longer than this many digits is not a counter (a hash, an id): 18 digits still fit in 64 bits.
MAX_DIGITS = 18
#: A phase taken from a user's ``phase`` group is cut to this many characters (it names a budget).
MAX_PHASE_CHARS = 32


@dataclass(frozen=True)
class LinePattern:
    """One form of progress line: how to find it, how to read it, and a line it recognises (docs and tests)."""

    name: str
    regex: re.Pattern[str]
    build: Callable[[re.Match[str]], Optional[Reading]]
    source: str
    sample: str
    #: Whether a line must pass :data:`_MAYBE_A_COUNTER` first (every built-in; a user's pattern is always tried).
    screened: bool = True


class ProgressPatternError(UserError):
    """A ``--progress-pattern`` that cannot be used; its message is the one line the user reads."""


# -- reading numbers and labels ---------------------------------------------------------------------------------

_SCALE = {"": 1, "k": 1000, "K": 1000, "M": 10**6, "G": 10**9, "T": 10**12}
_PHASES = (
    ("setup", re.compile(r"\b(?:scanning|caching|loading|downloading)\b", re.I)),
    ("save", re.compile(r"\b(?:save|saving|writing|checkpoint|checkpointing|shards?)\b", re.I)),
    ("val", re.compile(r"\b(?:val|valid|validation|validating|eval|evaluation|evaluating|test|testing|sanity)\b", re.I)),
    ("train", re.compile(r"\b(?:train|training|epoch)\b", re.I)),
)
_EPOCH_IN_LABEL = re.compile(r"\bepoch\b\s*(?:[:=#]\s*)?(?:\[\s*)?(\d+)(?:\s*/\s*(\d+))?", re.I)
_DIGITS = re.compile(r"\d+")
#: What every built-in pattern needs somewhere in the line (n/total, a percentage, tqdm's elapsed time, a word):
#: one search in C turns away most output (log lines, chatter) before the patterns are tried one by one.
_MAYBE_A_COUNTER = re.compile(r"/\s*[\d?]|\d%|\[\d+:\d\d|step|iter|epoch", re.I)
#: The training loss in a progress line (``loss=0.123``, ``'loss': 0.69``, ``train_loss: 1e-3``); ``\b`` keeps
#: ``val_loss`` out (``_`` is a word character).
_LOSS = re.compile(r"""\b(?:train_)?loss['"]?\s{0,3}[=:]\s{0,3}([-+]?\d{1,12}(?:\.\d{1,12})?(?:[eE][-+]?\d{1,3})?)""", re.I)
_PRINTED_COUNT = re.compile(rf"(\d{{1,{MAX_DIGITS}}})(?:\.(\d{{1,3}}))?([kKMGT]?)")


def _int(text: Optional[str]) -> Optional[int]:
    """A printed count (``45``, ``4.5k``) as an int; None when absent, unknown (``?``) or not a counter."""
    if not text:
        return None
    match = _PRINTED_COUNT.fullmatch(text.strip())
    if match is None:
        return None
    whole, fraction, suffix = match.groups()
    if not suffix:
        return None if fraction else int(whole)  # 0.5 of a batch is not a count
    return int(float(f"{whole}.{fraction or 0}") * _SCALE[suffix])


def _float(text: Optional[str]) -> Optional[Number]:
    """An epoch as Hugging Face prints it (``0.5``, ``1``, ``1.0``): an int where it is whole."""
    if not text or len(text) > MAX_DIGITS:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() else value


def phase_of(label: str) -> Optional[str]:
    """The phase a bar's label names (``"Validation DataLoader 0"`` -> ``"val"``), None when it names none."""
    for phase, words in _PHASES:
        if words.search(label):
            return phase
    return None


def _track(name: str, label: str, total: Optional[int]) -> str:
    """Which counter this is: the pattern, its label with the digits masked (an epoch number, a loss), its total."""
    return f"{name}:{_DIGITS.sub('#', label.strip()[:80])}:{total if total is not None else '?'}"


def _counted(name: str, label: str, count: Optional[int], total: Optional[int]) -> Reading:
    """A bar's reading: ``batch`` of an epoch when its label names the epoch, else ``step``."""
    epoch = _EPOCH_IN_LABEL.search(label)
    phase = phase_of(label)
    if epoch is None:
        return Reading(name, _track(name, label, total), phase, step=count, total=total)
    return Reading(
        name,
        _track(name, label, total),
        phase,
        epoch=_int(epoch.group(1)),
        epochs=_int(epoch.group(2)),
        batch=count,
        batches=total,
        total=total,
    )


# -- the built-in patterns --------------------------------------------------------------------------------------

_BAR = "━─╸╺"  # the bar characters of Ultralytics, rich and Keras 3 (colour tells done from to-do, and is stripped)
_COUNT = r"\d+(?:\.\d+)?[kKMGT]?"  # tqdm's n_fmt, unit-scaled or not
_ULTRALYTICS_EPOCH = re.compile(r"^\s*(\d+)/(\d+)\s+\S+\s")
#: The words a line names its count with. ``batch`` only with a total (``[batch 100/600]``): ``batch 32`` is a size.
#: ``steps`` only where a line or a field starts (DeepSpeed's ``steps: 10 loss: ...``): ``Total optimization steps =
#: 16`` is a plan, not a place.
_STEP_WORDS = r"global[_ ]step|iteration|iter|step|batch(?=\s*(?:[:=#]\s*)?(?:\[\s*)?\d+\s*/\s*\d)|(?:^|(?<=[\]|,] ))steps"
#: A word after a unit's ``/`` or after ``per`` is a rate's unit (``ms/step: 530``, ``time per iter: 12``), not a
#: counter's name; after a number's ``/`` it is the next field (DeepSpeed's ``epoch=0/micro_step=10/global_step=10``).
_NOT_A_RATE = r"(?<![^\W\d_]/)(?<!per )"
#: A number with a fraction or a unit after it is a measure (``avg step: 1.23s``, ``step: 530ms``, ``iter 3 GB``),
#: not a count; the digit excluded first keeps the regex from backing off to a shorter number (``53`` of ``530ms``).
_NOT_A_MEASURE = r"(?!\d|[.,]\d|\s*(?:%|(?:[mµun]?s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?|[kKMGT]i?B|x)\b))"


def _ultralytics(match: re.Match[str]) -> Optional[Reading]:
    label, count, total = match.group("label"), _int(match.group("n")), _int(match.group("total"))
    epoch = _ULTRALYTICS_EPOCH.match(label)
    if epoch is not None:
        track = _track("ultralytics", "epoch", total)
        return Reading("ultralytics", track, "train", _int(epoch.group(1)), _int(epoch.group(2)), count, total, total=total)
    if "Class" in label and "Instances" in label:
        return Reading("ultralytics", _track("ultralytics", "val", total), "val", batch=count, batches=total, total=total)
    return _counted("ultralytics", label, count, total)


def _tqdm(match: re.Match[str]) -> Optional[Reading]:
    return _counted("tqdm", match.group("label") or "", _int(match.group("n")), _int(match.group("total")))


def _rich(match: re.Match[str]) -> Optional[Reading]:
    label = match.string[: match.start()]  # the bar is searched for, not the label: no quadratic scan of a long line
    if match.group("n") is not None:
        return _counted("rich", label, _int(match.group("n")), _int(match.group("total")))
    return _counted("rich-percent", label, _int(match.group("pct")), 100)


def _keras(match: re.Match[str]) -> Optional[Reading]:
    count, total = _int(match.group("n")), _int(match.group("total"))
    return Reading("keras", _track("keras", "", None), batch=count, batches=total, total=total)


def _keras_epoch(match: re.Match[str]) -> Optional[Reading]:
    return Reading("keras", _track("keras", "", None), epoch=_int(match.group("epoch")), epochs=_int(match.group("epochs")))


def _examples(phase: str, name: str = "pytorch-examples") -> Callable[[re.Match[str]], Optional[Reading]]:
    def build(match: re.Match[str]) -> Optional[Reading]:
        epoch = _int(match.groupdict().get("epoch"))
        count, total = _int(match.group("n")), _int(match.group("total"))
        return Reading(name, _track(name, phase, None), phase, epoch, None, count, total, total=total)

    return build


def _hf_log(match: re.Match[str]) -> Optional[Reading]:
    phase = "val" if match.group("eval") else None
    return Reading("hf-log", _track("hf-log", phase or "", None), phase, epoch=_float(match.group("epoch")))


def _step_words(match: re.Match[str]) -> Optional[Reading]:
    before = match.string[: match.start()]
    epoch = _EPOCH_IN_LABEL.search(match.string)
    count, total = _int(match.group("n")), _int(match.group("total"))
    in_epoch = match.group("word").lower() == "batch"  # a batch counts within its epoch; a step, iteration, iter runs on
    return Reading(
        "words",
        _track("words", before, total),  # one line form, one counter: "eval step 3" is not "step 3"
        phase_of(before),
        epoch=_int(epoch.group(1)) if epoch else None,
        epochs=_int(epoch.group(2)) if epoch else None,
        batch=count if in_epoch else None,
        batches=total if in_epoch else None,
        step=None if in_epoch else count,
        total=total,
    )


def _epoch_words(match: re.Match[str]) -> Optional[Reading]:
    phase = phase_of(match.string[: match.start()])
    return Reading("words", _track("words", "epoch", None), phase, _int(match.group("epoch")), _int(match.group("epochs")))


PATTERNS: Tuple[LinePattern, ...] = (
    LinePattern(
        "ultralytics",
        re.compile(rf"^(?P<label>.*?):\s+\d+%\s+[{_BAR}]+\s+(?P<n>\d+)/(?P<total>\d+)(?:\s|$)"),
        _ultralytics,
        "Ultralytics 8 (`yolo train`): its epoch bar, its validation bar, its dataset scans",
        "        1/50      1.2G      1.234      2.345      1.456         16        640: 45% ━━━━━─────── 4886/41163 9.8it/s",
    ),
    LinePattern(
        "tqdm",
        re.compile(rf"^(?:(?P<label>.*?):)?\s*(?:\d+%)?\|[^|]*\|\s*(?P<n>{_COUNT})/(?P<total>{_COUNT}|\?)\s*\["),
        _tqdm,
        "tqdm, so Lightning's TQDMProgressBar and Hugging Face Trainer's bars",
        "Epoch 3:  45%|####5     | 45/100 [00:04<00:05, 9.80it/s, loss=0.1]",
    ),
    LinePattern(
        "tqdm",
        re.compile(rf"^(?:(?P<label>.*?):)?\s*(?P<n>{_COUNT})(?P<total>)[a-zA-Z/]*\s\[\d+:\d\d"),
        _tqdm,
        "tqdm over an iterable of unknown length",
        "stream: 45it [00:04, 9.80it/s]",
    ),
    LinePattern(
        "rich",
        re.compile(rf"(?<![{_BAR}])[{_BAR}]{{3,}}\s+(?:(?P<n>\d+)/(?P<total>\d+)|(?P<pct>\d+)%)(?:\s|$)"),
        _rich,
        "rich progress bars (n/total, else the percentage), so Lightning's RichProgressBar",
        "Epoch 0/1  ━━━━━━━━━━━━━━━━━━━━━━━━ 4/20 0:00:00 • 0:00:01 499.16it/s loss: 0.175",
    ),
    LinePattern(
        "keras",
        re.compile(rf"^\s*(?P<n>\d+)/(?P<total>\d+)\s+(?:[{_BAR}]{{2,}}|\[[=>.]+\])"),
        _keras,
        "Keras 3 and 2: fit's step lines",
        "12/100 ━━━━━━━━━━━━━━━━━━━━ 1s 10ms/step - loss: 0.1234",
    ),
    LinePattern(
        "keras",
        re.compile(r"^Epoch (?P<epoch>\d+)/(?P<epochs>\d+)\s*$"),
        _keras_epoch,
        "Keras: fit's epoch line (its epoch carries into the step lines)",
        "Epoch 3/10",
    ),
    LinePattern(
        "pytorch-examples",
        re.compile(r"^Train Epoch: (?P<epoch>\d+) \[\s*(?P<n>\d+)/(?P<total>\d+)"),
        _examples("train"),
        "pytorch/examples mnist and the many scripts that copied it",
        "Train Epoch: 1 [640/60000 (1%)]\tLoss: 0.301384",
    ),
    LinePattern(
        "pytorch-examples",
        re.compile(r"^Epoch: \[(?P<epoch>\d+)\]\[\s*(?P<n>\d+)/(?P<total>\d+)\]"),
        _examples("train"),
        "pytorch/examples imagenet (ProgressMeter)",
        "Epoch: [0][ 10/5005]\tTime  0.123 ( 0.456)\tLoss 6.9078e+00 (6.9101e+00)",
    ),
    LinePattern(
        "pytorch-examples",
        re.compile(r"^Test: \[\s*(?P<n>\d+)/(?P<total>\d+)\]"),
        _examples("val"),
        "pytorch/examples imagenet, validation",
        "Test: [ 10/196]\tTime  0.050 ( 0.061)\tLoss 1.2345e+00 (1.3456e+00)",
    ),
    LinePattern(
        "timm",
        re.compile(r"^Train: (?P<epoch>\d+) \[\s*(?P<n>\d+)/(?P<total>\d+)"),
        _examples("train", "timm"),
        "timm's train.py (its validation lines are imagenet's Test: form)",
        "Train: 3 [ 100/1251 (  8%)]  Loss: 6.912 (6.925)  Time: 0.412s,  621.36/s  LR: 1.000e-04",
    ),
    LinePattern(
        "hf-log",
        re.compile(r"^\{'(?P<eval>eval_)?.*'epoch': '?(?P<epoch>\d+(?:\.\d+)?)'?\s*[,}]"),
        _hf_log,
        "Hugging Face Trainer's log lines (4.x numbers, 5.x quoted)",
        "{'loss': 0.6936, 'grad_norm': 0.4041, 'learning_rate': 4.063e-05, 'epoch': 0.5}",
    ),
    LinePattern(
        "words",
        re.compile(
            rf"{_NOT_A_RATE}\b(?P<word>{_STEP_WORDS})\b\s*(?:[:=#]\s*)?(?:\[\s*)?(?P<n>\d+){_NOT_A_MEASURE}"
            r"(?:\s*/\s*(?P<total>\d+))?",
            re.I,
        ),
        _step_words,
        "a line naming its step: global_step, iteration, iter or step, then the number",
        "step=1200 loss=0.173",
    ),
    LinePattern(
        "words",
        re.compile(
            rf"{_NOT_A_RATE}\bepoch\b\s*(?:[:=#]\s*)?(?:\[\s*)?(?P<epoch>\d+){_NOT_A_MEASURE}(?:\s*/\s*(?P<epochs>\d+))?", re.I
        ),
        _epoch_words,
        "a line naming its epoch, and no step",
        "=> epoch 3 done, val mAP 0.41",
    ),
)

#: The sentence the supervisor's start-up notice and give-up messages end with when an attempt showed neither
#: beats nor a counter.
HOW_TO_GIVE_PROGRESS = (
    "To give progress, print a counter trainbox reads (tqdm, rich, Ultralytics, Lightning, Hugging Face, Keras or "
    "pytorch/examples bars; 'step N', 'iter N', 'global_step N' lines), pass --progress-pattern REGEX with a "
    "(?P<step>...), (?P<batch>...) or (?P<epoch>...) group, or call trainbox.heartbeat.beat() "
    "(docs/your-own-script.md)."
)


def loss_in(line: str) -> Optional[float]:
    """The training loss a progress line shows, finite: a bar's postfix (``loss=0.123``), a log dict's
    (``'loss': 0.69``), Keras' ``loss: 0.1``; not another loss (``val_loss``); None without one."""
    found = _LOSS.search(line[:MAX_READ_CHARS])
    if found is None:
        return None
    value = float(found.group(1))
    return value if math.isfinite(value) else None


def describe(patterns: Sequence[LinePattern] = PATTERNS) -> str:
    """What is recognised, one pattern a line with a sample (for the docs and ``--help``)."""
    return "\n".join(f"{p.name}: {p.source}, e.g. `{p.sample.strip()}`" for p in patterns)


def read(line: str, patterns: Sequence[LinePattern] = PATTERNS) -> Optional[Reading]:
    """The progress one display line shows, by the first of ``patterns`` that reads a counter in it; else None."""
    line = line[:MAX_READ_CHARS]
    maybe = _MAYBE_A_COUNTER.search(line) is not None
    for pattern in patterns:
        if pattern.screened and not maybe:
            continue
        match = pattern.regex.search(line)
        reading = pattern.build(match) if match is not None else None
        if reading is not None and (reading.epoch, reading.batch, reading.step) != (None, None, None):
            return reading
    return None


# -- a user's pattern -------------------------------------------------------------------------------------------


def user_pattern(text: str) -> LinePattern:
    """``--progress-pattern REGEX`` as a pattern to read lines with; ProgressPatternError when it cannot be one."""
    problem = pattern_problem(text)
    if problem is not None:
        raise ProgressPatternError(f"{PATTERN_FLAG} {problem}")
    return LinePattern("user", re.compile(text), _user_reading, "your --progress-pattern", text, screened=False)


def _user_reading(match: re.Match[str]) -> Optional[Reading]:
    groups = match.groupdict()
    step, batch, epoch = (_int(groups.get(name)) for name in COUNTER_GROUPS)
    total = _int(groups.get("total"))
    phase_text = (groups.get("phase") or "").strip()
    phase = (phase_of(phase_text) or phase_text.lower()[:MAX_PHASE_CHARS]) if phase_text else None
    return Reading(
        "user",
        _track("user", match.re.pattern[:40], total),
        phase,
        epoch,
        total if epoch is not None and batch is None and step is None else None,
        batch,
        total if batch is not None else None,
        step,
        total if batch is not None or step is not None else None,
    )


def with_user_patterns(texts: Sequence[str]) -> Tuple[LinePattern, ...]:
    """The patterns a run reads: the user's (checked, in the order given) before the built-ins."""
    return tuple(user_pattern(text) for text in texts) + PATTERNS


# -- the stateful reader ----------------------------------------------------------------------------------------


class OutputProgress:
    """Reads every display state of one attempt and says when a reading was progress (see the module docstring).

    Thread-safe: the output reader thread calls :meth:`observe`; the supervisor loop calls :meth:`latest`.
    """

    def __init__(self, patterns: Sequence[LinePattern] = PATTERNS, floor_s: float = 0.0) -> None:
        self._patterns = tuple(patterns)
        self._counters = Counters(floor_s)
        self._epoch: Tuple[Optional[Number], Optional[int]] = (None, None)
        self._lock = threading.Lock()
        self._beat: Optional[Dict[str, Any]] = None
        self._at: Optional[float] = None
        #: Each counter's first places, line by line (where the attempt began: trainbox.supervise.resume.redone).
        self._starts = Starts()
        #: Lines that showed a counter, advancing or not (none yet: the start-up line says how to give one).
        self.recognised = 0
        #: Readings that were progress.
        self.advances = 0

    def observe(self, line: str, now: float) -> Optional[Dict[str, Any]]:
        """The beat when ``line`` (read at ``now``, any clock) was progress; None otherwise (a redraw, a repeat, a copy
        behind, chatter: :mod:`trainbox.supervise.output.counters`)."""
        reading = read(line, self._patterns)
        if reading is None:
            return None
        with self._lock:
            self.recognised += 1
            reading = self._in_context(reading)
            self._starts.take(reading)
            beat = self._counters.take(reading, now)
            if beat is None:
                return None
            loss = loss_in(line)
            if loss is not None:
                beat["loss"] = loss  # kept in progress.jsonl's samples: the report draws it
            self._beat, self._at = beat, now
            self.advances += 1
            return dict(beat)

    def notices(self) -> List[str]:
        """Lines to say once about how this output is judged (each is given once)."""
        with self._lock:
            lines, self._counters.notices = self._counters.notices, []
            return lines

    def latest(self) -> Tuple[Optional[Dict[str, Any]], Optional[float]]:
        """The last beat that was progress and when it was read (None, None before the first)."""
        with self._lock:
            return (dict(self._beat) if self._beat is not None else None), self._at

    def starts(self, counter: Optional[str]) -> List[Dict[str, Any]]:
        """The first places of ``counter`` (None: the main counter, else the first one read), as beats."""
        with self._lock:
            first = next(iter(self._starts.counters()), "")
            main = self._counters.main.key if self._counters.main is not None else first
            return self._starts.of(counter or main)

    def counters(self) -> List[str]:
        """Every counter this output showed, the first read first."""
        with self._lock:
            return self._starts.counters()

    def _in_context(self, reading: Reading) -> Reading:
        """A batch with no epoch takes the last epoch read (Keras' epoch line, Ultralytics' epoch bar)."""
        if reading.epoch is not None:
            self._epoch = (reading.epoch, reading.epochs)
        elif reading.batch is not None and self._epoch[0] is not None:
            reading = replace(reading, epoch=self._epoch[0], epochs=self._epoch[1])
        return reading
