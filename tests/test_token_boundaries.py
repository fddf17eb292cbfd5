"""Token text at the boundaries (issue #21, items 11 and 12): one table of inputs run
through every path that reads a fencing token from text — ``parse_token`` on str and on
bytes, ``FencingToken.from_header`` / ``from_env`` / ``from_metadata``, the CLI's
``--token`` type, the ASGI and WSGI middlewares, a real uvicorn and a real wsgiref server
on loopback, the ``etcdfence`` CLI as a subprocess against a real etcd (``--token`` and
``ETCDFENCE_TOKEN``) — and every path must give the same verdict: the same token, or an
:class:`etcdfence.InvalidTokenError` (HTTP 400, CLI exit 2), never a raw ``ValueError``.

The rule is an RFC 9110 field value: optional space/tab around, then 1 to 19 ASCII
digits (an etcd revision is an int64), positive, at most ``MAX_TOKEN``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
from conftest import advance_revision, clean_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import etcdfence as ef
from etcdfence import _keys
from etcdfence.cli import _options
from etcdfence.http import FencingMiddleware, WSGIFencingMiddleware, fencing_token
from etcdfence.token import MAX_TOKEN, FencingToken, parse_token

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PYTHON = sys.executable
LONG = "1" * 5000  # beyond int()'s 4,300-digit limit: int(LONG) is a ValueError

#: (token text, the token it is, or None: an InvalidTokenError on every path)
TABLE: list[tuple[str, int | None]] = [
    ("12", 12),
    ("1", 1),
    (" 12", 12),
    ("12 ", 12),
    ("\t12\t", 12),
    (" \t 7 \t", 7),
    ("0007", 7),
    (str(MAX_TOKEN), MAX_TOKEN),
    ("0" * 18 + "1", 1),  # 19 digits, leading zeros included
    (str(MAX_TOKEN + 1), None),
    ("0" * 19 + "1", None),  # 20 digits: longer than any revision is written
    ("1" * 20, None),
    ("9" * 4301, None),
    (LONG, None),
    ("0", None),
    ("000", None),
    ("-1", None),
    ("-0", None),
    ("+1", None),
    ("1_000", None),
    ("1.0", None),
    ("1e3", None),
    ("0x10", None),
    ("12 34", None),
    ("5, 6", None),
    ("5,5", None),
    ("", None),
    (" ", None),
    ("\t", None),
    ("\xa012", None),  # NO-BREAK SPACE: str.strip() took it, bytes did not
    ("12\xa0", None),
    ("1\xa02", None),
    ("\x8512", None),  # NEXT LINE (latin-1 0x85): str.strip() took it too
    ("12\x85", None),
    ("\x1c12", None),  # FILE SEPARATOR: str.strip() again
    ("12\x1f", None),
    ("12\x0b", None),
    ("\x0c12", None),
    ("12\u2003", None),
    ("\u300012", None),
    ("\u200b12", None),
    ("１２", None),  # fullwidth digits
    ("١٢", None),  # Arabic-Indic digits
    ("۱۲", None),  # Extended Arabic-Indic digits
    ("²", None),
    ("12\x00", None),
    ("12\n", None),
    ("\r12", None),
    ("1\x7f", None),
]
IDS = [f"{i:02d}-{ascii(text)[:24]}" for i, (text, _) in enumerate(TABLE)]

Verdict = Any  # int (the token), None (refused), or a description of anything else


# ------------------------------------------------------------------ the in-process paths


def asgi_middleware(raw: bytes) -> Verdict:
    """A PUT with ``Fencing-Token: raw`` through :class:`FencingMiddleware` (in process,
    as a server would call it): the token the app got, None for a 400."""
    answers: list[Any] = []
    reached: list[FencingToken] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(fencing_token(scope))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def send(message: Any) -> None:
        answers.append(message)

    scope = {"type": "http", "method": "PUT", "path": "/", "headers": [(b"fencing-token", raw)]}
    asyncio.run(FencingMiddleware(app)(scope, None, send))  # type: ignore[arg-type]
    status = answers[0]["status"]
    if status == 400:
        assert not reached and json.loads(answers[1]["body"])["header"] == "Fencing-Token"
        return None
    return reached[0].value if status == 200 else f"status {status}"


def wsgi_middleware(value: str) -> Verdict:
    """The same through :class:`WSGIFencingMiddleware`, the header in the environ as a
    PEP 3333 server puts it (the bytes decoded as latin-1)."""
    statuses: list[str] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [str(fencing_token(environ).value).encode()]

    def start_response(status: str, headers: Any, exc_info: Any = None) -> None:
        statuses.append(status)

    environ = {"REQUEST_METHOD": "PUT", "HTTP_FENCING_TOKEN": value}
    body = b"".join(WSGIFencingMiddleware(app)(environ, start_response))
    if statuses == ["400 Bad Request"]:
        return None
    return int(body) if statuses == ["200 OK"] else f"status {statuses}"


def cli_type(text: str) -> int:
    """The ``--token`` option's argparse type, as the parser calls it."""
    try:
        return _options.token(text)
    except argparse.ArgumentTypeError as exc:
        raise ef.InvalidTokenError(str(exc)) from None


