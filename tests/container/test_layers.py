"""The rewrite of a built image's layers and config (trainbox.container.layers), on made-up tarballs: milliseconds."""

from __future__ import annotations

import io
import json
import tarfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.container.layers_fixture import EPOCH, Item, config, layer
from trainbox.container import layers


def rewritten(data: bytes) -> tuple:
    out = io.BytesIO()
    diff_id = layers.rewrite_layer(io.BytesIO(data), out, EPOCH)
    return diff_id, out.getvalue()


def members(data: bytes) -> list:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m.name, m.type, m.mtime, m.mode, m.uid, m.uname, m.linkname, dict(m.pax_headers)) for m in tar]


def test_a_file_the_build_wrote_gets_the_commit_s_time_and_a_packaged_one_keeps_its_own() -> None:
    packaged, built = EPOCH - 1000, EPOCH + 3600
    _, out = rewritten(layer([Item("usr/lib/a.so", b"elf", mtime=packaged), Item("var/log/x", b"1", mtime=built)]))
    assert [(name, mtime) for name, _, mtime, *_ in members(out)] == [("usr/lib/a.so", packaged), ("var/log/x", EPOCH)]


def test_owner_names_go_and_what_makes_the_file_stays() -> None:
    items = [
        Item("bin", None, tarfile.DIRTYPE, 0o755),
        Item("bin/ping", b"x", mode=0o4755, uid=7, xattrs={"security.capability": "cap"}),
        Item("bin/sh", None, tarfile.SYMTYPE, 0o777, link="dash"),
        Item("bin/ping2", None, tarfile.LNKTYPE, link="bin/ping"),
    ]
    _, out = rewritten(layer(items, uname="builder"))
    found = members(out)
    assert [m[0] for m in found] == ["bin", "bin/ping", "bin/sh", "bin/ping2"]  # the engine's order: links after targets
    assert {m[5] for m in found} == {""}
    assert found[1][3:5] == (0o4755, 7) and found[1][7] == {"SCHILY.xattr.security.capability": "cap"}
    assert found[2][6] == "dash" and found[3][1] == tarfile.LNKTYPE and found[3][6] == "bin/ping"


def test_the_diff_id_is_the_sha256_of_what_is_written() -> None:
    diff_id, out = rewritten(layer([Item("a", b"1")]))
    assert diff_id == layers.config_id(out)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    files=st.dictionaries(st.text("abcdef", min_size=1, max_size=6), st.binary(max_size=16), min_size=1, max_size=5),
    times=st.lists(st.integers(EPOCH + 1, EPOCH + 10**7), min_size=2, max_size=2, unique=True),
    names=st.sampled_from(["root", "builder", ""]),
)
def test_two_builds_that_wrote_the_same_files_at_other_times_give_the_same_layer(files, times, names) -> None:
    one, two = (layer([Item(n, d, mtime=t) for n, d in sorted(files.items())], uname=names) for t in times)
    assert one != two
    assert rewritten(one) == rewritten(two)


def test_a_changed_byte_changes_the_layer() -> None:
    assert rewritten(layer([Item("a", b"1")]))[0] != rewritten(layer([Item("a", b"2")]))[0]


def test_the_config_keeps_what_the_image_runs_with_and_drops_what_names_the_build() -> None:
    raw = config(["sha256:base", "sha256:old1", "sha256:old2"])
    out = json.loads(layers.rewrite_config(raw, 1, ["sha256:base", "sha256:new1", "sha256:new2"], EPOCH))
    assert not {"container", "container_config", "docker_version"} & set(out)
    assert out["config"] == {"Env": ["PATH=/usr/bin"], "Labels": {"a": "1"}}
    assert out["created"] == "2026-01-02T03:04:05Z"
    assert [step["created"] for step in out["history"]] == ["2025-06-01T00:00:00Z", *["2026-01-02T03:04:05Z"] * 2]
    assert out["rootfs"] == {"type": "layers", "diff_ids": ["sha256:base", "sha256:new1", "sha256:new2"]}


def test_two_configs_that_differ_only_in_build_times_and_key_order_give_one_image_id() -> None:
    ids = ["sha256:base", "sha256:l1", "sha256:l2"]
    one = config(ids, created="2026-11-29T02:47:11Z")
    two = dict(reversed(list(config(ids, created="2026-11-30T08:00:00Z").items())))
    two["container"] = "fedcba987654"
    assert layers.rewrite_config(one, 1, ids, EPOCH) == layers.rewrite_config(two, 1, ids, EPOCH)
