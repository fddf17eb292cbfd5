"""A hypothesis state machine over campaign / resign / pause (orphan the session) / revoke
lease / write / blackhole / heal / wait, with every safety invariant checked after every step.

Three in-process contenders each reach the cluster through their own
:class:`~etcdfence.testing.FaultProxy`. Hypothesis picks the steps; after each one the
ground-truth observer catches up and :func:`~etcdfence.history.check` runs on
the whole history so far. Rules draw their arguments independently of the state (a
rule that does not apply is a no-op): the system under test is timing-dependent, and
hypothesis must be able to replay the same choices.

What ends a contender's *belief* that it leads (see :mod:`etcdfence.history`):
``resign`` (recorded before the call), its session's local deadline (an orphaned or cut
off session — "pause" stops the keepalives without telling anyone), and ``revoke``:
an operator revoking the lease takes leadership away at once, and the contender cannot
know before its keepalive tells it, so the machine records the loss at the revoke.
Writes always use the contender's latest token, also after it lost (zombie writes).
"""

from __future__ import annotations

import collections
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

import etcdfence as ef
from etcdfence.history import CheckResult, History, Layout, Observer, Recorder, check
from etcdfence.testing import FaultProxy

from .conftest import ScenarioRecord, rounds

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.cluster]

TTL = 1
NAMES = ("c0", "c1", "c2")
#: whom a fault or action hits: the contender elected last (leading, or a zombie by now),
#: the one elected before it, or one by name
targets = st.sampled_from(["leader", "previous", *NAMES])


@dataclass
class Contender:
    name: str
    client: ef.Client
    proxy: FaultProxy
    guard: ef.FenceGuard
    recorder: Recorder
    session: Any = None
    token: ef.FencingToken | None = None
    believes: bool = False
    orphaned: bool = False

    def deadline(self) -> float | None:
        return None if self.session is None else float(self.session.deadline)


@dataclass
class Shared:
    """What outlives one example: the cluster, proxies and clients."""

    cluster: Any
    admin: ef.Client
    proxies: list[FaultProxy]
    clients: list[ef.Client]
    record: ScenarioRecord
    steps: int = 0
    terms: int = 0
    writes: int = 0
    rejected: int = 0
    notes: collections.Counter[str] = field(default_factory=collections.Counter)


