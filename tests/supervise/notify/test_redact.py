"""What a notifier's failure line keeps and loses (trainbox.supervise.notify.redact): examples, then any secret."""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from trainbox.supervise.notify.redact import REDACTED, redact

#: Text around a secret that cannot hold it: the secrets below all hold a "Z", this text none.
AROUND = st.text(alphabet=st.characters(blacklist_characters="Z", blacklist_categories=("Cs",)), max_size=40)
SECRET = st.text(alphabet=string.ascii_letters + string.digits + "_-", min_size=1, max_size=40).map(lambda s: "Z" + s)
HOST = st.from_regex(r"[a-y0-9]{1,12}(\.[a-y]{2,6}){0,2}", fullmatch=True)


def test_urls_keep_their_host_and_lose_everything_else() -> None:
    line = "HTTPError: 404 for url: https://hooks.slack.com/services/T000/B000/SECRETtoken123 (retrying)"
    assert redact(line) == f"HTTPError: 404 for url: https://hooks.slack.com/{REDACTED} (retrying)"
    assert redact("POST http://user:pw@ntfy.sh/topic?auth=x#frag failed") == f"POST http://ntfy.sh/{REDACTED} failed"
    assert redact("see https://ntfy.sh") == "see https://ntfy.sh", "a host alone is no secret"


def test_named_secrets_and_tokens_lose_their_values() -> None:
    assert redact('token=abc123 password: "hunter 2" x') == f"token={REDACTED} password: {REDACTED} x"
    assert REDACTED in redact("Authorization: Bearer abcdefghijkl12345") and "abcdefghijkl12345" not in redact(
        "Authorization: Bearer abcdefghijkl12345"
    )
    assert redact("key ghp_0123456789abcdefABCDEF0123456789abcd leaked") == f"key {REDACTED} leaked"
    assert redact("sha 3f786850e387550fdab836ed7e6dc881de23001b") == f"sha {REDACTED}"


def test_plain_words_and_program_paths_are_kept() -> None:
    for line in (
        "notifier /usr/local/bin/notify-slack-2024 failed on give_up (status 6): curl: (6) Could not resolve host: ntfy.sh",
        "ValueError: the run ended before it could be sent",
        "notification of restart dropped: 64 notifications are waiting already",
    ):
        assert redact(line) == line


@given(AROUND, HOST, SECRET, st.sampled_from(["/", "/a/", "?token=", "?q=1&sig=", "#", "/x?y="]), AROUND)
def test_a_secret_in_a_url_never_survives(before: str, host: str, secret: str, joint: str, after: str) -> None:
    line = f"{before} https://{host}{joint}{secret} {after}"
    redacted = redact(line)
    assert secret not in redacted and "Z" not in redacted.replace(after, "").replace(before, "")
    assert f"https://{host}/{REDACTED}" in redacted


@given(AROUND, st.sampled_from(["token", "api_key", "password", "X-Api-Key", "secret", "auth"]), SECRET, AROUND)
def test_a_named_secret_never_survives(before: str, name: str, secret: str, after: str) -> None:
    redacted = redact(f"{before} {name}={secret} {after}")
    assert secret not in redacted


@given(st.text(max_size=300))
def test_any_line_is_redacted_without_error_and_redacting_twice_changes_nothing(line: str) -> None:
    once = redact(line)
    assert redact(once) == once