def in_process_paths(text: str) -> dict[str, Callable[[], Verdict]]:
    """Every in-process way the text can arrive, keyed by a name for the failure report."""
    utf8 = text.encode("utf-8")
    paths: dict[str, Callable[[], Verdict]] = {
        "parse_token(str)": lambda: parse_token(text),
        "parse_token(bytes utf-8)": lambda: parse_token(utf8),
        "parse_token(bytearray)": lambda: parse_token(bytearray(utf8)),
        "from_header(str)": lambda: FencingToken.from_header(text).value,
        "from_header(bytes)": lambda: FencingToken.from_header(utf8).value,
        "from_env ETCDFENCE_TOKEN": lambda: FencingToken.from_env({"ETCDFENCE_TOKEN": text}).value,
        "from_env ETCD_LOCK_REV": lambda: FencingToken.from_env({"ETCD_LOCK_REV": text}).value,
        "from_metadata str": lambda: FencingToken.from_metadata({"fencing-token": text}).value,
        "from_metadata bytes": lambda: FencingToken.from_metadata({"Fencing-Token": utf8}).value,
        "cli --token type": lambda: cli_type(text),
        "asgi middleware (utf-8 bytes)": lambda: asgi_middleware(utf8),
        "wsgi middleware (utf-8 as latin-1)": lambda: wsgi_middleware(utf8.decode("latin-1")),
    }
    try:
        latin1 = text.encode("latin-1")
    except UnicodeEncodeError:
        return paths
    paths["parse_token(bytes latin-1)"] = lambda: parse_token(latin1)
    paths["asgi middleware (latin-1 bytes)"] = lambda: asgi_middleware(latin1)
    paths["wsgi middleware (latin-1 str)"] = lambda: wsgi_middleware(text)
    return paths


def verdicts(paths: dict[str, Callable[[], Verdict]]) -> dict[str, Verdict]:
    """Each path's verdict. Only InvalidTokenError is a refusal: anything else (the
    ValueError of int() on thousands of digits) is reported as what it is."""
    out: dict[str, Verdict] = {}
    for name, path in paths.items():
        try:
            out[name] = path()
        except ef.InvalidTokenError as exc:
            assert len(str(exc)) < 400, f"{name}: error message not clipped: {len(str(exc))}"
            out[name] = None
        except Exception as exc:
            out[name] = f"raised {type(exc).__name__}: {str(exc)[:80]}"
    return out


def oracle(text: str) -> int | None:
    """The rule, written independently of the library: OWS, 1-19 ASCII digits, OWS."""
    match = re.fullmatch(r"[ \t]*([0-9]{1,19})[ \t]*", text)
    if match is None:
        return None
    value = int(match[1])
    return value if 0 < value <= MAX_TOKEN else None


def test_the_table_follows_the_rule() -> None:
    assert [oracle(text) for text, _ in TABLE] == [want for _, want in TABLE]
    assert len(str(MAX_TOKEN)) == 19  # an etcd revision is an int64


@pytest.mark.parametrize(("text", "want"), TABLE, ids=IDS)
def test_every_in_process_path_gives_the_same_verdict(text: str, want: int | None) -> None:
    got = verdicts(in_process_paths(text))
    wrong = {name: verdict for name, verdict in got.items() if verdict != want}
    assert not wrong, f"expected {want} on every path; differing: {wrong}"


