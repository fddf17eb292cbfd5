"""Tokens that know their lock (issue #24, first part): ``FencingToken`` carries the lock
or election name and the etcd cluster id besides value, key, create revision and lease;
every carrier (env, the ``Fencing-Token`` header, message metadata, the CLI's exported
variables, etcdctl's ``ETCD_LOCK_REV``/``ETCD_LOCK_KEY``) round-trips every field and
still reads a bare number; bad input is an ``InvalidTokenError`` naming the carrier.

The tables run in process; the rest talks to a real etcd (both twins), a real
``etcdctl lock``, the real ``etcdfence lock`` / ``run`` commands and a real uvicorn.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest
from _contender_proc import Api, api_fixture
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import etcdfence as ef
from etcdfence.http import FencingMiddleware, fencing_token, request_token
from etcdfence.token import MAX_TEXT, MAX_TOKEN, FencingToken, Sequencer, lock_name_of, parse_token

api = api_fixture()
PYTHON = sys.executable
CLUSTER = 14841639068965178418  # a real-looking uint64 (above int64's range)
LEASE = 0x694D7A6D3E4B1C05
FULL = FencingToken(
    123,
    key="jobs/nightly/694d7a6d3e4b1c05",
    create_revision=120,
    lease_id=LEASE,
    cluster_id=CLUSTER,
)
FULL_TEXT = (
    f'123; lock="jobs/nightly"; cluster={CLUSTER}; key="jobs/nightly/694d7a6d3e4b1c05"; '
    f"crev=120; lease={LEASE}"
)

# ----------------------------------------------------------------------------- lock names

LOCK_NAME_OF: list[tuple[str | None, str | None]] = [
    ("jobs/nightly/694d7a6d3e4b1c05", "jobs/nightly"),
    ("a/1", "a"),
    ("ns/jobs/beef/1f", "ns/jobs/beef"),  # only the last segment is the lease
    ("x/ffffffffffffffff", "x"),  # 16 hex digits: the widest lease id
    ("x/1ffffffffffffffff", None),  # 17: not a lease
    ("x/694D7A6D", None),  # etcd writes lowercase hex
    ("x/", None),
    ("/1f", None),  # nothing before the suffix
    (" x/1f", None),  # not a valid name before it
    ("x//1f", None),  # the name would end with '/'
    ("nolease", None),
    ("x/1g", None),
    (None, None),
]


@pytest.mark.parametrize(("key", "name"), LOCK_NAME_OF)
def test_lock_name_of_strips_the_lease_suffix(key: str | None, name: str | None) -> None:
    assert lock_name_of(key) == name
    assert FencingToken.lock_name_of(key) == name  # the same helper on the class
    if key is not None and name is not None:
        assert FencingToken(5, key=key).lock == name  # derived when not given


def test_the_full_token_and_what_compares() -> None:
    """``str`` is the bare number; ``==``/hash/order use the revision alone (a bare number
    read back equals the holder's token); ``sequencer`` is the hold's identity."""
    assert FULL.lock == "jobs/nightly" and FULL.cluster_id == CLUSTER
    assert str(FULL) == "123" and int(FULL) == 123
    assert FULL.to_header() == ("Fencing-Token", FULL_TEXT)
    assert FULL.to_metadata() == {"fencing-token": FULL_TEXT}
    other = FencingToken(123, lock="locks/billing", cluster_id=1)
    assert other == FULL and hash(other) == hash(FULL) and FencingToken(123) == FULL
    assert other.sequencer != FULL.sequencer
    assert FULL.sequencer == Sequencer(
        "jobs/nightly", CLUSTER, "jobs/nightly/694d7a6d3e4b1c05", 120, LEASE, 123
    )
    assert FencingToken(7).bare and not FULL.bare
    assert FencingToken(7).to_header() == ("Fencing-Token", "7")  # no fields: bare


def test_an_old_reader_refuses_the_full_form_instead_of_misreading_it() -> None:
    """A reader that only knows bare numbers (``parse_token``, 0.x middlewares) sees a
    ``;`` after the digits and refuses: a bound token never passes as a bare one."""
    with pytest.raises(ef.InvalidTokenError):
        parse_token(FULL_TEXT)
    with pytest.raises(ef.InvalidTokenError):
        parse_token(FULL_TEXT.encode("ascii"))


# ------------------------------------------------------------------ the one-value form

#: (value text, the sequencer it is, or the words of the InvalidTokenError)
TEXT_TABLE: list[tuple[str, Sequencer | str]] = [
    ("5", Sequencer(None, None, None, None, None, 5)),
    (" 5 ", Sequencer(None, None, None, None, None, 5)),
    (FULL_TEXT, FULL.sequencer),
    (FULL_TEXT.replace("; ", ";"), FULL.sequencer),  # RFC 8941's own serialization
    (FULL_TEXT.replace("; ", " \t;\t "), FULL.sequencer),  # OWS around ';'
    ('5;lock="a"', Sequencer("a", None, None, None, None, 5)),
    ("5; cluster=1", Sequencer(None, 1, None, None, None, 5)),
    (f"5; cluster={2**64 - 1}", Sequencer(None, 2**64 - 1, None, None, None, 5)),
    ('5; key="a/1f"', Sequencer("a", None, "a/1f", None, None, 5)),  # lock derived
    ('5; lock="a \\"b\\" \\\\c"', Sequencer('a "b" \\c', None, None, None, None, 5)),
    ('5; lock=%"jobs/%d0%bd%d0%be%d1%87%d1%8c"', Sequencer("jobs/ночь", None, None, None, None, 5)),
    ('5; lock=%"a%25b%22"', Sequencer('a%b"', None, None, None, None, 5)),
    ('5; lock=%"a;b"', Sequencer("a;b", None, None, None, None, 5)),
    ('5; lock="a;b=c"', Sequencer("a;b=c", None, None, None, None, 5)),
    (f"5; crev={MAX_TOKEN}; lease=1", Sequencer(None, None, None, MAX_TOKEN, 1, 5)),
    # malformed parameters
    ("5;", "expected a parameter name"),
    ("5; ", "expected a parameter name"),
    ('5;; lock="a"', "expected a parameter name"),
    ('5; Lock="a"', "expected a parameter name"),
    ('5; lock="a";', "expected a parameter name"),
    ("5; lock", "needs a value"),
    ('5; lock ="a"', "needs a value"),
    ('5; lock= "a"', "must be a quoted string"),
    ("5; lock=a", "must be a quoted string"),
    ("5; lock='a'", "must be a quoted string"),
    ('5; lock="a', "unterminated string"),
    ('5; lock="a\\', "a backslash escapes only"),
    ('5; lock="a\\n"', "a backslash escapes only"),
    ('5; lock=%"a%2"', "2 lowercase hex"),
    ('5; lock=%"a%2F"', "2 lowercase hex"),
    ('5; lock=%"%ff"', "not valid UTF-8"),
    ('5; lock="a" x', "expected ';' or the end"),
    ('5; lock="a", 6', "expected ';' or the end"),  # two headers joined by a WSGI server
    ('5; lock="a"; lock="a"', "lock given twice"),
    ("5; cluster=1; cluster=1", "cluster given twice"),
    ('5; lok="a"', "unknown parameter 'lok'"),
    ("5; sig=1", "unknown parameter 'sig'"),
    ('5; lock="a"; mode="x"', "unknown parameter 'mode'"),
    # the number keeps parse_token's rules
    ('; lock="a"', "is empty"),
    ('05x; lock="a"', "digits 0-9 only"),
    ('0; lock="a"', "must be positive"),
    (f'{MAX_TOKEN + 1}; lock="a"', "int64"),
    # forbidden characters in a lock name
    ('5; lock="a/"', "ends with '/'"),
    ('5; lock=" a"', "starts or ends with whitespace"),
    ('5; lock=""', "is empty"),
    ('5; lock=%"a%00b"', "contains NUL"),
    ('5; lock="a\x7f"', "printable ASCII"),
    ('5; lock="a\x01"', "printable ASCII"),
    ('5; lock="a\nb"', "printable ASCII"),
    ('5; lock="é"', "printable ASCII"),
    # numbers
    ("5; cluster=0", "cluster (a uint64) must be from 1"),
    (f"5; cluster={2**64}", "cluster (a uint64) must be from 1"),
    ("5; cluster=" + "1" * 21, "at most 20"),
    ("5; cluster=-1", "must be a decimal number"),
    ("5; cluster=0x1f", "must be a decimal number"),
    ("5; crev=1.5", "must be a decimal number"),
    ('5; cluster="1"', "must be a decimal number"),
    ("5; crev=0", "crev (an int64) must be from 1"),
    (f"5; lease={MAX_TOKEN + 1}", "lease (an int64) must be from 1"),
    # consistency and size
    ('5; key="a/1f"; lock="b"', "is not the lock of key"),
    ('5; lock="' + "x" * MAX_TEXT + '"', "characters long, at most"),
]
TEXT_IDS = [f"{i:02d}-{ascii(text)[:28]}" for i, (text, _) in enumerate(TEXT_TABLE)]


def _text_paths(text: str) -> dict[str, Any]:
    raw = text.encode("utf-8")
    return {
        "Fencing-Token header": lambda: FencingToken.from_header(text),
        "Fencing-Token header (bytes)": lambda: FencingToken.from_header(raw),
        "Fencing-Token header (wsgi)": lambda: FencingToken.from_header(raw.decode("latin-1")),
        "metadata 'fencing-token'": lambda: FencingToken.from_metadata({"fencing-token": text}),
        "metadata b'Fencing-Token'": lambda: FencingToken.from_metadata([(b"Fencing-Token", raw)]),
        "Fencing-Token header (request_token)": lambda: request_token(
            "PUT", [(b"fencing-token", raw)]
        ),
    }


@pytest.mark.parametrize(("text", "expected"), TEXT_TABLE, ids=TEXT_IDS)
def test_the_one_value_form_on_every_one_slot_carrier(text: str, expected: Any) -> None:
    for carrier, read in _text_paths(text).items():
        if isinstance(expected, Sequencer):
            assert read().sequencer == expected, carrier
            continue
        with pytest.raises(ef.InvalidTokenError) as caught:
            read()
        message = str(caught.value)
        assert expected in message, (carrier, message)
        assert message.startswith(carrier.split(" (")[0]), (carrier, message)
        assert len(message) < 400, message


def test_an_oversized_token_is_refused_when_sent() -> None:
    with pytest.raises(ef.InvalidTokenError, match="too long to send"):
        FencingToken(5, lock="x" * MAX_TEXT).to_header()
    assert len(FencingToken(5, lock="x" * 900, cluster_id=1).to_text()) < MAX_TEXT


# ----------------------------------------------------------------------------- the env

SEQ = Sequencer
#: (environment, the sequencer read, or the words of the InvalidTokenError)
ENV_TABLE: list[tuple[dict[str, str], Sequencer | str]] = [
    ({"ETCDFENCE_TOKEN": "5"}, SEQ(None, None, None, None, None, 5)),
    ({"ETCD_LOCK_REV": "5"}, SEQ(None, None, None, None, None, 5)),
    (FULL.to_env(), FULL.sequencer),
    (
        {"ETCDFENCE_TOKEN": "5", "ETCDFENCE_LOCK": "jobs/ночь", "ETCDFENCE_CLUSTER": " 7 "},
        SEQ("jobs/ночь", 7, None, None, None, 5),
    ),
    (
        {"ETCDFENCE_TOKEN": "5", "ETCDFENCE_KEY": "a/b/1f"},
        SEQ("a/b", None, "a/b/1f", None, None, 5),
    ),
    # etcdctl's family: the lock name from ETCD_LOCK_KEY
    (
        {"ETCD_LOCK_REV": "9", "ETCD_LOCK_KEY": "jobs/nightly/694d7a6d3e4b1c05"},
        SEQ("jobs/nightly", None, "jobs/nightly/694d7a6d3e4b1c05", None, None, 9),
    ),
    ({"ETCD_LOCK_REV": "9", "ETCD_LOCK_KEY": "odd-key"}, SEQ(None, None, "odd-key", None, None, 9)),
    # the same-family rule: no field pairs with the other family's value
    (
        {"ETCD_LOCK_REV": "9", "ETCDFENCE_LOCK": "other", "ETCDFENCE_CLUSTER": "3"},
        SEQ(None, None, None, None, None, 9),
    ),
    (
        {"ETCDFENCE_TOKEN": "5", "ETCD_LOCK_REV": "9", "ETCD_LOCK_KEY": "outer/1"},
        SEQ(None, None, None, None, None, 5),
    ),
    # empty is unset (what to_env writes for a missing field)
    (
        {"ETCDFENCE_TOKEN": "5", "ETCDFENCE_LOCK": "", "ETCDFENCE_CLUSTER": " "},
        SEQ(None, None, None, None, None, 5),
    ),
    ({"ETCDFENCE_TOKEN": "5", "ETCDFENCE_CLUSTER": "0"}, "ETCDFENCE_CLUSTER: a cluster id"),
    ({"ETCDFENCE_TOKEN": "5", "ETCDFENCE_CLUSTER": str(2**64)}, "ETCDFENCE_CLUSTER: a cluster"),
    ({"ETCDFENCE_TOKEN": "5", "ETCDFENCE_CLUSTER": "0x1f"}, "ETCDFENCE_CLUSTER: a cluster id"),
    ({"ETCDFENCE_TOKEN": "5", "ETCDFENCE_CLUSTER": "-1"}, "must be ASCII digits"),
    ({"ETCDFENCE_TOKEN": "5", "ETCDFENCE_LEASE": "1.5"}, "ETCDFENCE_LEASE: a lease id"),
    ({"ETCDFENCE_TOKEN": "5", "ETCDFENCE_CREATE_REVISION": "x"}, "ETCDFENCE_CREATE_REVISION"),
    ({"ETCDFENCE_TOKEN": "5", "ETCDFENCE_LOCK": "a/"}, "ETCDFENCE_LOCK: lock name 'a/' ends"),
    ({"ETCDFENCE_TOKEN": "5", "ETCDFENCE_LOCK": "a\x00b"}, "contains NUL"),
    (
        {"ETCDFENCE_TOKEN": "5", "ETCDFENCE_KEY": "a/1f", "ETCDFENCE_LOCK": "b"},
        "ETCDFENCE_TOKEN / ETCDFENCE_KEY / ETCDFENCE_LOCK: lock 'b' is not the lock of key",
    ),
    ({"ETCDFENCE_TOKEN": "5x", "ETCDFENCE_LOCK": "a"}, "ETCDFENCE_TOKEN must be"),
]


@pytest.mark.parametrize(
    ("env", "expected"), ENV_TABLE, ids=[str(i) for i in range(len(ENV_TABLE))]
)
def test_the_environment(env: dict[str, str], expected: Sequencer | str) -> None:
    if isinstance(expected, Sequencer):
        assert FencingToken.from_env(env).sequencer == expected
        return
    with pytest.raises(ef.InvalidTokenError) as caught:
        FencingToken.from_env(env)
    assert expected in str(caught.value)


def test_to_env_blanks_missing_fields_so_no_outer_field_survives() -> None:
    """``env.update(token.to_env())`` over an outer lock's variables leaves none of the
    outer token's fields beside the inner value."""
    outer = dict(FULL.to_env())
    outer.update(FencingToken(200).to_env())
    assert FencingToken.from_env(outer).sequencer == SEQ(None, None, None, None, None, 200)


def test_bad_fields_in_the_constructor() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"lock": "a/"}, "ends with '/'"),
        ({"lock": 5}, "must be text"),
        ({"cluster_id": 0}, "uint64"),
        ({"cluster_id": 2**64}, "uint64"),
        ({"cluster_id": True}, "must be an int"),
        ({"cluster_id": "7"}, "must be an int"),
        ({"lease_id": 0}, "lease id"),
        ({"key": ""}, "key must be"),
        ({"key": "a/1f", "lock": "b"}, "is not the lock of key"),
    ]
    for kwargs, words in cases:
        with pytest.raises(ef.InvalidTokenError, match=r"^FencingToken: ") as caught:
            FencingToken(5, **kwargs)
        assert words in str(caught.value), kwargs


