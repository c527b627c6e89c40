"""Secrets out of what a notifier leaves behind: its failure lines are written down, its secrets must not be.

A notifier posts to a webhook whose URL *is* the secret (Slack's ``hooks.slack.com/services/T../B../XXXX``,
a Discord or Teams webhook, a query string's ``?token=``), and a failing one prints it: requests' ``HTTPError:
404 Client Error: Not Found for url: https://hooks.slack.com/services/.../SECRETtoken123``. That last line is
quoted in the ``notify_failed`` event (``events.jsonl``, read back by ``status`` and the report, kept for
years, attached to bug reports) and said on stderr (CI logs). So everything recorded from a notifier goes
through :func:`redact` first:

* a URL keeps its scheme and host (which service failed is worth knowing) and loses its user and password,
  path, query and fragment;
* ``token=...``, ``password: ...``, ``api_key=...`` and the like keep their name and lose their value;
  ``Bearer ...`` and ``Basic ...`` lose the credentials;
* a word that looks like a token loses itself: a known prefix (``xoxb-``, ``ghp_``, ``sk-``, ``AKIA``...),
  32 or more hex digits, or 20 or more characters that mix upper case, lower case and digits.

Over-redacting a harmless word costs a little reading; a leaked secret costs a rotated key. A program's own
path (``/usr/local/bin/notify-2024``) has no scheme and no mixed case, and stays.
"""

from __future__ import annotations

import re

#: What a secret is replaced by.
REDACTED = "[redacted]"

#: A URL: scheme, then user information, host and whatever follows it up to the next blank or quote.
_URL = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?:[^\s/?#@\"'<>]*@)?(?P<host>[^\s/?#\"'<>]*)(?P<rest>[^\s\"'<>]*)")
#: A named secret and its value: ``token=abc``, ``"password": "abc"``, ``api-key: abc``.
_NAMED = re.compile(
    r"(?i)(?P<name>\b(?:[a-z0-9]+[_-])*(?:token|secret|password|passwd|pwd|api[_-]?key|access[_-]?key|"
    r"private[_-]?key|credentials?|signature|sig|auth(?:orization)?)\b[\"']?\s*[=:]\s*)(?P<value>\"[^\"]*\"|'[^']*'|[^\s&,;]+)"
)
#: HTTP credentials after their scheme word.
_SCHEME_CREDENTIALS = re.compile(r"(?i)\b(?P<name>bearer|basic|token)\s+(?P<value>[A-Za-z0-9._~+/=-]{8,})")
#: A word of the characters tokens are made of (not ``/`` or ``.``: a path or a host name is several words).
_WORD = re.compile(r"[A-Za-z0-9_+=-]{16,}")
#: Prefixes that providers give their tokens (Slack, GitHub, OpenAI-style, AWS, GitLab, Google).
_TOKEN_PREFIX = re.compile(r"(xox[abprs]-|xapp-|ghp_|gho_|ghs_|ghu_|github_pat_|glpat-|sk-|AKIA|AIza)")
#: A long run of hex digits (a digest, a key).
_HEX = re.compile(r"[0-9a-fA-F]{32,}")
#: The shortest word taken for a token by its mix of characters alone.
MIXED_TOKEN_CHARS = 20


def _url(found: re.Match[str]) -> str:
    rest = f"/{REDACTED}" if found.group("rest") else ""
    return f"{found.group('scheme')}{found.group('host')}{rest}"


def _looks_like_token(word: str) -> bool:
    if _TOKEN_PREFIX.match(word) or _HEX.search(word):
        return True
    mixed = any(c.isupper() for c in word) and any(c.islower() for c in word) and any(c.isdigit() for c in word)
    return mixed and len(word) >= MIXED_TOKEN_CHARS


def _word(found: re.Match[str]) -> str:
    word = found.group(0)
    return REDACTED if REDACTED not in word and _looks_like_token(word) else word


def redact(line: str) -> str:
    """``line`` without the secrets it may hold (see the module docstring); the rest as it was."""
    line = _URL.sub(_url, line)
    line = _SCHEME_CREDENTIALS.sub(lambda found: f"{found.group('name')} {REDACTED}", line)
    line = _NAMED.sub(lambda found: f"{found.group('name')}{REDACTED}", line)
    return _WORD.sub(_word, line)