class SafetyMachine(RuleBasedStateMachine):
    shared: Shared

    def __init__(self) -> None:
        super().__init__()
        shared = self.shared
        self.layout = Layout(f"t/machine-{uuid.uuid4().hex[:8]}")
        self.data_key = self.layout.data_key("res")
        self.admin = shared.admin
        self.observer = Observer(
            self.admin, self.layout, start_revision=self.admin.revision() + 1
        ).start()
        self.contenders: dict[str, Contender] = {}
        for name, proxy, client in zip(NAMES, shared.proxies, shared.clients, strict=True):
            contender = Contender(
                name, client, proxy, self.layout.guard(client, "res"), Recorder(name)
            )
            contender.recorder.set_deadline_source(contender.deadline)
            self.contenders[name] = contender
        self.result: CheckResult | None = None

    # -- helpers ---------------------------------------------------------------------

    def _expire_check(self, c: Contender) -> None:
        """Record a loss the session has noticed by itself (deadline or lease gone)."""
        if c.believes and c.session is not None and c.session.expired:
            c.recorder.lost("session expired")
            c.believes = False

    def _pick(self, who: str) -> Contender:
        """``"leader"``: the contender elected last (leading or a zombie now);
        ``"previous"``: the one elected before it (most likely a zombie); ``"other"``:
        the one after the last leader; else the contender of that name."""
        if who in self.contenders:
            return self.contenders[who]
        order = sorted(
            self.contenders.values(), key=lambda c: -1 if c.token is None else c.token.value
        )
        last = order[-1]
        if who == "leader":
            return last
        if who == "previous":
            return order[-2]
        return self.contenders[NAMES[(NAMES.index(last.name) + 1) % len(NAMES)]]

    # -- rules -----------------------------------------------------------------------

    @initialize()
    def first_leader(self) -> None:
        self.campaign("c0")
        self.write("c0")

    @rule()
    def take_over(self) -> None:
        """The contender after the last leader campaigns; if that leader's lease is on its
        way out (orphaned, cut off, resigned), patiently enough to see it go."""
        last = self._pick("leader")
        doomed = (
            not last.believes
            or last.orphaned
            or bool(last.proxy.blackholed)
            or last.session is None
        )
        self.campaign("other", patience=TTL + 0.5 if doomed else 0.3)

    @rule(who=st.sampled_from(NAMES))
    def campaign(self, who: str, patience: float = 0.3) -> None:
        """Campaign, waiting up to ``patience`` seconds for the current leader to go."""
        c = self._pick(who)
        self._expire_check(c)
        if c.believes:
            return
        try:
            if c.session is None or c.session.expired:
                if c.session is not None:
                    c.session.close()
                    c.session = None
                session = c.client.session(TTL)
                session.open()  # fails when cut off: no session then
                c.session = session
                c.orphaned = False
            c.recorder.campaign()
            token = c.session.election(self.layout.election).campaign(c.name, timeout=patience)
        except (ef.SessionExpired, ef.LeaseNotFound) as err:
            c.recorder.note(f"campaign failed: {type(err).__name__}")
            c.session = None  # revoked or run out: the next campaign starts a new session
            return
        except ef.EtcdfenceError as err:
            c.recorder.note(f"campaign failed: {type(err).__name__}")
            return
        c.token = token
        c.believes = True
        c.recorder.elected(token)

    @rule(who=targets)
    def resign(self, who: str) -> None:
        c = self._pick(who)
        self._expire_check(c)
        if not c.believes:
            return
        c.recorder.lost("resign")
        c.believes = False
        try:
            c.session.election(self.layout.election).resign()
        except ef.EtcdfenceError as err:
            c.recorder.note(f"resign failed: {type(err).__name__}")

    @rule(who=targets, how=st.sampled_from(["pause", "revoke"]))
    def lose_lease(self, who: str, how: str) -> None:
        """``pause``: orphan the session — keepalives stop, the lease runs out, nobody is
        told (a frozen process). ``revoke``: an operator revokes the lease."""
        c = self._pick(who)
        if c.session is None or c.session.expired:
            return
        if how == "pause":
            c.session.orphan()
            c.orphaned = True
            self.shared.record.fault("orphan session")
            return
        if c.believes:
            c.recorder.lost("lease revoked by an operator")
            c.believes = False
        try:
            self.admin.lease_revoke(c.session.lease_id)
        except ef.LeaseNotFound:
            pass
        self.shared.record.fault("revoke lease")

    @rule(who=st.sampled_from(["all", "leader", "previous", *NAMES]))
    def write(self, who: str) -> None:
        """Guarded writes with the contender's latest token, whether it still leads or not
        (``all``: everyone who ever led, zombies included)."""
        for c in self.contenders.values() if who == "all" else [self._pick(who)]:
            self._expire_check(c)
            if c.token is not None:
                c.recorder.guarded_put(c.guard, c.token, self.data_key)

    @rule(who=targets, direction=st.sampled_from(["heal", "both", "upstream", "downstream"]))
    def blackhole(self, who: str, direction: Any) -> None:
        """Cut one contender off from etcd (both ways or one way), or heal its link."""
        proxy = self._pick(who).proxy
        if direction == "heal":
            proxy.heal()
            return
        proxy.blackhole(direction)
        self.shared.record.fault(f"blackhole {direction}")

    @rule(seconds=st.sampled_from([0.2, 0.6, 1.2]))
    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    # -- the invariants ----------------------------------------------------------------

    @invariant()
    def safe(self) -> None:
        self.shared.steps += 1
        for c in self.contenders.values():
            self._expire_check(c)
            if c.believes and c.token is not None:  # a leader writes all the time
                c.recorder.guarded_put(c.guard, c.token, self.data_key)
            self._expire_check(c)
        self.observer.sync(timeout=10)
        events = [e for c in self.contenders.values() for e in c.recorder.events]
        history = History.collect(events, self.observer)
        history.read_final(self.admin)
        self.result = check(history)
        assert self.result.ok, self.result.report()

    def teardown(self) -> None:
        for c in self.contenders.values():
            c.proxy.heal()
            c.proxy.reset()  # drop connections that were cut mid-stream
        for c in self.contenders.values():
            if c.session is not None:
                c.session.close()
        self.observer.stop()
        record = self.shared.record
        record.rounds += 1
        if self.result is not None:
            stats = self.result.stats
            record.stale_attempted += stats["stale_attempted"]
            record.stale_accepted += stats["stale_accepted"]
            record.violations += len(self.result.violations)
            self.shared.terms += stats["terms"]
            self.shared.writes += stats["writes"]
            self.shared.rejected += stats["rejected"]
        for c in self.contenders.values():
            for event in c.recorder.events:
                if event.kind in ("campaign", "elected"):
                    self.shared.notes[event.kind] += 1
                elif event.kind == "note":
                    self.shared.notes[event.detail or "?"] += 1


EXAMPLES = rounds(8)


@pytest.mark.timeout(60 + 10 * EXAMPLES)
def test_state_machine(etcd_cluster: Any, cluster_client: ef.Client, chaos: ScenarioRecord) -> None:
    proxies = [FaultProxy(endpoint) for endpoint in etcd_cluster.endpoints]
    clients = [ef.Client([p.endpoint], timeout=0.5) for p in proxies]
    shared = Shared(etcd_cluster, cluster_client, proxies, clients, chaos)
    try:
        SafetyMachine.shared = shared
        run_state_machine_as_test(
            SafetyMachine,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=20,
                # no shrinking: the system is timing-dependent, so a failure may not
                # replay; the checker's report already holds the offending history
                phases=[Phase.explicit, Phase.reuse, Phase.generate],
                report_multiple_bugs=False,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                database=None,
            ),
        )
        chaos.verdicts.append(
            f"OK: {chaos.rounds} examples, {shared.steps} checked steps, {shared.terms} terms, "
            f"{shared.writes} writes ({shared.rejected} rejected), 0 violations; "
            + ", ".join(f"{k}: {v}" for k, v in sorted(shared.notes.items()))
        )
    finally:
        for client in clients:
            client.close()
        for proxy in proxies:
            proxy.close()


@pytest.mark.parametrize("kind", ["election", "lock"])
def test_contending_after_a_revoke_is_session_expired(
    cluster_client: ef.Client, etcd_namespace: str, kind: str
) -> None:
    """What the machine's ``revoke`` then ``campaign`` hits: a lease revoked behind the
    session's back, before its keepalive noticed. The campaign/acquire must fail with
    :class:`SessionExpired` (and expire the session), not a raw ``LeaseNotFound``."""
    with cluster_client.session(ttl=30) as session:
        cluster_client.lease_revoke(session.lease_id)
        with pytest.raises(ef.SessionExpired):
            if kind == "election":
                session.election(etcd_namespace + "/e").campaign("x", timeout=2)
            else:
                session.lock(etcd_namespace + "/l").acquire(timeout=2)
        assert session.expired