# -------------------------------------------------------------------- round-trip property

_NAME_CHARS = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")


@st.composite
def tokens(draw: Any) -> FencingToken:
    """Any token a carrier must round-trip: names of any text etcdfence accepts."""
    lock = draw(
        st.none()
        | st.text(_NAME_CHARS, min_size=1, max_size=60).filter(
            lambda s: s == s.strip() and s.strip() != "" and not s.endswith("/")
        )
    )
    lease = draw(st.none() | st.integers(1, MAX_TOKEN))
    key = None
    if draw(st.booleans()):
        if lock is not None and lease is not None:
            key = f"{lock}/{lease:x}"
        else:
            key = draw(st.text(_NAME_CHARS, min_size=1, max_size=60))
            if lock is not None and lock_name_of(key) not in (None, lock):
                key = None
    return FencingToken(
        draw(st.integers(1, MAX_TOKEN)),
        key=key,
        create_revision=draw(st.none() | st.integers(1, MAX_TOKEN)),
        lease_id=lease,
        lock=lock,
        cluster_id=draw(st.none() | st.integers(1, 2**64 - 1)),
    )


def _carried(token: FencingToken) -> dict[str, FencingToken | None]:
    text = token.to_header()[1]
    assert text.isascii() and text.isprintable()
    return {
        "env": FencingToken.from_env(token.to_env()),
        "header str": FencingToken.from_header(text),
        "header bytes": FencingToken.from_header(text.encode("ascii")),
        "request_token": request_token("PUT", [(b"fencing-token", text.encode("ascii"))]),
        "metadata dict": FencingToken.from_metadata(token.to_metadata()),
        "metadata kafka": FencingToken.from_metadata(
            [(k, v.encode("ascii")) for k, v in token.to_metadata().items()]
        ),
    }


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tokens())
def test_every_carrier_round_trips_every_field(token: FencingToken) -> None:
    for carrier, back in _carried(token).items():
        assert back is not None and back.sequencer == token.sequencer, carrier


