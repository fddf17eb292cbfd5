"""etcdfence.celery without a broker: the settings' checks, the slot arithmetic, and the
worker side (FencedTask / fenced_task) run in-process through Celery's ``apply()`` with
real tokens from real elections and a real etcd fence; the scheduler's start-up errors.
The real beat and worker processes on RabbitMQ and Redis are in tests/test_celery.py."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, schedules
from celery.schedules import crontab
from conftest import clean_env
from structlog.testing import capture_logs

import etcdfence as ef
from etcdfence import metrics
from etcdfence.celery import (
    CeleryConfigError,
    Fenced,
    FencedTask,
    LeaderScheduler,
    Settings,
    fenced_task,
    refusals,
)
from etcdfence.celery._slots import clock_for, parse_time, slot_id, utc_text
from etcdfence.testing import EtcdServer

UTC = dt.timezone.utc
HERE = Path(__file__).resolve().parent


def at(text: str) -> dt.datetime:
    return parse_time(text)


# -- settings -------------------------------------------------------------------------


def app_with(**conf: Any) -> Celery:
    app = Celery("settings_test")
    app.conf.update(conf)
    return app


def test_settings_defaults_derive_from_the_app_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETCDFENCE_ENDPOINTS", "10.0.0.1:2379,10.0.0.2:2379")
    s = Settings.from_app(app_with())
    assert (s.election, s.resource, s.prefix) == (
        "celery/settings_test/beat",
        "celery/settings_test",
        "/etcdfence/celery/settings_test/",
    )
    assert s.endpoints == ["10.0.0.1:2379", "10.0.0.2:2379"]
    assert (s.ttl, s.catchup, s.mode, s.fencing) == (10, 10, "auto", True)
    assert s.resend_window == 600.0 and s.slots_visible
    assert s.state_key("a/b") == "/etcdfence/celery/settings_test/schedule/a%2Fb"
    assert s.slot_key("tick@2025-01-01T00:00:00Z").endswith("slots/tick@2025-01-01T00:00:00Z")


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"etcdfence_ttl": 0}, "etcdfence_ttl must be a whole number of seconds >= 1"),
        ({"etcdfence_ttl": "5"}, "etcdfence_ttl must be a whole number"),
        ({"etcdfence_ttl": True}, "etcdfence_ttl must be a whole number"),
        ({"etcdfence_election": ""}, "etcdfence_election must not be empty"),
        ({"etcdfence_election": "jobs/"}, "etcdfence_election must not end with '/'"),
        ({"etcdfence_resource": 5}, "etcdfence_resource must be str"),
        ({"etcdfence_catchup": 0}, "etcdfence_catchup must be a whole number >= 1"),
        ({"etcdfence_resend_window": -1}, "etcdfence_resend_window must be a number of sec"),
        ({"etcdfence_resend_window": "600"}, "etcdfence_resend_window must be a number"),
        ({"etcdfence_timeout": float("nan")}, "etcdfence_timeout must be a number > 0"),
        ({"etcdfence_mode": "leader"}, "etcdfence_mode must be one of"),
        ({"etcdfence_prefix": "/no-slash"}, "etcdfence_prefix must be text ending in '/'"),
        ({"etcdfence_endpoints": []}, "etcdfence_endpoints must be"),
        ({"etcdfence_fencing": "no"}, "etcdfence_fencing must be True or False"),
        ({"etcdfence_advance": "no_such_module_x:f"}, "etcdfence_advance: cannot load"),
        ({"etcdfence_advance": 5}, "etcdfence_advance must be a callable"),
        ({"etcdfence_fence_factory": "builtins:id"}, "etcdfence_fence_factory needs etcdfence_adv"),
        ({"etcdfence_ttll": 3}, r"unknown setting\(s\) etcdfence_ttll"),
    ],
)
def test_bad_settings_are_clear_errors(conf: dict[str, Any], message: str) -> None:
    with pytest.raises(CeleryConfigError, match=message):
        Settings.from_app(app_with(**conf))


def test_an_unnamed_app_must_name_its_election() -> None:
    with pytest.raises(CeleryConfigError, match="set etcdfence_election and etcdfence_resource"):
        Settings.from_app(Celery())


# -- slots ----------------------------------------------------------------------------


def test_interval_slots_are_multiples_of_the_period_since_the_epoch() -> None:
    clock = clock_for("e", _interval(10))
    assert clock.first(at("2025-01-01T00:00:01.5Z")) == at("2025-01-01T00:00:10Z")
    assert clock.first(at("2025-01-01T00:00:10Z")) == at("2025-01-01T00:00:10Z")
    assert clock.after(at("2025-01-01T00:00:10Z")) == at("2025-01-01T00:00:20Z")
    # bounded catch-up: of the 6 slots due from :00 to :50, the last 3 are kept
    assert clock.skip_to(at("2025-01-01T00:00:00Z"), at("2025-01-01T00:00:55Z"), 3) == (
        at("2025-01-01T00:00:30Z"),
        3,
    )
    assert clock.skip_to(at("2025-01-01T00:00:40Z"), at("2025-01-01T00:00:55Z"), 3) == (
        at("2025-01-01T00:00:40Z"),
        0,
    )


def _interval(seconds: float) -> Any:
    from celery.schedules import schedule

    return schedule(dt.timedelta(seconds=seconds))


def test_crontab_slots_follow_the_crontab_in_utc() -> None:
    app = Celery("x")
    app.conf.timezone = "UTC"
    clock = clock_for("c", crontab(minute="*/15", app=app))
    assert clock.first(at("2025-01-01T10:07:00Z")) == at("2025-01-01T10:15:00Z")
    assert clock.first(at("2025-01-01T10:15:00Z")) == at("2025-01-01T10:15:00Z")
    assert clock.after(at("2025-01-01T10:45:00Z")) == at("2025-01-01T11:00:00Z")
    start, skipped = clock.skip_to(at("2025-01-01T10:00:00Z"), at("2025-01-01T12:01:00Z"), 2)
    assert (start, skipped) == (at("2025-01-01T11:45:00Z"), 7)  # 9 due, the last 2 kept


def test_slot_ids_are_the_entry_and_its_scheduled_utc_time() -> None:
    moment = dt.datetime(2025, 1, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert slot_id("nightly", moment) == "nightly@2025-01-01T10:00:00Z"
    assert utc_text(at("2025-01-01T10:00:00.25Z")) == "2025-01-01T10:00:00.250000Z"


def test_schedules_whose_slots_depend_on_now_are_refused() -> None:
    class Jittered(schedules.BaseSchedule):  # type: ignore[misc]
        """A made-up kind (solar needs the ephem package): due "about every minute"."""

    with pytest.raises(CeleryConfigError, match="interval and crontab entries, not Jittered"):
        clock_for("about", Jittered())


# -- the worker side ------------------------------------------------------------------


@pytest.fixture
def fenced_app(etcd_endpoints: list[str], etcd_namespace: str) -> Iterator[Celery]:
    app = Celery("fenced_worker_test")
    app.conf.update(
        task_always_eager=False,
        etcdfence_endpoints=etcd_endpoints,
        etcdfence_election=f"{etcd_namespace}/beat",
        etcdfence_resource=f"{etcd_namespace}/workers",
        etcdfence_prefix=f"/{etcd_namespace}/",
    )
    yield app


@pytest.fixture
def term(etcd_client: ef.Client, etcd_namespace: str) -> Callable[[], ef.FencingToken]:
    """``term()``: the token of a new term of the beats' election (each larger)."""

    def new_term() -> ef.FencingToken:
        with etcd_client.session(ttl=5) as session:
            election = session.election(f"{etcd_namespace}/beat")
            token = election.campaign(b"beat")
            election.resign()
        return token

    return new_term


