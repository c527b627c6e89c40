"""Secrets out of what a notifier leaves behind: its failure lines are written down, its secrets must not be.

A notifier posts to a webhook whose URL *is* the secret (Slack's ``hooks.slack.com/services/T../B../XXXX``,
a Discord or Teams webhook, a query string's ``?token=``), and a failing one prints it: requests' ``HTTPError:
404 Client Error: Not Found for url: https://hooks.slack.com/services/.../SECRETtoken123``. That last line is
quoted in the ``notify_failed`` event (``events.jsonl``, read back by ``status`` and the report, kept for
years, attached to bug reports) and said on stderr (CI logs). So everything recorded from a notifier goes
through :func:`redact` first, and is cut to length only after (:func:`quote`): a cut first would leave a token's
first characters, no longer long enough to look like one.

* a URL keeps its scheme and host (which service failed is worth knowing) and loses its user and password
  (a password may hold ``@``: the user information runs to the last ``@`` before the host), path, query and
  fragment; a percent-encoded URL (``https%3A%2F%2Fhooks.slack.com%2F...``, a webhook passed in a query string)
  is decoded and said the same way;
* a key whose name ends in ``token``, ``secret``, ``key``, ``password``, ``auth`` or ``cookie`` (and a few
  others: :data:`SECRET_NAMES`) in any case style (``accessToken``, ``ACCESS_TOKEN``, ``access-token``,
  ``"accessToken": "..."``) keeps its name and loses its value: after ``=`` or ``:``, and after a command-line
  option's blank (``--password x``); a cookie's value is the rest of its header (``Cookie: a=1; b=2``);
  ``Bearer ...`` and ``Basic ...`` lose the credentials;
* a word that looks like a token loses itself: a known prefix (``xoxb-``, ``ghp_``, ``sk-``, ``AKIA``...),
  32 or more hex digits, or 20 or more characters that mix upper case, lower case and digits.

Every pattern runs in time linear in the line (a notifier may print one megabyte line): no quantifier nests in
another, a name can only start where a word starts (a lookbehind), and each unbounded run either ends in a match
that consumes it or cannot begin again inside what it scanned.

Over-redacting a harmless word costs a little reading (``monkey=3`` loses its 3); a leaked secret costs a rotated
key. A program's own path (``/usr/local/bin/notify-2024``) has no scheme and no mixed case, and stays.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

#: What a secret is replaced by.
REDACTED = "[redacted]"

#: The ends of a key's name that make its value a secret, whatever comes before (``access_``, ``X-Api-``).
SECRET_NAMES = "token|secret|key|password|passwd|pwd|auth|authorization|cookie|credential|credentials|signature|sig"
#: The longest scheme taken for one (``git+ssh``): bounded, so a long word without ``://`` is scanned once.
SCHEME_CHARS = 32
_SCHEME = rf"\b[A-Za-z][A-Za-z0-9+.-]{{0,{SCHEME_CHARS - 1}}}"
#: A URL: scheme, then user information (up to the last ``@`` before the path), host, and what follows up to a
#: blank or a quote.
_URL = re.compile(rf"(?P<scheme>{_SCHEME}://)(?:[^\s/?#\"'<>]*@)?(?P<host>[^\s/?#@\"'<>]*)(?P<rest>[^\s\"'<>]*)")
#: A percent-encoded URL (``https%3A%2F%2F...``), up to a blank, a quote or the next query parameter.
_ENCODED_URL = re.compile(rf"(?i)(?P<scheme>{_SCHEME})%3A%2F%2F(?P<body>[^\s\"'<>&]*)")
#: A key's name: a word of letters, digits and ``_ - .`` whose end is one of :data:`SECRET_NAMES`. It starts where
#: a word starts (the lookbehind): tried once per word, not at each of its characters.
_NAME = rf"(?<![A-Za-z0-9_.-])[A-Za-z0-9_.-]*?(?:{SECRET_NAMES})"
#: A value: quoted, or a run of characters up to a blank or a separator.
_VALUE = r"\"[^\"]*\"|'[^']*'|[^\s&,;]+"
#: A named secret and its value: ``token=abc``, ``"accessToken": "abc"``, ``api-key: abc``.
_NAMED = re.compile(rf"(?i)(?P<name>{_NAME}[\"']?[ \t]*[=:][ \t]*)(?P<value>{_VALUE})")
#: A command-line option and its value: ``--password x``, ``--api-key x`` (``--api-key=x`` is :data:`_NAMED`'s).
_OPTION = re.compile(rf"(?i)(?P<name>(?<![A-Za-z0-9_.-])--?[A-Za-z0-9_.-]*?(?:{SECRET_NAMES})[ \t]+)(?P<value>{_VALUE})")
#: A cookie header's value: all of it, each of its ``name=value`` pairs (``Cookie: a=1; b=2``, ``Set-Cookie:``).
_COOKIE = re.compile(
    r"(?i)(?P<name>(?<![A-Za-z0-9_.-])(?:set-)?cookie[\"']?[ \t]*:[ \t]*)(?P<value>\"[^\"]*\"|'[^']*'|[^\"'\r\n]+)"
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


def _encoded_url(found: re.Match[str]) -> str:
    decoded = f"{found.group('scheme')}://{unquote(found.group('body'))}"
    return _URL.sub(_url, decoded) if _URL.fullmatch(decoded) else f"{found.group('scheme')}://{REDACTED}"


def _looks_like_token(word: str) -> bool:
    if _TOKEN_PREFIX.match(word) or _HEX.search(word):
        return True
    mixed = any(c.isupper() for c in word) and any(c.islower() for c in word) and any(c.isdigit() for c in word)
    return mixed and len(word) >= MIXED_TOKEN_CHARS


def _word(found: re.Match[str]) -> str:
    word = found.group(0)
    return REDACTED if REDACTED not in word and _looks_like_token(word) else word


def _named(found: re.Match[str]) -> str:
    return f"{found.group('name')}{REDACTED}"


def redact(line: str) -> str:
    """``line`` without the secrets it may hold (see the module docstring); the rest as it was."""
    line = _ENCODED_URL.sub(_encoded_url, line)
    line = _URL.sub(_url, line)
    line = _COOKIE.sub(_named, line)
    line = _SCHEME_CREDENTIALS.sub(lambda found: f"{found.group('name')} {REDACTED}", line)
    line = _NAMED.sub(_named, line)
    line = _OPTION.sub(_named, line)
    return _WORD.sub(_word, line)


def quote(text: str, most: int) -> str:
    """``text`` redacted, then cut to ``most`` characters: the cut never keeps part of a secret."""
    return redact(text)[:most]