@settings(max_examples=300, deadline=None)
@given(st.integers(1, MAX_TOKEN))
def test_every_carrier_reads_a_bare_number(value: int) -> None:
    for carrier, back in _carried(FencingToken(value)).items():
        assert back is not None and back.sequencer == SEQ(None, None, None, None, None, value)
        assert back.lock is None and back.cluster_id is None, carrier


# ------------------------------------------------------------------------ real etcd


async def _cluster_id(api: Api, client: Any = None) -> int:
    status = await api((client or api.client).status)
    cluster: int = status["cluster_id"]
    assert cluster > 0
    return cluster


def _assert_bound(token: FencingToken, name: str, cluster: int, session: Any) -> None:
    assert token.lock == name and token.cluster_id == cluster, token.sequencer
    assert token.key == f"{name}/{session.lease_id:x}" and token.lease_id == session.lease_id
    assert lock_name_of(token.key) == name
    back = FencingToken.from_header(token.to_header()[1])
    assert back.sequencer == token.sequencer
    assert FencingToken.from_env(token.to_env()).sequencer == token.sequencer


@pytest.mark.integration
async def test_lock_and_election_tokens_name_their_lock_and_cluster(
    api: Api, etcd_namespace: str
) -> None:
    """The first-acquire path, the waited path and an election campaign: each token
    names its own lock and the cluster id the client sees (``status()``)."""
    cluster = await _cluster_id(api)
    name = etcd_namespace + "/jobs/beef"  # a last segment that looks like hex
    async with api.session(ttl=10) as first, api.session(ttl=10) as second:
        lock = first.lock(name)
        token = await api(lock.acquire)
        _assert_bound(token, name, cluster, first)
        waiting = api.spawn(second.lock(name).acquire)
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await api(lock.release)
        waited = await asyncio.wait_for(waiting, 10)
        _assert_bound(waited, name, cluster, second)
        assert waited > token
        election = first.election(etcd_namespace + "/leader")
        term = await api(election.campaign, "me")
        _assert_bound(term, etcd_namespace + "/leader", cluster, first)
        other = first.lock(etcd_namespace + "/other")
        assert (await api(other.acquire)).lock == etcd_namespace + "/other"


