"""Reading engine props: unknowns, secrets, pulumi_policy proxies, paths and numbers."""

from __future__ import annotations

import pytest

from policies.props import UNKNOWN, as_int, get, plain

UNKNOWN_NUMBER = "3eeb2bf0-c639-47a8-9e75-3b44932eb421"
SECRET_SIG = {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270"}


def test_plain_unwraps_the_engine_proxy_without_tripping_it():
    from pulumi_policy.proxy import unknown_checking_proxy

    proxied = unknown_checking_proxy({"a": {"b": [1.0, UNKNOWN_NUMBER]}, "c": UNKNOWN_NUMBER})
    assert plain(proxied) == {"a": {"b": [1.0, UNKNOWN]}, "c": UNKNOWN}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({**SECRET_SIG, "value": "s3cret"}, "s3cret"),
        ({**SECRET_SIG, "plaintext": '{"a": 1}'}, {"a": 1}),
        ({**SECRET_SIG, "ciphertext": "AAAA"}, UNKNOWN),
    ],
    ids=["clear", "plaintext-json", "encrypted"],
)
def test_plain_opens_secret_envelopes(value, expected):
    assert plain({"k": value}) == {"k": expected}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("spec.groups[1].n", 2.0),
        ("spec.groups[5].n", None),
        ("spec.missing.deeper", None),
        ("spec.groups.n", None),
        ("spec.unknown.deeper", UNKNOWN),
        ("spec.unknown", UNKNOWN),
    ],
    ids=["index", "index-out-of-range", "missing", "list-as-map", "through-unknown", "unknown"],
)
def test_get(path, expected):
    props = {"spec": {"groups": [{"n": 1.0}, {"n": 2.0}], "unknown": UNKNOWN_NUMBER}}
    assert get(props, path) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(4, 4), (4.0, 4), ("4", 4), (4.5, None), ("four", None), (True, None), (None, None)],
    ids=["int", "float", "quantity", "fraction", "word", "bool", "none"],
)
def test_as_int(value, expected):
    assert as_int(value) == expected


def test_as_int_keeps_unknown():
    assert as_int(UNKNOWN_NUMBER) is UNKNOWN
