"""Five training programs nobody here wrote, as the supervisor tests and bench/resume.py run them (one place).

The programs are tests/fixtures/programs/ (its README says where each comes from and what, if anything, was
changed) and Ultralytics' own ``yolo train``. Each is tiny (a few seconds an epoch on a busy CPU), trains on data
generated here, builds its model from a config, and never reaches the network. A :class:`Program` knows its command,
where its checkpoints go, and where the faults are placed:

* ``hang``: trainbox.faults' ``output`` site, after the program's first checkpoint and before its second, so that
  a restart that resumes loses less than one checkpoint interval;
* ``save``: the ``checkpoint`` site, the text a checkpoint write's path must contain (``TRAIN_FAULT_CHECKPOINT``),
  so that ``sigkill@checkpoint,saves>=N`` kills the program while it writes its (N+1)-th checkpoint.

:func:`injected` is the environment that reaches an unmodified program (tests/fixtures/uninstrumented).
"""

from __future__ import annotations

import os
import pickle
import re
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from tests.paths import FIXTURES

PROGRAMS = FIXTURES / "programs"
INJECTOR = FIXTURES / "uninstrumented"
PYTHON = sys.executable


def yolo_command(work: Path) -> List[str]:
    """``yolo train`` from yolov8n.yaml, 3 epochs of the demo data (32 + 8 images at 96 px), in ``work/exp``."""
    from trainbox.yolo.demo_data import write_demo_dataset

    data = write_demo_dataset(work / "data", 32, 8, 96)
    yolo = str(Path(sys.executable).parent / "yolo")
    tiny = ["imgsz=64", "batch=8", "device=cpu", "plots=False", "workers=0", "amp=False"]
    return [yolo, "train", "model=yolov8n.yaml", f"data={data}", "epochs=3", *tiny, f"project={work}", "name=exp"]


def mnist_command(work: Path) -> List[str]:
    """pytorch/examples' mnist, 3 epochs of 10 batches, a checkpoint per epoch in ``work/ckpt``."""
    sizes = ["--train-size", "320", "--test-size", "100", "--batch-size", "32", "--log-interval", "1"]
    mnist = str(PROGRAMS / "pytorch_examples" / "mnist_main.py")
    return [PYTHON, mnist, "--epochs", "3", *sizes, "--checkpoint-dir", str(work / "ckpt")]


def hf_command(work: Path) -> List[str]:
    """The Trainer script, 40 steps of a tiny GPT-2, ``checkpoint-N`` every 10 steps in ``work/out``."""
    steps = ["--max_steps", "40", "--save_steps", "10", "--logging_steps", "1", "--per_device_train_batch_size", "8"]
    return [PYTHON, str(PROGRAMS / "hf_gpt2_trainer.py"), "--output_dir", str(work / "out"), *steps, "--report_to", "none"]


def hf_argparse_command(work: Path) -> List[str]:
    """The Trainer script with its own argparse, 20 steps, ``checkpoint-N`` every 10 steps in ``work/out``."""
    return [PYTHON, str(PROGRAMS / "hf_argparse_trainer.py"), "--output_dir", str(work / "out"), "--max_steps", "20"]


def lightning_command(work: Path) -> List[str]:
    """The Lightning fit, 4 epochs of 20 steps, a ModelCheckpoint every epoch in ``checkpoints/`` (run in ``work``)."""
    fit = str(FIXTURES / "output" / "programs" / "lightning_fit.py")
    return [PYTHON, fit, "--tqdm", "--epochs", "4", "--delay", "0.03", "--checkpoint_dir", "checkpoints"]


#: nanoGPT's train.py, as small as it goes: 2 layers of 32, 40 iterations, an evaluation and ``ckpt.pt`` every 10.
NANOGPT_CONFIG = {
    "dataset": "tiny",
    "device": "cpu",
    "compile": False,
    "dtype": "float32",
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 32,
    "block_size": 32,
    "batch_size": 8,
    "gradient_accumulation_steps": 1,
    "max_iters": 40,
    "lr_decay_iters": 40,
    "warmup_iters": 5,
    "eval_interval": 10,
    "eval_iters": 5,
}
#: Tokens of the generated dataset (nanoGPT's ``prepare.py`` writes train.bin, val.bin and meta.pkl as these are).
NANOGPT_VOCAB, NANOGPT_TOKENS = 64, 20000


