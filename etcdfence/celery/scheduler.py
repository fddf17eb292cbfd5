"""The beat side: :class:`LeaderScheduler`, a Celery beat that sends only while it leads.

Run it as ``celery -A proj beat --scheduler etcdfence.celery:LeaderScheduler`` on as many
hosts as you like (it campaigns in a background thread), or under the supervisor,
``etcdfence run NAME --id ID -- celery -A proj beat --scheduler ...`` (it takes the
term's token from the environment and the supervisor stops it on loss).

A term, from election to loss:

1. the schedule state's fence (``<election>/state``) is advanced to the term's token:
   from now on a zombie beat cannot record a slot;
2. the workers' mark is advanced (``etcdfence_advance(token)``, by default the etcd
   fence ``etcdfence_resource``): from now on no worker applies a task of an older term;
3. the SENT records (``<prefix>sent/<entry>/<slot id>``, ``{"token", "sent"}``: one
   per published slot, with its unix send time) are read; every slot *sent* within the
   last ``etcdfence_resend_window`` seconds — by send time, not by scheduled time, so
   a catch-up's old slots count from when they went out — is sent again with this
   term's token (and recorded as sent again, so a further failover resends it too):
   the older term's copies still queued are refused as stale from step 2 on, so
   without this they would never be applied. With the default etcd fence the beat
   reads which of them the workers applied already (one range read of their slot keys
   per entry) and resends only the others; with a custom ``etcdfence_fence_factory``
   it resends them all and the workers' slot keys drop the applied ones. Only slots a
   beat published are resent, whatever the schedule is now. SENT records older than
   the window are deleted (through the state fence) here and, a few at a time, with
   each later record. State written before SENT records existed has none: nothing to
   resend then. Each entry resumes with the slot after the last recorded one
   (bounded catch-up: at most ``etcdfence_catchup`` missed slots per entry are sent,
   the older ones are skipped with the warning ``etcdfence.celery_slots_skipped``).
   With the default etcd fence the term also prunes the workers' slot keys of slots
   no accepted message can name any more (``_prune``: at or before the recorded slot,
   not resent by this term, its SENT record deleted, applied by an older term), a
   bounded page per tick, through the state fence;
4. for every due slot: check the term still holds (the elector's belief and the
   session's local deadline; under ``etcdfence run`` the local deadline of the
   supervisor's lease, ``ETCDFENCE_LEASE``, renewed by one ``LeaseTimeToLive`` read
   once past), publish with the ``fencing-token`` and
   ``etcdfence-slot`` headers, then record the slot — the entry's last slot and the
   slot's SENT record, one transaction through the state fence (publish-then-record:
   a crash in between means the next leader sends the slot again, and the workers'
   slot key applies it once).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from celery.beat import Scheduler

from .. import metrics
from .._sync.client import Client
from .._sync.elector import LeaderElector
from .._sync.session import Session, default_margin
from .._wire import messages as m
from ..errors import EtcdfenceError, InvalidTokenError, StaleTokenError, UnavailableError
from ..fence.ops import Delete, Op, Put
from ..token import ENV_VARS, FencingToken
from ._config import CeleryConfigError, Settings, _quote
from ._prune import SlotPruner
from ._slots import Clock, clock_for, parse_time, slot_id, utc_text
from .worker import SLOT_HEADER, TOKEN_HEADER

__all__ = ["ElectorDiedError", "LeaderScheduler"]

log = metrics.log
_UTC = dt.timezone.utc
#: Expired SENT records deleted along with one record at most (an etcd txn is bounded).
_PRUNE_PER_RECORD = 16
#: Expired SENT records deleted per transaction at election.
_PRUNE_BATCH = 100


@dataclass
class _Term:
    """One leadership term as the beat sees it."""

    token: FencingToken
    session: Session | None  # None under `etcdfence run` (the supervisor bounds the term)
    state: Any  # the FenceGuard of the schedule state
    #: under `etcdfence run`: the supervisor's lease (ETCDFENCE_LEASE), read for a local
    #: deadline; None in elect mode (the session has one) or with no lease in the env
    lease: _EnvLease | None = None
    #: the workers' slot keys this term prunes (default etcd fence only)
    pruner: SlotPruner | None = None
    next: dict[str, dt.datetime] = field(default_factory=dict)
    resend: dict[str, list[dt.datetime]] = field(default_factory=dict)
    #: the SENT records this term knows of (key -> unix send time), oldest send first:
    #: the ones older than the resend window are deleted along with later records
    sent: dict[str, float] = field(default_factory=dict)
    over: bool = False


class _EnvLease:
    """The local deadline of a supervised beat's term (``etcdfence run``): the lease of
    the supervisor's leader key (``ETCDFENCE_LEASE``) cannot expire before
    ``send time + remaining TTL`` of a ``LeaseTimeToLive`` read, so until then this beat
    still leads without asking; past it, one read renews it — or finds the lease gone
    (``-1``: the term is over for good) or etcd unreachable (not leading, for now). The
    supervisor's reaper kills the beat by its own deadline; this check covers a beat
    that runs on while its supervisor and reaper are frozen or slow (a paused host
    resuming), so it never publishes past the term."""

    def __init__(self, client: Client, lease_id: int, timeout: float) -> None:
        self.client, self.lease_id, self.timeout = client, lease_id, timeout
        self.deadline = 0.0
        self.gone = False

    def alive(self) -> bool:
        if self.gone:
            return False
        if time.monotonic() < self.deadline:
            return True
        sent = time.monotonic()
        try:
            ttl = self.client.lease_time_to_live(self.lease_id, timeout=self.timeout)
        except EtcdfenceError as err:
            log.warning("etcdfence.celery_lease_unknown", lease=self.lease_id, error=str(err))
            return False
        if ttl < 0:
            self.gone = True
            log.warning("etcdfence.celery_lease_gone", lease=self.lease_id)
            return False
        self.deadline = sent + ttl - default_margin(max(1, ttl))
        return time.monotonic() < self.deadline


class ElectorDiedError(RuntimeError):
    """The beat's elector thread ended while the beat was running: this beat can never
    lead again, so ``tick()`` raises this and ``celery beat`` exits non-zero (for a
    supervisor to restart it) instead of living on without scheduling anything."""


class LeaderScheduler(Scheduler):  # type: ignore[misc]
    """A Celery beat scheduler that sends periodic tasks only while it leads, each with
    the term's fencing token and its slot id in the headers; see the module docstring
    and the README's "Exactly one Celery beat". Configured through ``app.conf``'s
    ``etcdfence_*`` keys (:class:`~etcdfence.celery.Settings`)."""

    #: Seconds ``tick()`` asks beat to sleep while this beat does not lead.
    idle_interval = 0.25

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self.settings = Settings.from_app(app)  # before Scheduler.__init__ sets up
        _require_confirms(app)  # before the beat's broker connection is made
        self._term: _Term | None = None
        self._client: Client | None = None
        self._elector: LeaderElector | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self._elector_error: BaseException | None = None
        self._clocks: dict[str, Clock] = {}
        super().__init__(app, *args, **kwargs)

    # -- start and stop ---------------------------------------------------------------

    def setup_schedule(self) -> None:
        super().setup_schedule()
        self._clocks = {name: clock_for(name, e.schedule) for name, e in self.data.items()}
        self._client = _connect(self.settings)
        if self._mode() == "env":
            token = _env_token(self.settings)
            term = self._begin(token, None)
            if token.lease_id is not None:
                term.lease = _EnvLease(self._client, token.lease_id, self.settings.timeout)
            self._term = term
            return
        self._elector = LeaderElector(
            self._client,
            self.settings.election,
            identity=self.settings.identity,
            ttl=self.settings.ttl,
            on_lost=self._drop_term,
        )
        self._thread = threading.Thread(
            target=self._elect, name="etcdfence-beat-elector", daemon=True
        )
        self._thread.start()

    def _mode(self) -> str:
        mode = self.settings.mode
        if mode == "auto":
            has_token = any(os.environ.get(v, "").strip(" \t") for v in ENV_VARS)
            return "env" if has_token else "elect"
        return mode

    def close(self) -> None:
        """Stop campaigning (resign if leading) and close the etcd client."""
        self._closing = True
        self._term = None
        if self._elector is not None:
            self._elector.stop()
        if self._thread is not None:
            self._thread.join(10.0)
        if self._client is not None:
            self._client.close()
        super().close()

    def _elect(self) -> None:
        elector = self._elector
        assert elector is not None
        try:
            elector.run(self._work)
        except BaseException as exc:  # a bug of ours must not leave beat believing it leads
            self._term = None
            self._elector_error = exc
            log.exception("etcdfence.celery_elector_failed", election=self.settings.election)

    def _check_elector(self) -> None:
        """Raise :class:`ElectorDiedError` when the elector thread ended without
        :meth:`close`: the process must not live on without ever leading again."""
        thread = self._thread
        if thread is None or thread.is_alive() or self._closing:
            return
        error = self._elector_error
        raise ElectorDiedError(
            f"the beat's elector thread for election {self.settings.election!r} ended "
            f"({error!r}): this beat can no longer lead; exiting so that a supervisor "
            "restarts it"
        ) from error

    def _work(self, token: FencingToken, stop: threading.Event) -> None:
        """The elector's work: set up the term, then hold it until ``stop``."""
        assert self._elector is not None
        try:
            term = self._begin(token, self._elector.session)
        except Exception as err:  # a newer term advanced the marks, etcd or the store of
            log.warning(  # the etcdfence_advance hook (any error, ConnectionError...) failed
                "etcdfence.celery_term_failed",
                election=self.settings.election,
                token=token.value,
                error=repr(err),
            )
            return  # the elector resigns, then campaigns again after its retry interval
        self._term = term
        try:
            stop.wait()
        finally:
            self._drop_term(term)

    def _drop_term(self, term: _Term | None = None) -> None:
        current = self._term
        if current is not None and (term is None or current is term):
            current.over = True
            self._term = None
            log.info(
                "etcdfence.celery_term_ended",
                election=self.settings.election,
                token=current.token.value,
            )

    # -- a term's start ---------------------------------------------------------------

    def _begin(self, token: FencingToken, session: Session | None) -> _Term:
        """Fence the state and the workers at ``token``, then read where to resume."""
        client, s = self._client, self.settings
        assert client is not None
        state = client.fence(s.state_resource, lock=s.election)
        state.advance(token)  # no zombie records a slot from here on
        if s.fencing:  # (False: the unsafe control of the tests, no workers' mark)
            if s.fence_factory is None:  # the workers' fence is ours: advance it ourselves
                client.fence(s.resource, lock=s.election).advance(token)
            if s.advance is not None:  # their own store's mark (or an extra step)
                s.advance(token)
        term = _Term(token, session, state)
        records = _read_sent(client, s)
        horizon = time.time() - s.resend_window
        left = _prune(state, token, [r.key for r in records if r.sent < horizon])
        recent = sorted((r for r in records if r.sent >= horizon), key=lambda r: r.sent)
        kept = sorted((r for r in records if r.key in left), key=lambda r: r.sent)
        term.sent = {r.key: r.sent for r in [*kept, *recent]}  # what is in etcd, oldest first
        now = dt.datetime.now(_UTC)
        for name, clock in self._clocks.items():
            recorded = _recorded_slot(client, s.state_key(name), name)
            start = clock.first(now) if recorded is None else clock.after(recorded)
            term.next[name], skipped = clock.skip_to(start, now, s.catchup)
            if skipped:
                _warn_skipped(name, skipped, term.next[name], s.catchup)
            mine = s.sent_prefix(name)
            slots = sorted({r.at for r in recent if r.key.startswith(mine)})
            term.resend[name] = _unapplied(client, s, name, slots)
        if s.slots_visible:
            resent = frozenset(
                _quote(slot_id(name, at)) for name, ats in term.resend.items() for at in ats
            )
            term.pruner = SlotPruner.read(client, s, token, resent, term.sent)
        log.info(
            "etcdfence.celery_term_started",
            election=s.election,
            token=token.value,
            resume={name: utc_text(at) for name, at in term.next.items()},
            resend={name: len(ats) for name, ats in term.resend.items()},
            resend_window=s.resend_window,
        )
        return term

    # -- sending ----------------------------------------------------------------------

    def _leading(self, term: _Term) -> bool:
        """Whether ``term`` still holds right now: checked before every publish, so a
        beat that was frozen past its deadline sends nothing when it resumes."""
        if term.over or self._term is not term:
            return False
        if term.session is None:  # under `etcdfence run`: the supervisor's lease
            if term.lease is None or term.lease.alive():
                return True
            if term.lease.gone:  # for good: the supervisor stops this beat
                self._drop_term(term)
            return False
        elector = self._elector
        if elector is None or not elector.is_leader():
            return False
        return time.monotonic() < term.session.deadline

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Send every due slot while leading; return the seconds until the next one
        (``idle_interval`` while not leading). Raises :class:`ElectorDiedError` once the
        elector thread died (``celery beat`` then exits non-zero)."""
        self._check_elector()
        term = self._term
        if term is None or not self._leading(term):
            return self.idle_interval
        now = dt.datetime.now(_UTC)
        wait = float(self.max_interval)
        for name, entry in list(self.data.items()):
            due = self._send_due(term, name, entry, now)
            if due is None:
                return self.idle_interval
            wait = min(wait, (due - now).total_seconds())
        pruner = term.pruner
        if pruner is not None:
            self._prune_slots(term, pruner)
            wait = min(wait, pruner.next_step - time.monotonic())
        return max(0.0, wait)

    def _prune_slots(self, term: _Term, pruner: SlotPruner) -> None:
        """One bounded step of pruning the workers' slot keys (``_prune``), when due."""
        if not pruner.due() or not self._leading(term):
            return
        try:
            pruner.step(term.state)
        except StaleTokenError as err:  # a newer term fenced the state: we are a zombie
            log.warning("etcdfence.celery_term_fenced_off", error=str(err))
            self._drop_term(term)
        except EtcdfenceError as err:  # tried again later
            log.warning("etcdfence.celery_slot_prune_failed", error=str(err))
            pruner.next_step = time.monotonic() + 5.0

    def _send_due(self, term: _Term, name: str, entry: Any, now: dt.datetime) -> dt.datetime | None:
        """Send ``name``'s due slots; return its next slot, ``None`` when the term ended."""
        clock = self._clocks.get(name)
        if clock is None:  # an entry added after start-up
            clock = self._clocks[name] = clock_for(name, entry.schedule)
            term.next[name] = clock.first(now)
        if not self._resend(term, name, entry, term.resend.get(name)):
            return now + self._idle if self._leading(term) else None
        at, skipped = clock.skip_to(term.next[name], now, self.settings.catchup)
        if skipped:
            _warn_skipped(name, skipped, at, self.settings.catchup)
        while at <= now:
            if not self._leading(term):
                return None
            if not self._publish(term, entry, at):
                return now + self._idle  # try again soon
            sent, at = at, clock.after(at)
            term.next[name] = at
            if not self._record(term, name, sent):
                return None
        term.next[name] = at
        return at

    @property
    def _idle(self) -> dt.timedelta:
        return dt.timedelta(seconds=self.idle_interval)

    def _resend(
        self, term: _Term, name: str, entry: Any, pending: list[dt.datetime] | None
    ) -> bool:
        """Send the term's resends of ``entry`` (slots an older term sent within the
        window), oldest first, each recorded as sent again; False while some are left
        (the term ended or the broker failed: the caller stops this tick)."""
        while pending:
            if not self._leading(term) or not self._publish(term, entry, pending[0], "resent"):
                return False
            if not self._record(term, name, pending.pop(0), last=False):
                return False
        return True

    def _publish(self, term: _Term, entry: Any, at: dt.datetime, how: str = "sent") -> bool:
        slot = slot_id(entry.name, at)
        options = dict(entry.options)
        headers = dict(options.pop("headers", None) or {})
        headers.update(
            {"celery_beat_task": True, TOKEN_HEADER: term.token.to_text(), SLOT_HEADER: slot}
        )
        task = self.app.tasks.get(entry.task)
        try:
            if task is not None:
                task.apply_async(
                    entry.args, entry.kwargs, producer=self.producer, headers=headers, **options
                )
            else:
                self.send_task(
                    entry.task,
                    entry.args,
                    entry.kwargs,
                    producer=self.producer,
                    headers=headers,
                    **options,
                )
        except Exception as exc:  # the broker: try again on the next tick
            log.error(
                "etcdfence.celery_publish_failed", entry=entry.name, slot=slot, error=str(exc)
            )
            return False
        event = f"etcdfence.celery_slot_{how}"
        log.info(event, entry=entry.name, slot=slot, token=term.token.value)
        return True

    def _record(self, term: _Term, name: str, at: dt.datetime, *, last: bool = True) -> bool:
        """Record slot ``at`` just published: as SENT (with the time now) and, unless
        it is a resend (``last=False``), as the entry's last slot — one transaction
        through the state fence, which also deletes a few SENT records older than the
        resend window. False when that showed the term is over."""
        s, token = self.settings, term.token.value
        now = time.time()
        key = s.sent_key(name, slot_id(name, at))
        ops: list[Op] = [Put(key, json.dumps({"token": token, "sent": round(now, 3)}))]
        if last:
            record = json.dumps({"slot": utc_text(at), "token": token})
            ops.insert(0, Put(s.state_key(name), record))
        expired = _expired(term.sent, now - s.resend_window, key)
        ops.extend(Delete(k) for k in expired)
        term.sent.pop(key, None)
        term.sent[key] = now
        try:
            term.state.txn(term.token, ops)
            for k in expired:
                term.sent.pop(k, None)
        except StaleTokenError as err:  # a newer term fenced the state: we are a zombie
            log.warning("etcdfence.celery_term_fenced_off", entry=name, error=str(err))
            self._drop_term(term)
            return False
        except EtcdfenceError as err:  # sent, not recorded: resent later, applied once
            log.warning("etcdfence.celery_record_failed", entry=name, error=str(err))
        return True