def effects(client: ef.Client, ns: str) -> list[dict[str, Any]]:
    return [json.loads(kv.value) for kv in client.get_prefix(f"/{ns}/effects/")]


def make_task(app: Celery, ns: str, **options: Any) -> Any:
    @fenced_task(app, name=f"{ns}.effect", **options)
    def effect(fenced: Fenced, label: str) -> int:
        return fenced.put(f"/{ns}/effects/{label}", json.dumps({"token": fenced.token.value}))

    return effect


def send(task: Any, token: ef.FencingToken | str | None, slot: str | None, label: str) -> Any:
    headers: dict[str, str] = {}
    if token is not None:
        headers["fencing-token"] = token if isinstance(token, str) else token.to_text()
    if slot is not None:
        headers["etcdfence-slot"] = slot
    return task.apply((label,), headers=headers)


def test_a_current_task_runs_once_per_slot(
    fenced_app: Celery, etcd_client: ef.Client, etcd_namespace: str, term: Any
) -> None:
    task = make_task(fenced_app, etcd_namespace)
    token = term()
    before = refusals["duplicate"]
    first = send(task, token, "tick@2025-01-01T00:00:00Z", "1")
    assert first.state == "SUCCESS" and first.result > 0
    again = send(task, term(), "tick@2025-01-01T00:00:00Z", "2")  # a newer term's resend
    assert again.state == "IGNORED" and "duplicate" in str(again.result)
    assert refusals["duplicate"] == before + 1
    assert [e["token"] for e in effects(etcd_client, etcd_namespace)] == [token.value]
    other = send(task, token, None, "3")  # no slot: fenced by the token only
    assert other.state == "SUCCESS"


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (None, "no_token"),
        ("12x", "invalid"),
        ("7", "foreign"),  # a bare number
        ('7; lock="someone/else"', "foreign"),
    ],
)
def test_tokenless_malformed_and_foreign_tasks_are_refused(
    fenced_app: Celery,
    etcd_client: ef.Client,
    etcd_namespace: str,
    header: str | None,
    reason: str,
) -> None:
    task = make_task(fenced_app, etcd_namespace)
    before = refusals[reason]
    with capture_logs() as logs:  # whatever logging an earlier test configured
        result = send(task, header, "tick@2025-01-01T00:00:00Z", "1")
    assert result.state == "IGNORED" and str(result.result).startswith(reason)
    assert refusals[reason] == before + 1
    assert effects(etcd_client, etcd_namespace) == []
    assert any(e["event"] == "etcdfence.task_refused" for e in logs), logs