#: Characters that broke one path or another: OWS, what str.strip() also took, signs,
#: separators, non-ASCII digits, control characters.
INTERESTING = "0123456789 \t\xa0\x85\x0b\x0c\x1c\r\n\x00+-_.,e１٢²\u2003\u3000"
TOKEN_TEXT = st.one_of(
    st.text(alphabet=INTERESTING, max_size=24),
    st.text(max_size=24),
    st.binary(max_size=24).map(lambda raw: raw.decode("latin-1")),
    st.integers(-(2**70), 2**70).map(str),
    st.tuples(
        st.text(" \t", max_size=3), st.integers(0, 2**64).map(str), st.text(" \t", max_size=3)
    ).map("".join),
    st.tuples(st.text("0", max_size=22), st.integers(1, 10**6).map(str)).map("".join),
    st.integers(1, 6000).map(lambda n: "7" * n),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TOKEN_TEXT)
def test_all_paths_agree_with_the_rule_on_any_text(text: str) -> None:
    """Property: whatever the text, every path gives the rule's verdict."""
    want = oracle(text)
    got = verdicts(in_process_paths(text))
    wrong = {name: verdict for name, verdict in got.items() if verdict != want}
    assert not wrong, f"{text!r}: expected {want}; differing: {wrong}"


# ------------------------------------------------------------------ metadata keys


def test_metadata_keys_compare_ascii_case_insensitively() -> None:
    assert FencingToken.from_metadata({"FENCING-TOKEN": "5"}).value == 5
    assert FencingToken.from_metadata({b"Fencing-Token": b"6"}).value == 6
    # KELVIN SIGN folds to 'k' under str.lower(): not the key, as no HTTP field name is.
    with pytest.raises(ef.InvalidTokenError, match="no 'fencing-token' entry"):
        FencingToken.from_metadata({"fencing-to\u212aen": "5"})
    with pytest.raises(ef.InvalidTokenError, match="no 'fencing-token' entry"):
        FencingToken.from_metadata({"other": "5"})


@pytest.mark.parametrize(
    "metadata",
    [
        {"fencing-token": "5", "Fencing-Token": "6"},
        {"Fencing-Token": "6", "fencing-token": "5"},
        {"fencing-token": "5", "FENCING-TOKEN": "5"},  # equal values: as a repeated header
        {"fencing-token": "5", b"fencing-token": b"5"},
    ],
)
def test_two_metadata_keys_for_the_token_are_an_error(metadata: dict[Any, Any]) -> None:
    """Which of two entries the producer meant is unknowable: refused, as a repeated
    ``Fencing-Token`` header is (400 on both servers, see below), not first-one-wins."""
    with pytest.raises(ef.InvalidTokenError, match="2 times") as info:
        FencingToken.from_metadata(metadata)
    for key in metadata:
        assert repr(key) in str(info.value)


KAFKA_HEADERS = [("trace-id", b"abc"), ("fencing-token", b"5")]  # kafka-python, confluent
GRPC_METADATA = (("user-agent", "grpc-python"), ("Fencing-Token", "6"))  # invocation_metadata()


def test_metadata_as_pairs_is_read_like_a_mapping() -> None:
    """Kafka headers (a list of (str, bytes)) and gRPC metadata (a tuple of pairs), the
    shapes the docstring names, give the token; so do bytes keys and one-shot iterators."""
    assert FencingToken.from_metadata(KAFKA_HEADERS).value == 5
    assert FencingToken.from_metadata(GRPC_METADATA).value == 6
    assert FencingToken.from_metadata([[b"FENCING-TOKEN", b" 7\t"]]).value == 7
    assert FencingToken.from_metadata(iter([("fencing-token", "8")])).value == 8
    assert FencingToken.from_metadata({"fencing-token": "9"}.items()).value == 9
    for empty in ([], (), None, [("trace-id", b"x")]):
        with pytest.raises(ef.InvalidTokenError, match="no 'fencing-token' entry"):
            FencingToken.from_metadata(empty)
    with pytest.raises(ef.InvalidTokenError, match="metadata 'fencing-token'"):
        FencingToken.from_metadata([("fencing-token", b"5x")])


