"""What verify-rebuild says when two images differ (trainbox.container.imagediff), on made-up layers: milliseconds."""

from __future__ import annotations

import io
import tarfile
from typing import List

from tests.container.layers_fixture import EPOCH, Item, config, layer
from trainbox.container import imagediff, layers

BASE = [Item("etc", None, tarfile.DIRTYPE, 0o755), Item("etc/os-release", b"debian\n")]
APT = [Item("usr/bin/tini", b"\x7fELF tini", mode=0o755), Item("usr/lib/python3.9/os.py", b"import abc\n")]
APP = [Item("opt/trainbox/trainbox/cli.py", b"print('hi')\n"), Item("etc/shadow", b"trainbox:!::0:99999:7:::\n")]


def image(name: str, *layer_items: List[Item], created: str = "2026-01-02T03:04:05Z") -> imagediff.Image:
    tars = [layer(items) for items in layer_items]
    ids = [layers.config_id(tar) for tar in tars]
    made = config(ids, created=created, steps=len(tars) - 1)
    return imagediff.Image(name, made, [lambda tar=tar: io.BytesIO(tar) for tar in tars])


def differences(a: List[Item], b: List[Item]) -> List[str]:
    return imagediff.layer_differences(io.BytesIO(layer(a)), io.BytesIO(layer(b)))


def test_identical_images_have_no_differences() -> None:
    assert imagediff.differences(image("a", BASE, APT, APP), image("b", BASE, APT, APP)) == []


def test_a_planted_file_is_named_with_its_layer_and_step() -> None:
    planted = [APP[0], Item("etc/shadow", b"trainbox:!:20421:0:99999:7:::\n")]
    lines = imagediff.differences(image("a", BASE, APT, APP), image("b", BASE, APT, planted))
    assert lines[0] == "layer 3 of 3 (RUN step 2) differs:"
    assert lines[1].startswith("  /etc/shadow: content differs (25 bytes, sha256 ")
    assert len(lines) == 2  # the identical base and apt layers are not read, the config is the same


def test_files_in_one_layer_only_and_changed_metadata_are_each_named() -> None:
    here = [Item("a", b"1"), Item("b", b"2", mode=0o644), Item("c", None, tarfile.SYMTYPE, link="a"), Item("d", b"4")]
    there = [Item("a", b"1"), Item("b", b"2", mode=0o755, mtime=EPOCH), Item("c", None, tarfile.SYMTYPE, link="b")]
    there.append(Item("e", b"5", uid=1000))
    assert differences(here, there) == [
        "/b: mode 0644 vs 0755; time 2026-01-01 03:04:05 UTC vs 2026-01-02 03:04:05 UTC",
        "/c: link target 'a' vs 'b'",
        "/d: only here, not in the rebuild",
        "/e: only in the rebuild",
    ]


def test_a_file_that_became_a_directory_and_an_owner_change_are_named() -> None:
    lines = differences([Item("x", b"1"), Item("y", b"", uid=0)], [Item("x", None, tarfile.DIRTYPE), Item("y", b"", uid=1000)])
    assert lines[0].startswith("/x: a file here, a directory in the rebuild")
    assert lines[1] == "/y: owner 0:0 vs 1000:1000"


def test_same_files_in_another_order_are_said_to_be_so() -> None:
    assert differences([Item("a", b"1"), Item("b", b"2")], [Item("b", b"2"), Item("a", b"1")]) == [
        "same files, stored in another order"
    ]


def test_a_long_list_is_cut_and_counted() -> None:
    many = [Item(f"f{index:03}", b"x") for index in range(imagediff.MAX_PATHS + 5)]
    lines = differences(many, [])
    assert len(lines) == imagediff.MAX_PATHS + 1 and lines[-1] == "... and 5 more paths"


def test_config_fields_and_settings_that_differ_are_named_with_both_values() -> None:
    a, b = config(["sha256:1"]), config(["sha256:1"], created="2026-12-01T00:00:00Z")
    b["config"]["Labels"] = {"a": "2"}
    lines = imagediff.config_differences(a, b)
    assert "config created: '2026-11-29T02:47:11.123456789Z' vs '2026-12-01T00:00:00Z'" in lines
    assert 'config setting Labels: {"a": "1"} vs {"a": "2"}' in lines
    assert "config history step 2 created: '2026-11-29T02:47:11.123456789Z' vs '2026-12-01T00:00:00Z'" in lines


def test_steps_are_named_by_their_dockerfile_instruction() -> None:
    history = [
        {"created_by": "/bin/sh -c #(nop) ADD file:abc in / "},
        {"created_by": "/bin/sh -c #(nop)  ENV A=1", "empty_layer": True},
        {"created_by": "|2 EXTRA=1 /bin/bash -euo pipefail -c apt-get update " + "x" * 200},
        {"created_by": "/bin/sh -c #(nop) COPY dir:123 in /opt/trainbox/trainbox/ "},
        {"created_by": "/bin/bash -euo pipefail -c #(nop) COPY file:9 in /etc/trainbox/ "},
    ]
    names = imagediff.step_names({"history": history})
    assert names[0] == "ADD file:abc in /" and names[2] == "COPY dir:123 in /opt/trainbox/trainbox/"
    assert names[3] == "COPY file:9 in /etc/trainbox/"  # after SHELL, the builder records the shell too
    assert names[1].startswith("RUN apt-get update xxx") and names[1].endswith("...") and len(names[1]) == imagediff.STEP_WIDTH


def status(*packages: str) -> bytes:
    """dpkg's status database listing ``name=version`` packages."""
    pairs = (package.split("=") for package in packages)
    return "".join(f"Package: {name}\nStatus: install ok installed\nVersion: {version}\n\n" for name, version in pairs).encode()


def test_packages_apt_installed_in_another_version_are_named_before_the_files() -> None:
    here = [Item("var/lib/dpkg/status", status("libc6=2.31-13+deb11u11", "tini=0.19.0-1", "gone=1"))]
    there = [Item("var/lib/dpkg/status", status("libc6=2.31-13+deb11u13", "tini=0.19.0-1", "new=2"))]
    lines = differences(here, there)
    assert lines[:3] == [
        "package gone 1: only here",
        "package libc6: 2.31-13+deb11u11 here, 2.31-13+deb11u13 in the rebuild",
        "package new 2: only in the rebuild",
    ]
    assert lines[3].startswith("/var/lib/dpkg/status: content differs")
