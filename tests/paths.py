"""Where the suite finds the repository and its recorded fixtures: one place, so a test can move between folders."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