def _require_confirms(app: Any) -> None:
    """On RabbitMQ (an ``amqp`` transport) the beat publishes with publisher confirms:
    a slot is recorded as sent only once the broker took it, so a publish the broker
    dropped or refused (a full queue with ``reject-publish``, a node going down) raises,
    is logged (``etcdfence.celery_publish_failed``) and is tried again on the next tick
    instead of being recorded as sent and lost. ``confirm_publish`` unset is turned on;
    set to anything but True it is a :class:`CeleryConfigError`. (Redis: a publish is
    a command whose reply is the confirmation; nothing to set.)"""
    connection = app.connection_for_write()  # not connected: only its transport is read
    try:
        driver = connection.transport.driver_type
    finally:
        connection.release()
    if driver != "amqp":
        return
    options = dict(app.conf.broker_transport_options or {})
    confirm = options.get("confirm_publish")
    if confirm is True:
        return
    if confirm is not None:
        raise CeleryConfigError(
            f"broker_transport_options['confirm_publish'] is {confirm!r}: on RabbitMQ the "
            "etcdfence beat needs publisher confirms — without them a publish the broker "
            "dropped would be recorded as sent and the slot never sent again; remove the "
            "setting (the beat turns confirms on) or set it to True"
        )
    options["confirm_publish"] = True
    app.conf.broker_transport_options = options
    log.info("etcdfence.celery_confirm_publish", confirm_publish=True)