@pytest.mark.parametrize(
    "pairs",
    [
        [("fencing-token", b"5"), ("fencing-token", b"9")],  # one key, two pairs
        [("fencing-token", b"5"), ("fencing-token", b"5")],  # equal values too
        (("Fencing-Token", "5"), ("x", "y"), ("fencing-TOKEN", "9")),
        [("fencing-token", "5"), (b"fencing-token", b"9")],
    ],
)
def test_two_pairs_for_the_token_are_an_error_as_two_mapping_keys(pairs: Any) -> None:
    """Not last-one-wins (what ``dict(pairs)`` would silently do) nor first-one-wins."""
    with pytest.raises(ef.InvalidTokenError, match="2 times"):
        FencingToken.from_metadata(pairs)


@pytest.mark.parametrize(
    "metadata",
    ["fencing-token", b"fencing-token: 5", 5, object(), [("fencing-token",)],
     [("fencing-token", "5", "x")], ["ab"], [5], [{"fencing-token": "5", "x": "y"}]],
)  # fmt: skip
def test_metadata_of_another_shape_is_an_invalid_token_error(metadata: Any) -> None:
    with pytest.raises(ef.InvalidTokenError, match=r"must be (a mapping|\(key, value\) pairs)"):
        FencingToken.from_metadata(metadata)


def test_a_token_of_a_token_is_the_plain_int() -> None:
    inner = FencingToken(7, key="k", create_revision=3, lease_id=1)
    outer = FencingToken(inner, create_revision=FencingToken(3))  # type: ignore[arg-type]
    assert type(outer.value) is int and outer.value == 7
    assert type(outer.create_revision) is int and outer.create_revision == 3
    assert outer == inner and hash(outer) == hash(inner) and str(outer) == "7"
    with pytest.raises(ef.InvalidTokenError):
        FencingToken(FencingToken)  # type: ignore[arg-type]


@pytest.mark.parametrize("blank", ["", " ", "\t", " \t "])
def test_an_empty_or_blank_environment_token_is_unset(blank: str) -> None:
    """``""`` and ``" "`` behave the same: unset, so ``ETCD_LOCK_REV`` is read."""
    assert FencingToken.from_env({"ETCDFENCE_TOKEN": blank, "ETCD_LOCK_REV": "7"}).value == 7
    with pytest.raises(ef.InvalidTokenError, match="no fencing token in the environment"):
        FencingToken.from_env({"ETCDFENCE_TOKEN": blank, "ETCD_LOCK_REV": blank})
    with pytest.raises(ef.InvalidTokenError, match="ETCDFENCE_TOKEN"):  # not whitespace
        FencingToken.from_env({"ETCDFENCE_TOKEN": blank + "\xa0", "ETCD_LOCK_REV": "7"})


def test_etcdfence_token_wins_over_a_different_etcd_lock_rev() -> None:
    env = {"ETCDFENCE_TOKEN": "5", "ETCD_LOCK_REV": "7"}
    assert FencingToken.from_env(env).value == 5
    assert "ETCDFENCE_TOKEN" in (FencingToken.from_env.__doc__ or "").split("wins")[0]


def test_the_key_comes_from_the_family_of_the_token() -> None:
    """An outer ``etcdctl lock`` (ETCD_LOCK_*) around ``etcdfence lock`` (ETCDFENCE_*):
    a token of one lock is never paired with the key of the other."""
    both = {"ETCDFENCE_TOKEN": "5", "ETCD_LOCK_REV": "7", "ETCD_LOCK_KEY": "outer/1"}
    assert FencingToken.from_env(both).key is None
    both["ETCDFENCE_KEY"] = "inner/2"
    assert FencingToken.from_env(both).key == "inner/2"
    etcdctl = {"ETCD_LOCK_REV": "7", "ETCD_LOCK_KEY": "outer/1", "ETCDFENCE_KEY": "inner/2"}
    assert FencingToken.from_env(etcdctl) == FencingToken(7, key="outer/1")