def test_a_stale_task_is_refused_before_it_runs_and_not_retried(
    fenced_app: Celery, etcd_client: ef.Client, etcd_namespace: str, term: Any
) -> None:
    ran: list[int] = []

    @fenced_task(fenced_app, name=f"{etcd_namespace}.retrying", autoretry_for=(Exception,))
    def retrying(fenced: Fenced) -> None:
        ran.append(fenced.token.value)
        fenced.put(f"/{etcd_namespace}/effects/r", json.dumps({"token": fenced.token.value}))

    old, new = term(), term()
    etcd_client.fence(f"{etcd_namespace}/workers", lock=f"{etcd_namespace}/beat").advance(new)
    before = refusals["stale"]
    result = retrying.apply(headers={"fencing-token": old.to_text()})
    assert result.state == "IGNORED" and str(result.result).startswith("stale")
    assert ran == [] and refusals["stale"] == before + 1
    assert effects(etcd_client, etcd_namespace) == []


def test_a_task_fenced_off_while_it_runs_is_refused_at_its_write(
    fenced_app: Celery, etcd_client: ef.Client, etcd_namespace: str, term: Any
) -> None:
    """The mark moves after the pre-check: the fenced write itself refuses it."""
    guard = etcd_client.fence(f"{etcd_namespace}/workers", lock=f"{etcd_namespace}/beat")
    newer: list[ef.FencingToken] = []

    class Racing(FencedTask):  # type: ignore[misc]
        pass

    @fenced_task(fenced_app, name=f"{etcd_namespace}.racing", base=Racing)
    def racing(fenced: Fenced) -> None:
        newer.append(term())
        guard.advance(newer[0])  # a new beat's election, mid-task
        fenced.put(f"/{etcd_namespace}/effects/x", "{}")

    result = racing.apply(headers={"fencing-token": term().to_text()})
    assert result.state == "IGNORED" and str(result.result).startswith("stale")
    assert effects(etcd_client, etcd_namespace) == []


def test_refusals_are_prometheus_counters(
    fenced_app: Celery, etcd_namespace: str, term: Any
) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    metrics.enable_metrics(registry)
    try:
        task = make_task(fenced_app, etcd_namespace)
        send(task, None, None, "1")
        token = term()
        send(task, token, "s@2025-01-01T00:00:00Z", "2")
        send(task, token, "s@2025-01-01T00:00:00Z", "3")
        name = f"{etcd_namespace}.effect"
        value = registry.get_sample_value
        labels = {"task": name, "reason": "no_token"}
        assert value("etcdfence_tasks_refused_total", labels) == 1.0
        labels["reason"] = "duplicate"
        assert value("etcdfence_tasks_refused_total", labels) == 1.0
    finally:
        metrics.disable_metrics()


def test_fenced_task_refuses_a_base_that_is_not_fenced(fenced_app: Celery) -> None:
    with pytest.raises(TypeError, match="must be a FencedTask subclass"):
        fenced_task(fenced_app, base=object)


# -- the scheduler's start-up errors ----------------------------------------------------