def _connect(settings: Settings) -> Client:
    """An etcd client, checked reachable now: an unreachable etcd at start-up is a clear
    error, not a beat that silently never leads."""
    try:
        client = Client(settings.endpoints, timeout=settings.timeout)
    except EtcdfenceError as err:
        raise CeleryConfigError(f"etcdfence_endpoints: {err}") from None
    try:
        client.revision(timeout=settings.timeout)
    except UnavailableError as err:
        client.close()
        where = ", ".join(settings.endpoints or ["127.0.0.1:2379"])
        raise CeleryConfigError(
            f"etcd is unreachable at {where} (etcdfence_endpoints / $ETCDFENCE_ENDPOINTS): {err}"
        ) from None
    return client


def _env_token(settings: Settings) -> FencingToken:
    """The term's token from ``etcdfence run``; it must be of ``etcdfence_election``."""
    try:
        token = FencingToken.from_env()
    except InvalidTokenError as err:
        raise CeleryConfigError(f"etcdfence_mode is 'env' but {err}") from None
    if token.lock != settings.election:
        raise CeleryConfigError(
            f"the token in the environment is of election {token.lock!r}, but "
            f"etcdfence_election is {settings.election!r}: run "
            f"`etcdfence run {settings.election} --id ID -- celery ... beat ...` "
            "or set etcdfence_election to the supervisor's election"
        )
    return token