def _count_crowd_waits(api: Api, lock: Any, crowd: list[Any]) -> None:
    """Record in ``crowd`` each wait of ``lock`` in the shared queue view."""
    original = lock._wait_in_crowd

    async def counted(*args: Any) -> Any:
        crowd.append(lock)
        return await original(*args)

    def counted_sync(*args: Any) -> Any:
        crowd.append(lock)
        return original(*args)

    lock._wait_in_crowd = counted if api.is_async else counted_sync


@pytest.mark.integration
async def test_crowd_waiters_tokens_name_their_lock_and_cluster(
    api: Api, etcd_namespace: str
) -> None:
    """Contenders of one client queued on one name wait in the client's shared queue
    view (``queue.py``); the tokens it grants carry the lock and cluster too."""
    cluster = await _cluster_id(api)
    name = etcd_namespace + "/crowd"
    sessions = [await api.open_session(ttl=10) for _ in range(4)]
    try:
        locks = [s.lock(name) for s in sessions]
        crowd: list[Any] = []
        for lock in locks:
            _count_crowd_waits(api, lock, crowd)
        _assert_bound(await api(locks[0].acquire), name, cluster, sessions[0])
        waiting = {api.spawn(lock.acquire): i for i, lock in enumerate(locks) if i}
        await asyncio.sleep(0.3)
        holder = 0
        while waiting:
            await api(locks[holder].release)
            done, _ = await asyncio.wait(waiting, timeout=10, return_when="FIRST_COMPLETED")
            assert len(done) == 1, "one waiter (exactly) gets the lock"
            task = done.pop()
            holder = waiting.pop(task)
            _assert_bound(task.result(), name, cluster, sessions[holder])
        assert crowd, "no waiter went through the shared queue view"
    finally:
        for session in sessions:
            await api.close(session)