def nanogpt_command(work: Path) -> List[str]:
    """nanoGPT's own train.py, run in ``work`` (it reads ``configurator.py`` and ``data/`` from there)."""
    import numpy as np

    data = work / "data" / "tiny"
    data.mkdir(parents=True, exist_ok=True)
    tokens = np.random.default_rng(0).integers(0, NANOGPT_VOCAB, NANOGPT_TOKENS, dtype=np.uint16)
    tokens[: NANOGPT_TOKENS * 9 // 10].tofile(data / "train.bin")
    tokens[NANOGPT_TOKENS * 9 // 10 :].tofile(data / "val.bin")
    (data / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": NANOGPT_VOCAB}))
    for name in ("train.py", "model.py", "configurator.py"):
        link = work / name
        if not link.exists():
            link.symlink_to(PROGRAMS / "nanogpt" / name)
    config = [f"--{key}={value}" for key, value in NANOGPT_CONFIG.items()]
    return [PYTHON, "train.py", *config, f"--out_dir={work / 'out'}"]


def _first(pattern: str, log: str) -> Optional[str]:
    found = re.search(pattern, log, re.M)
    return found.group(1) if found else None


def yolo_resumed(log: str) -> Optional[int]:
    """Epochs done in the checkpoint Ultralytics resumed from ("Resuming training ... from epoch N", 1-based)."""
    epoch = _first(r"Resuming training .* from epoch (\d+) to", log)
    return int(epoch) - 1 if epoch else None


def mnist_resumed(log: str) -> Optional[int]:
    epoch = _first(r"^Resumed from .* \(epoch (\d+)\)", log)
    return int(epoch) if epoch else None


#: The Trainer's steps per epoch (256 sequences, batches of 8): its log dicts give the epoch, a fraction of this.
HF_STEPS_PER_EPOCH = 32


def hf_resumed(log: str) -> Optional[int]:
    """Steps done before this attempt's first log dict (its ``epoch`` is the step's, in epochs, to 4 figures)."""
    epoch = _first(r"\{'loss'.*'epoch': '([\d.e-]+)'", log)
    done = round(float(epoch) * HF_STEPS_PER_EPOCH) - 1 if epoch else 0
    return done or None


def lightning_resumed(log: str) -> Optional[int]:
    """The epoch Lightning's bar shows first (0-based: the epochs done before it), None for epoch 0 (a fresh fit)."""
    epoch = _first(r"Epoch (\d+):", log)
    return int(epoch) or None if epoch else None


def nanogpt_resumed(log: str) -> Optional[int]:
    """The first iteration nanoGPT prints after "Resuming training from" (the checkpoint's ``iter_num``)."""
    return int(_first(r"^iter (\d+):", log) or 0) if "Resuming training from" in log else None


@dataclass(frozen=True)
class Program:
    """One real program: how to start it, where it checkpoints, where its faults go."""

    name: str
    command: Callable[[Path], List[str]]  # writes its data into the work folder, returns the command
    unit: str  # what its checkpoint interval counts: "epoch" or "step"
    interval: int  # a checkpoint every ``interval`` units
    hang_text: str  # TRAIN_FAULT_TEXT of the hang after the first checkpoint
    hang_seen: int  # the hang comes at the write after the ``hang_seen``-th that showed ``hang_text``
    hung_by: int  # units begun when the hang comes (an upper bound of the work done): lost work is up to here
    save_path: str  # TRAIN_FAULT_CHECKPOINT: the checkpoint writes the ``checkpoint`` site counts
    resumed: Callable[[str], Optional[int]]  # from an attempt's output: units done in what it resumed from, or None
    kill_saves: int  # the resumed attempt is killed writing its (kill_saves+1)-th checkpoint
    after_kill: Optional[int]  # units in the newest checkpoint left whole by that kill (None: none is left)
    #: Units in the newest checkpoint a fresh attempt leaves whole when it is killed writing its (k+1)-th, None for none.
    whole_after: Callable[[int], Optional[int]]
    env: Dict[str, str] = field(default_factory=dict)
    #: What ``supervise`` is told for a program it has no built-in way to resume.
    options: Tuple[str, ...] = ()
    #: Checkpoints of other runs beside this one's (a sweep's ``exp_lr2``, a run of the same name in ``exp-2``),
    #: relative to the work folder: :func:`plant_others` writes them as written while this run goes on.
    others: Tuple[str, ...] = ()

    def hang(self) -> Dict[str, str]:
        """The hang after the first checkpoint, in attempt 0 only."""
        return {"TRAIN_FAULT": f"sleep@output,attempt=0,seen>={self.hang_seen}", "TRAIN_FAULT_TEXT": self.hang_text}

    def killed_saving(self, saves: int, attempt: int = 0) -> Dict[str, str]:
        """A SIGKILL in attempt ``attempt`` with its (``saves``+1)-th checkpoint half written."""
        fault = f"sigkill@checkpoint,attempt={attempt},saves>={saves}"
        return {"TRAIN_FAULT": fault, "TRAIN_FAULT_CHECKPOINT": self.save_path}

    def hang_then_kill(self) -> Dict[str, str]:
        """The hang in attempt 0, then, in the attempt that resumes, a SIGKILL during its ``kill_saves``-th save."""
        hang, kill = self.hang(), self.killed_saving(self.kill_saves, attempt=1)
        return {**hang, **kill, "TRAIN_FAULT": f"{hang['TRAIN_FAULT']};{kill['TRAIN_FAULT']}"}


def _none(saves: int) -> Optional[int]:
    """A program that rewrites its one checkpoint in place: a kill during any save leaves none whole."""
    return None


def _one_a_save(saves: int) -> Optional[int]:
    """A checkpoint of its own per epoch (mnist's epoch-N.pt): killed in the (k+1)-th, k epochs stay."""
    return saves or None


def _ten_a_save(saves: int) -> Optional[int]:
    """A checkpoint folder of its own every 10 steps (the Trainer's checkpoint-N): killed in the (k+1)-th, 10k steps."""
    return 10 * saves or None


#: mnist is no program trainbox knows: it is told how this one resumes and where its checkpoints are.
MNIST_OPTIONS = ("--resume-args", "--resume {checkpoint}", "--checkpoint", "ckpt/epoch-*.pt")
#: The Trainer script needs nothing from the hub: it is told so.
OFFLINE_HUB = {"HF_HUB_OFFLINE": "1"}


def _lightning_whole(saves: int) -> Optional[int]:
    """Two saves an epoch, ``epoch=N-step=M.ckpt`` then ``last.ckpt``: killed in the first, the epoch before stays;
    killed in the second, the epoch's own first file is whole."""
    return (saves // 2 + saves % 2) or None


PROGRAM_LIST = [
    # Ultralytics draws "2/3" in its bar's first column in epoch 2, after epoch 1's last.pt. It rewrites last.pt in
    # place: killed writing epoch 2's, it has no whole checkpoint left.
    # Beside it, a sweep's exp_lr2 and another run of the same name (exp-2) write their own last.pt.
    Program(
        "yolo",
        yolo_command,
        "epoch",
        1,
        "2/3  ",
        1,
        2,
        "last.pt",
        yolo_resumed,
        0,
        None,
        _none,
        others=("exp_lr2/weights/last.pt", "exp-2/weights/last.pt"),
    ),
    # mnist's 5th line of epoch 2 (its checkpoint epoch-1.pt written at the end of epoch 1); epoch-2.pt half written
    # leaves epoch-1.pt.
    Program(
        "mnist",
        mnist_command,
        "epoch",
        1,
        "Train Epoch: 2 [",
        5,
        2,
        "epoch-",
        mnist_resumed,
        0,
        1,
        _one_a_save,
        options=MNIST_OPTIONS,
    ),
    # The Trainer's log dict of step 15 (one a step): checkpoint-10 is written. Killed writing checkpoint-20's
    # optimizer.pt, checkpoint-20 has no trainer_state.json.
    Program("hf", hf_command, "step", 10, "{'loss'", 15, 15, "optimizer.pt", hf_resumed, 0, 10, _ten_a_save, env=OFFLINE_HUB),
    # Lightning's bar in epoch 2 (0-based, as Lightning counts: the third), after the checkpoints of epochs 0 and 1.
    # Its saves are atomic (a buffer, then a file renamed into place): killed serializing epoch 2's, epoch 1's stay.
    Program("lightning", lightning_command, "epoch", 1, "Epoch 2:", 3, 3, "", lightning_resumed, 0, 2, _lightning_whole),
    # nanoGPT's line of iteration 15: ckpt.pt of iteration 10 is written. Resumed, it saves iteration 10 again,
    # then 20, in place: killed writing that one, it has no whole checkpoint left.
    Program("nanogpt", nanogpt_command, "step", 10, "iter 15:", 1, 15, "ckpt.pt", nanogpt_resumed, 1, None, _none),
]
PROGRAMS_BY_NAME = {program.name: program for program in PROGRAM_LIST}


#: ``supervise``'s options for every program. Their stretches without a counter (imports: 15-60 s on 2 busy cores;
#: Ultralytics' final validation) are judged by the long budgets; a hung program's tree is idle, and the idle rule
#: finds it in 10 s.
OPTIONS = ("--startup-timeout", "300", "--stall-timeout", "120", "--idle-timeout", "10", "--grace", "5", "--backoff", "0.5")


def supervise_args(program: Program, work: Path) -> List[str]:
    """``trainbox supervise`` of ``program`` (its data written into ``work``), its run directory ``work/run``; the
    command runs in ``work``, where the program's relative paths (Lightning's ``checkpoints/``) land."""
    command = program.command(work)
    return ["supervise", "--run-dir", str(work / "run"), *OPTIONS, *program.options, "--quiet", "--", *command]


def plant_others(program: Program, work: Path) -> List[Path]:
    """Whole checkpoints of other runs where ``program.others`` says, newer than anything this run will write (as
    if written while it runs): a restart that took one would go on with another run's work."""
    later = time.time() + 3600
    planted = []
    for relative in program.others:
        path = work / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(path, "w") as archive:  # laid out as torch.save writes: a whole zip archive
            archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        os.utime(path, (later, later))
        planted.append(path)
    return planted


def injected(env: Dict[str, str]) -> Dict[str, str]:
    """``env`` with trainbox.faults' sitecustomize first on PYTHONPATH (this checkout's trainbox after it)."""
    paths = [str(INJECTOR), os.environ.get("PYTHONPATH", "")]
    return {**env, "PYTHONPATH": os.pathsep.join(path for path in paths if path)}