def _recorded_slot(client: Client, key: str, entry: str) -> dt.datetime | None:
    """The last slot recorded for ``entry`` (``None``: none, or unreadable)."""
    kv = client.get(key)
    if kv is None:
        return None
    try:
        return parse_time(json.loads(kv.value)["slot"])
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        log.warning("etcdfence.celery_bad_state", entry=entry, key=key, error=str(err))
        return None


@dataclass(frozen=True)
class _Sent:
    """One SENT record: its key, the slot it names and its unix send time."""

    key: str
    at: dt.datetime
    sent: float


def _read_sent(client: Client, s: Settings) -> list[_Sent]:
    """Every SENT record of every entry (one range read). A record that cannot be read
    (not ours, damaged) is logged and left alone."""
    head = s.sent_prefix()
    records = []
    for kv in client.get_prefix(head, timeout=s.timeout):
        key = kv.key.decode("utf-8", "replace")
        try:
            slot = key[len(head) :].split("/", 1)[1]
            at = parse_time(slot.rsplit("@", 1)[1])
            sent = float(json.loads(kv.value)["sent"])
        except (ValueError, KeyError, TypeError, IndexError) as err:
            log.warning("etcdfence.celery_bad_sent_record", key=key, error=str(err))
            continue
        records.append(_Sent(key, at, sent))
    return records