# ------------------------------------------------------------------ processes and HTTP

#: a child that prints the token it reads from its environment, as JSON
SHOW_ENV = (
    "import json, etcdfence as ef; t = ef.FencingToken.from_env(); "
    "print(json.dumps(t.sequencer._asdict()))"
)


#: the same, and the token etcdctl's two variables alone give must name the same lock
SHOW_BOTH = (
    "import os; import etcdfence as ef; "
    "ctl = {k: os.environ[k] for k in ('ETCD_LOCK_REV', 'ETCD_LOCK_KEY')}; "
    "c, t = ef.FencingToken.from_env(ctl), ef.FencingToken.from_env(); "
    "assert (c.lock, c.key, c.value) == (t.lock, t.key, t.value), (c, t); " + SHOW_ENV
)


def _shown(stdout: str) -> Sequencer:
    return Sequencer(**json.loads(stdout.strip().splitlines()[-1]))


@pytest.mark.integration
def test_etcdctl_lock_child_reads_the_lock_name_from_etcd_lock_key(
    etcdctl: str, etcd_endpoints: list[str], etcd_namespace: str, etcd_client: Any
) -> None:
    """Under a real ``etcdctl lock NAME -- cmd`` the command's ``from_env()`` token names
    NAME (from ``ETCD_LOCK_KEY``, lease suffix stripped); etcdctl sets no cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    env["ETCDCTL_API"] = "3"
    name = etcd_namespace + "/jobs/nightly"
    child = [PYTHON, "-c", SHOW_ENV]
    result = subprocess.run(
        [etcdctl, "--endpoints=" + ",".join(etcd_endpoints), "lock", name, "--", *child],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    seq = _shown(result.stdout)
    assert seq.lock == name and seq.cluster_id is None
    assert seq.key is not None and seq.key.startswith(name + "/") and seq.revision > 0


@pytest.mark.integration
def test_etcdfence_lock_and_run_export_the_whole_token(
    env: dict[str, str], etcd_namespace: str, etcd_client: Any
) -> None:
    """``etcdfence lock`` and ``etcdfence run`` give their command every field (and
    etcdctl's two variables): the child's token is the holder's, lock and cluster too."""
    cluster = etcd_client.status()["cluster_id"]
    name = etcd_namespace + "/cli"
    cmd = [PYTHON, "-m", "etcdfence"]
    locked = subprocess.run(
        [*cmd, "lock", name, "--", PYTHON, "-c", SHOW_BOTH],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert locked.returncode == 0, locked.stderr
    seq = _shown(locked.stdout)
    assert seq.lock == name and seq.cluster_id == cluster and seq.lease_id is not None
    assert seq.key == f"{name}/{seq.lease_id:x}" and seq.create_revision is not None
    stale = {**env, "ETCDFENCE_LOCK": "outer/lock", "ETCDFENCE_CLUSTER": "1"}
    ran = subprocess.run(
        [*cmd, "run", name + "-run", "--id", "me", "--", PYTHON, "-c", SHOW_ENV],
        capture_output=True,
        text=True,
        env=stale,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert ran.returncode == 0, ran.stderr
    seq = _shown(ran.stdout)
    assert seq.lock == name + "-run" and seq.cluster_id == cluster, "an outer field survived"


def _echo_app() -> Any:
    """An ASGI app behind FencingMiddleware answering the sequencer it was handed."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = json.dumps(fencing_token(scope).sequencer._asdict()).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    return FencingMiddleware(app)


@pytest.mark.integration
def test_the_http_transport_sends_the_whole_token_to_a_real_uvicorn(
    etcd_client: Any, etcd_namespace: str
) -> None:
    """FencingTransport stamps the full form; the middleware on a real uvicorn hands the
    handler a token with the holder's lock and cluster; a bare number still passes."""
    from test_http import FencingTransport, serve_asgi

    name = etcd_namespace + "/http"
    with etcd_client.session(ttl=10) as session, serve_asgi(_echo_app()) as url:
        lock = session.lock(name)
        token = lock.acquire()
        with httpx.Client(base_url=url, transport=FencingTransport(lock)) as http:
            answer = http.put("/w", content=b"x")
        assert answer.status_code == 200, answer.text
        assert Sequencer(**answer.json()) == token.sequencer
        assert token.lock == name and token.cluster_id == etcd_client.status()["cluster_id"]
        bare = httpx.put(url + "/w", headers={"Fencing-Token": str(token)})
        assert Sequencer(**bare.json()) == SEQ(None, None, None, None, None, token.value)
        bad = httpx.put(url + "/w", headers={"Fencing-Token": f'{token}; lock="a"; lock="a"'})
        assert bad.status_code == 400 and "given twice" in bad.json()["error"]
