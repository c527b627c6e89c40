"""trainbox.errors: the one set of exit statuses and the one error line, as the docs state them (docs/contract.md)."""

from __future__ import annotations

import re
import signal

from tests.paths import REPO
from trainbox import errors
from trainbox.errors import ExitCode, UserError

CONTRACT = REPO / "docs" / "contract.md"


def test_the_documented_exit_statuses_are_exit_code() -> None:
    text = " ".join(CONTRACT.read_text().split())
    sentence = re.search(r"\*\*Exit status\*\* \(`trainbox.errors.ExitCode`, the one definition\): ([^*]+?)\. Every", text)
    assert sentence, "the contract's exit status sentence names ExitCode"
    documented = [int(n) for n in re.findall(r"(?:^|; )(\d+) ", sentence.group(1))]
    assert documented == [int(code) for code in ExitCode]
    assert "128+N stopped by signal N" in sentence.group(1)
    assert ExitCode.for_signal(signal.SIGINT) == 130 and ExitCode.for_signal(signal.SIGTERM) == 143


def test_report_writes_one_line_and_returns_the_code(capsys) -> None:
    assert errors.report(UserError("data=x.yaml: no such file")) == ExitCode.USAGE
    assert capsys.readouterr().err == "trainbox: error: data=x.yaml: no such file\n"
    assert errors.report(errors.TrainboxError("stuck", ExitCode.MISCONFIGURED)) == 3