def test_an_unreachable_etcd_is_a_clear_error_at_start() -> None:
    app = app_with(etcdfence_endpoints="127.0.0.1:1", etcdfence_timeout=0.5)
    with pytest.raises(CeleryConfigError, match=r"etcd is unreachable at 127\.0\.0\.1:1") as info:
        LeaderScheduler(app)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_env_mode_refuses_a_token_of_another_election(
    fenced_app: Celery, monkeypatch: pytest.MonkeyPatch, term: Any
) -> None:
    for name, value in term().to_env().items():
        monkeypatch.setenv(name, value)
    fenced_app.conf.etcdfence_election = "another/election"
    with pytest.raises(CeleryConfigError, match="etcdfence_election is 'another/election'"):
        LeaderScheduler(fenced_app)
    monkeypatch.delenv("ETCDFENCE_TOKEN")
    fenced_app.conf.etcdfence_mode = "env"
    with pytest.raises(CeleryConfigError, match="etcdfence_mode is 'env' but no fencing token"):
        LeaderScheduler(fenced_app)


def test_import_etcdfence_does_not_import_celery() -> None:
    import subprocess
    import sys

    code = "import sys, etcdfence; etcdfence.FencingToken; assert 'celery' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_crontab_catch_up_over_years_counts_every_skipped_slot() -> None:
    app = Celery("x")
    app.conf.timezone = "UTC"
    clock = clock_for("c", crontab(minute="*", app=app))  # 525,600 slots a year
    start, skipped = clock.skip_to(at("2024-01-01T00:00:00Z"), at("2024-03-31T00:00:30Z"), 3)
    assert start == at("2024-03-30T23:58:00Z")
    assert 100_000 <= skipped <= (31 + 29 + 30) * 1440 + 1 - 3  # counted up to 100,000


# -- an apply tried again after a lost answer ---------------------------------------------


@pytest.fixture(scope="module")
def private_etcd() -> Iterator[EtcdServer]:
    """An etcd of this module's own: these tests SIGSTOP it."""
    with EtcdServer() as server:
        yield server


def test_an_apply_tried_again_after_a_lost_answer_keeps_the_slot_once(
    private_etcd: EtcdServer, etcd_namespace: str
) -> None:
    """The task's first ``put`` gets no answer (etcd SIGSTOPped: OutcomeUnknownError);
    etcd resumes and the task puts again, as a task would. That second apply must still
    carry the slot's ``Create`` (fencing the lost attempt off first), so the next
    delivery of the slot — a newer term's resend — is a duplicate: the slot is applied
    once, whether or not the lost attempt had landed."""
    ns = etcd_namespace
    app = Celery("lost_answer_test")
    app.conf.update(
        etcdfence_endpoints=private_etcd.endpoints,
        etcdfence_election=f"{ns}/beat",
        etcdfence_resource=f"{ns}/workers",
        etcdfence_prefix=f"/{ns}/",
        etcdfence_timeout=1.0,
    )
    outcomes: list[tuple[str, int]] = []

    @fenced_task(app, name=f"{ns}.lost")
    def effect(fenced: Fenced, label: str, blip: bool) -> None:
        key, value = f"/{ns}/effects/{fenced.slot}/{label}", "{}"
        if blip:
            private_etcd.pause()
        try:
            outcomes.append(("first", fenced.put(key, value)))
        except ef.OutcomeUnknownError:
            private_etcd.resume()
            outcomes.append(("again", fenced.put(key, value)))

    slot = "tick@2025-01-01T00:00:00Z"
    with ef.Client(private_etcd.endpoints, timeout=5.0) as client:
        try:
            old, new = (_campaign(client, f"{ns}/beat") for _ in range(2))
            first = effect.apply(("a", True), headers=_headers(old, slot))
            assert first.state == "SUCCESS", first.result
            again = effect.apply(("b", False), headers=_headers(new, slot))
            applied = [kv.key for kv in client.get_prefix(f"/{ns}/effects/{slot}/")]
        finally:
            if private_etcd.paused:
                private_etcd.resume()
            client.delete(f"/{ns}/", prefix=True)
            client.delete(f"/etcdfence/fence/{ns}/", prefix=True)
    assert [how for how, _ in outcomes] == ["again"], outcomes
    assert applied == [f"/{ns}/effects/{slot}/a".encode()], applied
    assert again.state == "IGNORED" and str(again.result).startswith("duplicate")


def _campaign(client: ef.Client, election: str) -> ef.FencingToken:
    with client.session(ttl=5) as session:
        e = session.election(election)
        token = e.campaign(b"beat")
        e.resign()
    return token


def _headers(token: ef.FencingToken, slot: str) -> dict[str, str]:
    return {"fencing-token": token.to_text(), "etcdfence-slot": slot}


# -- a worker with bad settings does not start ----------------------------------------------