def _prune(state: Any, token: FencingToken, keys: list[str]) -> set[str]:
    """Delete the SENT records ``keys`` (older than the window) through the state fence;
    return the ones left (a failure other than a newer term's fence is only logged: the
    term deletes them later, with its records)."""
    for i in range(0, len(keys), _PRUNE_BATCH):
        try:
            state.txn(token, [Delete(k) for k in keys[i : i + _PRUNE_BATCH]])
        except StaleTokenError:
            raise
        except EtcdfenceError as err:
            log.warning("etcdfence.celery_prune_failed", keys=len(keys), error=str(err))
            return set(keys[i:])
    return set()


def _expired(sent: dict[str, float], horizon: float, keep: str) -> list[str]:
    """The first few SENT records (oldest send first) sent before ``horizon``."""
    out: list[str] = []
    for key, at in sent.items():
        if at >= horizon or len(out) >= _PRUNE_PER_RECORD:
            break
        if key != keep:
            out.append(key)
    return out


def _unapplied(
    client: Client, s: Settings, name: str, slots: list[dt.datetime]
) -> list[dt.datetime]:
    """Of ``slots`` (sorted) of entry ``name``, the ones a new term resends: with the
    default etcd fence only those whose slot key the workers have not created; else
    all (the workers' slot keys drop the applied ones)."""
    if not slots or not s.slots_visible:
        return slots
    try:
        applied = _applied(client, s, name, slots)
    except EtcdfenceError as err:  # resend them all: the workers' slot keys drop copies
        log.warning("etcdfence.celery_applied_unknown", entry=name, error=str(err))
        return slots
    return [at for at in slots if slot_id(name, at) not in applied]


def _applied(client: Client, s: Settings, name: str, slots: list[dt.datetime]) -> set[str]:
    """The ids of ``slots`` (sorted) whose slot key exists: one range read over the
    keys from the first slot's second to past the last one's (the texts of one
    second do not sort by time, those of different seconds do)."""
    head = s.slot_key(name + "@")
    low = head + utc_text(slots[0])[:19]
    high = head + utc_text(slots[-1] + dt.timedelta(seconds=1))[:19]
    request = m.RangeRequest(key=low.encode(), range_end=high.encode(), keys_only=True)
    reply = client.connection.call("Range", request, timeout=s.timeout, idempotent=True)
    found = {kv.key.decode("utf-8", "replace") for kv in reply.kvs}
    return {slot_id(name, at) for at in slots if s.slot_key(slot_id(name, at)) in found}


def _warn_skipped(entry: str, skipped: int, resume: dt.datetime, catchup: int) -> None:
    log.warning(
        "etcdfence.celery_slots_skipped",
        entry=entry,
        skipped=skipped,
        resume=utc_text(resume),
        catchup=catchup,
    )
