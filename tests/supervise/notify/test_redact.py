"""What a notifier's failure line keeps and loses (trainbox.supervise.notify.redact): examples, then any secret."""

from __future__ import annotations

import multiprocessing
import resource
import string
from urllib.parse import quote as quote_url

from hypothesis import given
from hypothesis import strategies as st

from trainbox.supervise.notify.notifier import QUOTE_CHARS as QUOTE
from trainbox.supervise.notify.redact import REDACTED, quote, redact

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


def test_keys_in_any_case_style_cookies_and_options_lose_their_values() -> None:
    assert redact('{"accessToken": "a1b2", "user": "bob"}') == f'{{"accessToken": {REDACTED}, "user": "bob"}}'
    assert redact("ACCESS_TOKEN=a1b2 access-token: a1b2 client.secret=a1b2") == (
        f"ACCESS_TOKEN={REDACTED} access-token: {REDACTED} client.secret={REDACTED}"
    )
    assert redact("Cookie: sid=a1b2; theme=dark") == f"Cookie: {REDACTED}"
    assert redact("Set-Cookie: sid=a1b2; Path=/; HttpOnly") == f"Set-Cookie: {REDACTED}"
    options = "curl --password a1b2 --api-key=a1b2 --user bob"
    assert redact(options) == f"curl --password {REDACTED} --api-key={REDACTED} --user bob"


def test_user_information_goes_whole_even_with_an_at_sign_in_the_password_or_percent_encoded() -> None:
    assert redact("POST https://bob:p@ss@w0rd@ntfy.sh/topic failed") == f"POST https://ntfy.sh/{REDACTED} failed"
    assert redact("POST https://bob:p%40ss@ntfy.sh failed") == "POST https://ntfy.sh failed"
    webhook = "https%3A%2F%2Fhooks.slack.com%2Fservices%2FT0%2FB0%2FSECRETtoken123"
    assert redact(f"bad url={webhook} x") == f"bad url=https://hooks.slack.com/{REDACTED} x"
    assert redact("at https%3a%2f%2fbob%3Ap%40ss%40ntfy.sh%2Ft") == f"at https://ntfy.sh/{REDACTED}"


def test_a_secret_at_the_cut_is_redacted_before_it_is_cut() -> None:
    token = "Ab1" * 14  # a token by its mix of characters alone, whose first 14 characters would not be one
    line = "." * (QUOTE - 15) + " " + token
    assert quote(line, QUOTE) == "." * (QUOTE - 15) + " " + REDACTED[:14]


#: A word of a key's name, and the ways of joining words into one.
NAME_WORD = st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=8)
STYLES = {
    "camel": lambda words: words[0] + "".join(w.title() for w in words[1:]),
    "snake": "_".join,
    "upper": lambda words: "_".join(words).upper(),
    "kebab": "-".join,
    "dotted": ".".join,
}


@given(
    AROUND,
    st.lists(NAME_WORD, max_size=3),
    st.sampled_from(["token", "secret", "key", "password", "auth", "cookie"]),
    st.sampled_from(sorted(STYLES)),
    st.sampled_from(["{name}={secret}", '"{name}": "{secret}"', "{name}: {secret}", "--{name} {secret}", "--{name}={secret}"]),
    SECRET,
    AROUND,
)
def test_a_key_named_secret_in_any_case_style_never_keeps_its_value(
    before: str, words: list, end: str, style: str, shape: str, secret: str, after: str
) -> None:
    name = STYLES[style]([*words, end])
    redacted = redact(f"{before} {shape.format(name=name, secret=secret)} {after}")
    assert secret not in redacted


@given(AROUND, st.text(alphabet=string.ascii_letters + string.digits + ":@%!$", min_size=1, max_size=30), HOST, AROUND)
def test_user_information_never_survives_decoded_or_encoded(before: str, userinfo: str, host: str, after: str) -> None:
    secret = "Z" + userinfo
    for url in (f"https://{secret}@{host}/p", "https%3A%2F%2F" + quote_url(f"{secret}@{host}/p", safe="")):
        redacted = redact(f"{before} {url} {after}")
        assert "Z" not in redacted.replace(after, "").replace(before, ""), redacted


#: Lines of a megabyte built against each pattern: a long run that a backtracking pattern would scan again from each
#: of its characters (a scheme without ``://``, names without ``=``, a quote never closed, user information without
#: ``@``, words one short of a token).
ADVERSARIAL = {
    "scheme": "a." * 2**19,
    "kebab": "a-" * 2**19,
    "userinfo": "https://" + "a" * 2**20,
    "blanks": "token" + " " * 2**20 + "x",
    "open quote": 'key:"' + "a " * 2**19,
    "names": "token" * 2**18,
    "at signs": "x@" * 2**19,
    "encoded": "a%3A%2F%2F" * 2**17,
    "short words": "abcdefghijklmno " * 2**16,
    "options": "--token " * 2**17,
    "cookies": "cookie:" * 2**17,
    "schemes": "a://b@" * 2**17,
}
#: CPU seconds for redacting all of them: a linear pass takes about one on a loaded laptop; the quadratic pattern
#: this replaced needed 24 s for 16,000 characters, so a megabyte would need hours.
CPU_LIMIT_S = 60


def _redact_all() -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT_S, CPU_LIMIT_S))
    for line in ADVERSARIAL.values():
        redact(line)


def test_every_pattern_is_linear_on_a_megabyte_line() -> None:
    """Not a timing: a quadratic pattern needs thousands of times the CPU limit, a linear one a small part of it."""
    child = multiprocessing.get_context("fork").Process(target=_redact_all)
    child.start()
    child.join()
    assert child.exitcode == 0, f"killed by the CPU limit ({child.exitcode}): a pattern is not linear"