def test_a_worker_with_bad_settings_refuses_to_start(tmp_path: Path) -> None:
    """A real ``celery worker`` of an app with fenced tasks and a bad ``etcdfence_*``
    value exits non-zero at start, naming the key (no task is needed to find out)."""
    env = clean_env(
        CELERY_TEST_CONF=json.dumps({"etcdfence_ttl": 0}),
        CELERY_TEST_BROKER="memory://",
        CELERY_TEST_LOG=str(tmp_path / "events.jsonl"),
        PYTHONPATH=str(HERE),
    )
    args = [sys.executable, "-m", "celery", "-A", "_celery_app", "worker", "-P", "solo"]
    done = subprocess.run(
        [*args, "--without-mingle", "--without-gossip", "-l", "info"],
        env=env,
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=30,  # (a worker that starts would run until then)
    )
    assert done.returncode != 0, done.stdout + done.stderr
    assert "the worker does not start: etcdfence_ttl must be a whole number" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


# -- pruning the slot keys: the rule, and no zombie prunes ---------------------------------


@pytest.mark.integration
def test_slot_keys_are_pruned_by_the_rule_and_never_by_a_zombie(
    fenced_app: Celery,
    etcd_client: ef.Client,
    etcd_namespace: str,
    term: Callable[[], ef.FencingToken],
) -> None:
    """A term prunes a slot key only when the slot is at or before the recorded slot,
    not resent by the term, has no SENT record left and was applied by an older term;
    the deletes go through the state fence, so a term a newer one fenced off (a zombie
    beat) prunes nothing (StaleTokenError)."""
    from etcdfence.celery._prune import SlotPruner

    s = Settings.from_app(fenced_app)
    older, zombie, current = term(), term(), term()
    recorded = at("2025-01-01T00:00:10Z")
    etcd_client.put(s.state_key("tick"), json.dumps({"slot": utc_text(recorded), "token": 1}))

    def slot(second: int, token: int) -> str:
        sid = slot_id("tick", at(f"2025-01-01T00:00:{second:02d}Z"))
        etcd_client.put(s.slot_key(sid), json.dumps({"token": token}))
        return sid

    prunable = slot(1, older.value)
    later = slot(11, older.value)  # after the recorded slot: may be sent again
    own = slot(2, current.value)  # applied by the term itself
    resent = slot(3, older.value)  # the term resends it
    in_window = slot(4, older.value)  # its SENT record is still there
    sent = {s.sent_key("tick", in_window): 0.0}
    state = etcd_client.fence(s.state_resource, lock=s.election)
    state.advance(current)  # the current term took office: `zombie` is fenced off

    def keys() -> set[str]:
        head = f"{s.prefix}slots/"
        return {kv.key.decode()[len(head) :] for kv in etcd_client.get_prefix(head)}

    everything = keys()
    with pytest.raises(ef.StaleTokenError):
        SlotPruner.read(etcd_client, s, zombie, frozenset(), {}).step(state)
    assert keys() == everything, "a zombie pruned"
    pruner = SlotPruner.read(etcd_client, s, current, frozenset({resent}), sent)
    assert pruner.step(state) == 1
    assert keys() == everything - {prunable}
    assert {later, own, resent, in_window} <= keys()


@pytest.mark.integration
def test_an_apply_whose_lost_attempt_landed_is_found_not_refused(
    etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    """The other outcome of the lost answer above, made certain: the lost attempt *did*
    land (its slot key holds this delivery's value). The retry must find it (return 0,
    the task succeeds) instead of refusing its own slot as a duplicate. (Before the fix
    the check compared the key's ``str`` value with ``bytes``, so it never matched.)"""
    ns = etcd_namespace
    app = Celery("lost_landed_test")
    app.conf.update(
        etcdfence_endpoints=etcd_endpoints,
        etcdfence_election=f"{ns}/beat",
        etcdfence_resource=f"{ns}/workers",
        etcdfence_prefix=f"/{ns}/",
    )
    results: list[int] = []

    @fenced_task(app, name=f"{ns}.landed")
    def effect(fenced: Fenced) -> None:
        key = f"/{ns}/effects/{fenced.slot}"
        results.append(fenced.put(key, "{}"))  # lands, answer "lost" below
        fenced._slot_state = "unknown"  # what OutcomeUnknownError leaves behind
        results.append(fenced.put(key, "{}"))

    slot = "tick@2025-01-01T00:00:00Z"
    with ef.Client(etcd_endpoints, timeout=5.0) as client:
        try:
            outcome = effect.apply(headers=_headers(_campaign(client, f"{ns}/beat"), slot))
        finally:
            client.delete(f"/{ns}/", prefix=True)
            client.delete(f"/etcdfence/fence/{ns}/", prefix=True)
    assert outcome.state == "SUCCESS", outcome.result
    assert results[0] > 0 and results[1] == 0, results