def test_a_malformed_stored_mark_of_thousands_of_digits_is_an_etcdfence_error() -> None:
    """The resource side reads stored marks with the same bound (a tampered mark)."""
    assert _keys.decode_mark_epoch(b"0" * 19 + b"5") == (5, 0)
    with pytest.raises(ef.InvalidArgumentError, match="fence mark"):
        _keys.decode_mark_epoch(b"1" * 5000)
    with pytest.raises(ef.InvalidArgumentError, match="fence mark"):
        _keys.decode_mark_epoch(b"1" * 21)


# ------------------------------------------------------------------ real HTTP servers


def echo_asgi() -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = json.dumps({"token": fencing_token(scope).value}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    return FencingMiddleware(app)


def echo_wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    body = json.dumps({"token": fencing_token(environ).value}).encode()
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def uvicorn_port() -> Iterator[int]:
    """A real uvicorn (h11) on loopback serving the echo app behind the middleware."""
    pytest.importorskip("uvicorn")
    sys.path.insert(0, str(EXAMPLES))
    try:  # the example's ServiceThread: a real uvicorn in a thread
        service_thread: Any = importlib.import_module("fenced_http_service").ServiceThread
    finally:
        sys.path.remove(str(EXAMPLES))
    service = service_thread(echo_asgi())
    url = service.start()
    try:
        yield int(url.rsplit(":", 1)[1])
    finally:
        service.stop()


@pytest.fixture(scope="module")
def wsgiref_port() -> Iterator[int]:
    """A real threaded wsgiref server on loopback serving the WSGI twin."""
    app = WSGIFencingMiddleware(echo_wsgi)
    server = make_server("127.0.0.1", 0, app, _ThreadingWSGIServer, _QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def raw_put(port: int, *values: bytes) -> tuple[int, bytes]:
    """A PUT whose ``Fencing-Token`` field values are exactly ``values`` (bytes on the
    wire, no client-side checks): (status, body)."""
    fields = b"".join(b"Fencing-Token: " + value + b"\r\n" for value in values)
    request = (
        b"PUT /t HTTP/1.1\r\nHost: 127.0.0.1\r\n" + fields
        + b"Content-Length: 0\r\nConnection: close\r\n\r\n"
    )  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def server_verdict(port: int, raw: bytes) -> Verdict:
    status, body = raw_put(port, raw)
    if status == 200:
        return json.loads(body)["token"]
    return None if status == 400 else f"status {status}: {body[:80]!r}"


def on_the_wire(text: str) -> bytes | None:
    """The field value as sent, or None where HTTP framing cannot carry it (CR, LF)."""
    raw = text.encode("utf-8")
    return None if b"\r" in raw or b"\n" in raw else raw


def test_every_table_input_over_a_real_uvicorn(uvicorn_port: int) -> None:
    """h11 strips OWS and refuses some control bytes itself (400 too); everything else
    reaches the middleware, whose verdict must be the table's."""
    wrong: dict[str, object] = {}
    for text, want in TABLE:
        raw = on_the_wire(text)
        if raw is not None and (got := server_verdict(uvicorn_port, raw)) != want:
            wrong[ascii(text)[:40]] = got
    assert not wrong, f"uvicorn differs from the table: {wrong}"


def wsgiref_rewrites(raw: bytes) -> bool:
    """wsgiref's ``get_environ`` strips header values with ``str.strip()``: it removes
    \\xa0, \\x85, \\x0b, \\x1c-\\x1f at the edges before any app sees them (the server's
    doing, not the middleware's; those inputs are covered in process above). Documented
    limit: the rule holds on servers that pass header values unmodified — README "HTTP
    write gates" and ``WSGIFencingMiddleware``'s docstring; the middleware warns under
    wsgiref (``test_the_wsgi_middleware_warns_once_under_wsgiref``)."""
    value = raw.decode("latin-1")
    return value.strip() != value.strip(" \t")


def test_every_table_input_over_a_real_wsgiref(wsgiref_port: int) -> None:
    wrong: dict[str, object] = {}
    checked = 0
    for text, want in TABLE:
        raw = on_the_wire(text)
        if raw is None or wsgiref_rewrites(raw):
            continue
        checked += 1
        if (got := server_verdict(wsgiref_port, raw)) != want:
            wrong[ascii(text)[:40]] = got
    assert not wrong, f"wsgiref differs from the table: {wrong}"
    assert checked > 35  # the in-between characters (1\xa02, １２, ...) do arrive as sent


def test_the_wsgi_middleware_warns_once_under_wsgiref(
    wsgiref_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """wsgiref rewrites header values before the app sees them: the middleware says so,
    once per process, and not on another server. (Captured as structlog events, which
    holds whatever logging setup an earlier test left behind.)"""
    import structlog

    monkeypatch.setattr("etcdfence.fence.http._warned_wsgiref", False)
    app = WSGIFencingMiddleware(echo_wsgi)
    environ = {"REQUEST_METHOD": "PUT", "HTTP_FENCING_TOKEN": "4",
               "SERVER_SOFTWARE": "gunicorn/23.0.0"}  # fmt: skip
    with structlog.testing.capture_logs() as logs:
        assert b"".join(app(environ, lambda *a: None)) == b'{"token": 4}'
        assert not [e for e in logs if e["event"] == "etcdfence.wsgiref_rewrites_headers"]
        assert server_verdict(wsgiref_port, b"42") == 42
        assert server_verdict(wsgiref_port, b"43") == 43
    (event,) = [e for e in logs if e["event"] == "etcdfence.wsgiref_rewrites_headers"]
    assert event["server"].startswith("WSGIServer/") and "gunicorn or waitress" in event["detail"]


@pytest.mark.parametrize("server", ["uvicorn", "wsgiref"])
def test_a_5000_digit_header_is_a_400_with_a_short_clear_body(
    server: str, request: pytest.FixtureRequest
) -> None:
    port: int = request.getfixturevalue(f"{server}_port")
    status, body = raw_put(port, LONG.encode())
    assert status == 400, body[:200]
    answer = json.loads(body)
    assert answer["header"] == "Fencing-Token"
    assert "5000 digits" in answer["error"] and "at most 19" in answer["error"]
    assert len(body) < 400
    # and the server still answers (no crashed worker, no poisoned cache)
    assert server_verdict(port, b"42") == 42


@pytest.mark.parametrize("server", ["uvicorn", "wsgiref"])
def test_two_equal_headers_are_refused_like_two_metadata_keys(
    server: str, request: pytest.FixtureRequest
) -> None:
    port: int = request.getfixturevalue(f"{server}_port")
    assert raw_put(port, b"5", b"5")[0] == 400
    assert raw_put(port, b"5", b"6")[0] == 400


# ------------------------------------------------------------------ the CLI as a process


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "etcdfence", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def cli_verdict(result: subprocess.CompletedProcess[str]) -> Verdict:
    """Exit 0 and the token the record shows, or None for exit 2 with one error line."""
    if result.returncode == 0:
        return json.loads(result.stdout)["token"]
    lines = result.stderr.strip().splitlines()
    if result.returncode == 2 and len(lines) == 1 and lines[0].startswith("etcdfence: error: "):
        assert "Traceback" not in result.stderr and len(lines[0]) < 400
        return None
    return f"exit {result.returncode}: {result.stderr[-300:]!r}"


@pytest.mark.integration
def test_every_table_input_through_the_cli_option_and_environment(
    env: dict[str, str], etcd_namespace: str
) -> None:
    """``etcdfence fence put`` on a real etcd, the token as ``--token=TEXT`` and as
    ``ETCDFENCE_TOKEN``: a valid one is written (a fresh resource per run, so no token is
    stale), a bad one exits 2 with one line, and so does a valid one above etcd's
    revision (``MAX_TOKEN``: a token from the future)."""
    revision = advance_revision([env["ETCDFENCE_ENDPOINTS"]], 100)  # past 12, 7, 1
    runs: list[tuple[str, str, int | None, list[str], dict[str, str]]] = []
    for i, (text, want) in enumerate(TABLE):
        if "\x00" in text:  # argv and the environment cannot carry NUL
            continue
        if want is not None and want > revision:
            want = None  # refused: FutureTokenError, exit 2 with one line
        data_key = f"{etcd_namespace}/k{i}"
        by_option = ["fence", "put", f"{etcd_namespace}/o{i}", data_key, "v", f"--token={text}"]
        runs.append((text, "--token", want, by_option, env))
        by_env = ["fence", "put", f"{etcd_namespace}/e{i}", data_key, "v"]
        runs.append((text, "env", want, by_env, {**env, "ETCDFENCE_TOKEN": text}))
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda run: cli(run[3], run[4]), runs))
    wrong: dict[str, object] = {}
    futures = 0
    for (text, how, want, _, _), result in zip(runs, results, strict=True):
        if (got := cli_verdict(result)) != want:
            wrong[f"{how} {ascii(text)[:40]}"] = got
        futures += "above etcd's current revision" in result.stderr
    assert not wrong, f"the CLI differs from the table: {wrong}"
    assert futures == 2  # MAX_TOKEN, by option and by environment


@pytest.mark.parametrize("how", ["--token", "ETCDFENCE_TOKEN", "ETCD_LOCK_REV"])
def test_a_5000_digit_token_is_cli_exit_2_with_one_line(how: str) -> None:
    env = clean_env(ETCDFENCE_ENDPOINTS="http://127.0.0.1:1")  # never reached
    args = ["fence", "put", "r", "k", "v"]
    if how == "--token":
        args += ["--token", LONG]
    else:
        env[how] = LONG
    result = cli(args, env)
    assert cli_verdict(result) is None, result
    assert "5000 digits" in result.stderr


# ------------------------------------------------------------------ the examples


def run_example(
    script: str, args: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )


#: Every example that reads a token from text: its arguments but the token.
TOKEN_EXAMPLES = {
    "fenced_config.py": ["--endpoints", "http://127.0.0.1:1", "--key", "k", "--value", "v"],
    "fenced_sql_writer.py": ["--dsn", "sqlite:///{db}", "--value", "v"],
    "fenced_redis.py": ["--redis", "127.0.0.1:1", "--key", "k", "--value", "v"],
    "http_service.py": ["put", "--url", "http://127.0.0.1:1", "--key", "k", "--value", "v"],
}
BAD_FOR_EXAMPLES = [LONG, "１２", "1_000", "\xa012", "0", "-5"]


@pytest.mark.parametrize("script", sorted(TOKEN_EXAMPLES))
def test_examples_exit_2_on_a_bad_token_from_the_option_or_the_environment(
    script: str, tmp_path: Path
) -> None:
    """Nothing reachable is configured: a token that got through would end in another
    exit code (or a write to the SQLite file, which must not appear)."""
    db = tmp_path / "fenced.db"
    args = [a.replace("{db}", str(db)) for a in TOKEN_EXAMPLES[script]]
    runs = [(text, [*args, f"--token={text}"], clean_env()) for text in BAD_FOR_EXAMPLES]
    runs += [(text, args, clean_env(ETCDFENCE_TOKEN=text)) for text in BAD_FOR_EXAMPLES]
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda run: run_example(script, run[1], run[2]), runs))
    wrong: dict[str, object] = {}
    for (text, run_args, _), result in zip(runs, results, strict=True):
        how = "--token" if run_args is not args else "env"
        lines = result.stderr.strip().splitlines()
        if result.returncode != 2 or len(lines) != 1 or "Traceback" in result.stderr:
            wrong[f"{how} {ascii(text)[:30]}"] = (result.returncode, result.stderr[-200:])
        elif len(lines[0]) > 400:
            wrong[f"{how} {ascii(text)[:30]}"] = f"a {len(lines[0])}-character line"
    assert not wrong, wrong
    if db.exists():
        with contextlib.closing(sqlite3.connect(db)) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "fenced_kv" not in tables, "a bad token got as far as the database"


def test_fenced_config_does_not_take_the_lock_when_the_environment_token_is_bad() -> None:
    """A token in the environment that does not parse is an error (exit 2), not a reason
    to fall back to taking the lock itself (it swallowed InvalidToken before)."""
    result = run_example(
        "fenced_config.py",
        ["--endpoints", "http://127.0.0.1:1", "--key", "k", "--value", "v"],
        clean_env(ETCD_LOCK_REV="12abc"),
    )
    assert result.returncode == 2, result
    assert "ETCD_LOCK_REV" in result.stderr and "acquired" not in result.stdout
    assert os.linesep.join(result.stderr.strip().splitlines()[1:]) == ""
