"""The scenarios: each one a story of terms and writes that a fencing resource must get
right, told with real etcd terms (locks) and the user's real resource."""

from __future__ import annotations

import dataclasses
import time

from ..errors import InvalidTokenError
from ..history import Event, Recorder, parse_write_value, write_value
from ..token import HEADER, MAX_TOKEN, FencingToken, parse_token
from ._kit import KIT_UNKNOWN, Holder, Run, Scenario, bounded
from ._writers import Writer

__all__ = ["SCENARIOS"]

#: Tokens no resource may accept: missing, not positive, not an int, beyond int64.
BAD_TOKENS: tuple[object, ...] = (None, 0, -1, "abc", 2**63, True, 1.5, "")
#: Header values that must not parse as a token.
BAD_HEADERS = ("", "abc", "-1", "0", "+5", "1e3", "0x10", "12 34", str(2**63), "\u0663", "7.0")
#: How far above etcd's current revision the future-token scenario's token is.
FUTURE_AHEAD = 1_000_000
#: Tokens whose header form must round-trip exactly (int64 edges, double precision).
LARGE = (2**31, 2**32 + 1, 2**53 - 1, 2**53, 2**53 + 1, 2**62 + 3, MAX_TOKEN - 1, MAX_TOKEN)


def must_accept(run: Run, who: Holder | Recorder, key: str, token: object = None) -> bool:
    """Write; a refusal of a current (or equal) token is a finding."""
    outcome = run.write(who, key, token)
    value = who.token if token is None and isinstance(who, Holder) else token
    return run.expect(
        outcome == "accepted",
        "current-refused",
        f"{_name(who)}'s write with token {value} was {outcome}, but no higher token had "
        "written, so it must be accepted (a mark left by an earlier run? use a fresh store)",
    )


def must_reject(run: Run, who: Holder | Recorder, key: str, why: str, token: object = None) -> bool:
    """Write with a stale token; acceptance is a finding."""
    outcome = run.write(who, key, token)
    value = who.token if token is None and isinstance(who, Holder) else token
    return run.expect(
        outcome == "rejected",
        "stale-write-accepted" if outcome == "accepted" else "stale-write-unclear",
        f"{_name(who)}'s write with token {value} was {outcome}; it must be rejected: {why}",
    )


def _name(who: Holder | Recorder) -> str:
    return who.name if isinstance(who, Holder) else who.contender


def _holds(run: Run, key: str, holder: Holder) -> None:
    """The resource ends with a value written by ``holder``'s term."""
    token = run.value_token(key)
    run.expect(
        token == holder.token.value,
        "wrong-final-value",
        f"{key} holds a value written with token {token}, not {holder.name}'s "
        f"{holder.token.value} (the newest term's)",
    )


def zombie_after_pause(run: Run) -> str:
    """Kleppmann's figure: client 1 (token 33) pauses past its TTL; etcd expires its
    lease; client 2 gets 34 and writes; client 1 wakes and writes with 33."""
    key = run.key()
    one = run.term("client-1", short=True)
    must_accept(run, one, key)
    one.pause()
    two = run.term("client-2")  # returns once etcd has expired client 1's lease
    must_accept(run, two, key)
    must_reject(run, one, key, f"client-2's token {two.token} was acknowledged before")
    _holds(run, key, two)
    return (
        f"client-1 (token {one.token}) paused past its TTL, client-2 got {two.token} and "
        f"wrote; client-1's late write with {one.token} was rejected"
    )


def zombie_wakes_late(run: Run) -> str:
    """A zombie that wakes *seconds* later: client-2's write is followed by no write at
    all for ``zombie_delay`` seconds (default 10), then client-1 writes with its old
    token. A fencing mark that expires (a Redis key with ``EX``, a cache entry with a
    TTL) passes every scenario where the stale write comes at once, and fails here:
    the mark must persist as long as the data it guards. Before the sleep, client-2
    writes ``EVICT_KEYS`` other keys: a mark kept in a bounded cache (LRU eviction)
    is pushed out by them, and the stale write gets in. The kit cannot see a mark
    that expires later than ``zombie_delay``: set it above your store's mark TTL."""
    key = run.key()
    one = run.term("client-1")
    must_accept(run, one, key)
    one.release()
    two = run.term("client-2")
    must_accept(run, two, key)
    _evict(run, two)
    two.release()
    delay = run.kit.zombie_delay
    one.recorder.note(f"asleep for {delay:g} s; nothing writes to the resource meanwhile")
    time.sleep(delay)
    must_reject(run, one, key, f"client-2's token {two.token} wrote {delay:g} s before: "
                "the mark must not expire", )  # fmt: skip
    _holds(run, key, two)
    return (
        f"client-1's write with token {one.token}, {delay:g} s after client-2's {two.token}, "
        "was rejected: the mark persists"
    )


#: Other keys the late zombie's newer term writes before the sleep (evicting a mark kept
#: in a cache of fewer entries).
EVICT_KEYS = 32


def _evict(run: Run, holder: Holder) -> None:
    """``holder`` writes ``EVICT_KEYS`` other keys of the scenario (unrecorded: they
    only push out a mark that a bounded cache keeps); each must be accepted."""
    for i in range(EVICT_KEYS):
        outcome, detail = run.attempt(holder.token, run.key(f"-other-{i + 1}"),
                                      write_value(f"{holder.name}-other#{i + 1}",
                                                  holder.token.value))  # fmt: skip
        if not run.expect(outcome == "accepted", "current-refused",
                          f"{holder.name}'s write of another key with token {holder.token} "
                          f"was {outcome}" + (f" ({detail})" if detail else "")):  # fmt: skip
            return
    holder.recorder.note(f"wrote {EVICT_KEYS} other keys (a mark in a bounded cache is "
                         "evicted by them)")  # fmt: skip


def lower_after_higher(run: Run) -> str:
    """A lower token arrives after a higher one, on a key the lower never wrote."""
    key = run.key()
    older = run.term("older")
    older.release()
    newer = run.term("newer")
    must_accept(run, newer, key)
    must_reject(run, older, key, f"token {newer.token} was acknowledged before")
    _holds(run, key, newer)
    return f"token {older.token} after {newer.token} was rejected"


def equal_tokens(run: Run) -> str:
    """One term writes again and again, from two writers of the term: all accepted
    (a resource that wants strictly greater tokens breaks every retry)."""
    key = run.key()
    holder = run.term("holder")
    worker = run.recorder("holder-worker")
    for _ in range(3):
        must_accept(run, holder, key)
    must_accept(run, worker, key, holder.token)
    must_accept(run, holder, key)
    _holds(run, key, holder)
    return f"5 writes with token {holder.token} from two writers of one term were accepted"


def retried_write(run: Run) -> str:
    """A write whose reply was lost is sent again with the same token and value: the
    retry is accepted, or refused as a duplicate with the value stored.

    The kit cannot lose a reply inside your transport, so it ignores the first one
    (records the outcome as unknown): to the resource, the first attempt applied and
    the retry is a duplicate of the current term. A resource that wants strictly
    greater tokens refuses it, and the writer cannot tell "stale" from "done". The
    other order — the lost attempt landing *after* later writes — is the late-landing
    scenario (needs ``delay()``)."""
    key = run.key()
    holder = run.term("holder")
    pending = holder.recorder.write(run.resource(key), key, holder.token)
    run.write(holder, key, pending=pending, lost_reply=True)
    outcome = run.write(holder, key, pending=pending)
    stored = run.read(key) == pending.value
    run.expect(
        outcome == "accepted" or (outcome == "rejected" and stored),
        "retry-refused",
        f"the retry with token {holder.token} was {outcome} and the value is "
        + ("stored" if stored else "not stored"),
    )
    run.expect(stored, "retry-lost", f"after the retry {key} does not hold the written value")
    must_accept(run, holder, key)
    return f"the retried write with token {holder.token} was {outcome}; the value is stored"


def late_landing(run: Run) -> str:
    """Within one term: a write whose reply never came (the adapter holds its bytes)
    reaches the resource after two later acknowledged writes of the same writer. It
    must change nothing: equal tokens pass, so only within-term ordering (an epoch,
    a sequence) stops it from putting old data back.

    A resource may instead make the later write wait for the held one (a held
    COMMIT keeps its row lock): the later write then gets no answer within the
    kit's deadline, is recorded as indeterminate, the kit delivers the held write,
    and the later one must land after it — ordered, not a failure."""
    key = run.key()
    writer = run.term("writer")
    must_accept(run, writer, key)
    stray = writer.recorder.write(run.resource(key), key, writer.token)
    release = run.kit.call("delay", writer.token, key, stray.value)
    writer.recorder.unknown(stray, f"{KIT_UNKNOWN}held in the network by delay(); writer gave up")
    second = writer.recorder.write(run.resource(key), key, writer.token)
    outcome = run.write(writer, key, pending=second, settle=False)
    ordered = second.write_id in run.in_flight  # it waits for the held write
    if not ordered:
        run.expect(
            outcome == "accepted",
            "current-refused",
            f"the write with token {writer.token} after the held one was {outcome}",
        )
        must_accept(run, writer, key)
    writer.recorder.note("the held write is delivered now")
    limit = run.kit.deadline + run.kit.settle
    bounded(lambda: run.kit.adapter.resolve(release()), limit, "delay()'s release")
    if ordered:
        outcome = run.settled(second.write_id, key)
        run.expect(
            outcome == "accepted",
            "current-refused",
            f"the write with token {writer.token} that waited for the held one was {outcome}",
        )
        must_accept(run, writer, key)
    last = [e.write_id for e in writer.recorder.events if e.kind == "write"][-1]
    run.observe(key)
    stored = run.read(key)
    parsed = None if stored is None else parse_write_value(stored)
    run.expect(
        parsed is not None and parsed[0] == last,
        "late-landing",
        f"{key} holds {stored!r} after the held write was delivered, not the last "
        f"acknowledged write {last}",
    )
    if ordered:
        return (
            f"the write after the held one (token {writer.token}) waited for it and landed "
            "after it (ordered); the last write's value stayed"
        )
    return f"the held write of token {writer.token} came after two later ones, changing nothing"


def interleaved_terms(run: Run) -> str:
    """Three terms in turn, each old holder still writing between the new one's writes."""
    key = run.key()
    a = run.term("A")
    must_accept(run, a, key)
    a.release()
    b = run.term("B")
    must_accept(run, b, key)
    must_reject(run, a, key, f"B's {b.token} is newer")
    must_accept(run, b, key)
    b.release()
    c = run.term("C")
    must_reject(run, a, key, f"C's {c.token} is newer (B's even before)")
    must_accept(run, c, key)
    must_reject(run, b, key, f"C's {c.token} is newer")
    must_reject(run, a, key, f"C's {c.token} is newer")
    must_accept(run, c, key)
    _holds(run, key, c)
    return f"terms {a.token} < {b.token} < {c.token} interleaved: every stale write was rejected"


#: Writers of the concurrent scenario (each round with three fresh terms), and the keys
#: each writer writes once per round, in the same order (a race on each key).
WRITERS, RACE_KEYS = 3, 4
#: Rounds: at least MIN_ROUNDS, then more until RACE_BUDGET seconds have passed, at most
#: MAX_ROUNDS.
MIN_ROUNDS, MAX_ROUNDS, RACE_BUDGET = 15, 400, 5.0
#: Seconds between sending a round's commands and the moment all writers start.
START_AHEAD = 0.05
#: Each writer starts up to OFFSET_STEPS steps of OFFSET_STEP seconds after the common
#: moment, a different step each round: the writers' relative timing sweeps a window a
#: few writes wide, so a race window of tens of microseconds is crossed in some round.
OFFSET_STEP, OFFSET_STEPS = 0.0002, 11


def concurrent_writers(run: Run) -> str:
    """Writers of three terms write at once (processes when the adapter came as
    ``module:factory``), released together by a start barrier — every writer waits
    for one common moment plus a small offset of its own that changes from round to
    round, so the interleavings sweep the race window — for at least ``MIN_ROUNDS``
    rounds and then until ``RACE_BUDGET`` seconds have passed, each round with three
    fresh terms; each writer writes each of ``RACE_KEYS`` keys once, in turn. After
    each round every key must hold the value of the highest token it accepted: a
    check of the mark that is not atomic with the write (read the mark, then write)
    lets a lower token's write land after a higher one's. Then each older term
    writes once more after the newest wrote: refused."""
    keys = [run.key(f"-{j + 1}") for j in range(RACE_KEYS)]
    writers = [run.writer(f"writer-{i + 1}") for i in range(WRITERS)]
    for writer in writers:
        writer.ready()
    lost: list[str] = []
    holders: list[Holder] = []
    started, rounds = time.monotonic(), 0
    while rounds < MIN_ROUNDS or (rounds < MAX_ROUNDS and time.monotonic() - started < RACE_BUDGET):
        holders = []
        for i in range(WRITERS):
            holders.append(run.term(f"r{rounds + 1}-t{i + 1}"))
            holders[-1].release()  # the tokens stay; the next term gets a higher one
        lost += _race(run, keys, rounds, writers, holders)
        rounds += 1
    run.expect(not lost, "lost-update", f"{len(lost)} times in {rounds} rounds a lower "
               f"token's write landed last: {lost[0] if lost else ''}")  # fmt: skip
    key, newest = keys[0], holders[-1]
    mine = {h.name: writers[(i + rounds - 1) % WRITERS] for i, h in enumerate(holders)}
    mine[newest.name].run(newest.name, key, newest.token)
    for holder in holders[:-1]:
        mine[holder.name].run(holder.name, key, holder.token)
        outcome = _last_outcome(mine[holder.name].events(), holder.name)
        run.expect(
            outcome == "rejected",
            "stale-write-accepted" if outcome == "accepted" else "stale-write-unclear",
            f"{holder.name}'s write with token {holder.token} after {newest.name}'s "
            f"{newest.token} was acknowledged was {outcome}",
        )
    _holds(run, key, newest)
    return (
        f"{WRITERS} {run.kit.writers_are} released together wrote {RACE_KEYS} keys each "
        f"with tokens of three terms in {rounds} rounds; each key kept the highest "
        "accepted token's value"
    )


def _race(
    run: Run, keys: list[str], number: int, writers: list[Writer], holders: list[Holder]
) -> list[str]:
    """One round: each writer writes every key once with its term's token from a common
    moment (plus its offset of the round); what went wrong (a key holding a lower
    token's value than the highest it accepted), if anything."""
    pairs = [(writers[(i + number) % WRITERS], h) for i, h in enumerate(holders)]
    at = time.time() + START_AHEAD
    commands = []
    for i, (writer, holder) in enumerate(pairs):
        offset = OFFSET_STEP * ((number * (2 * i + 1) + i) % OFFSET_STEPS)
        command = writer.send(holder.name, keys[0], holder.token, at=at + offset, keys=keys)
        commands.append((writer, command))
    for writer, command in commands:
        writer.wait(command, run.kit.deadline + run.kit.settle)
    events = [e for w in writers for e in w.events()]
    newest, lost = holders[-1], []
    for key in keys:
        resource = run.resource(key)
        outcomes = {
            h.token.value: _last_outcome([e for e in events if e.resource == resource], h.name)
            for h in holders
        }
        run.expect(
            outcomes[newest.token.value] == "accepted",
            "current-refused",
            f"round {number + 1}: {newest.name}'s write of {key} with token {newest.token}, "
            f"the highest yet, was {outcomes[newest.token.value]}",
        )
        accepted = [token for token, outcome in outcomes.items() if outcome == "accepted"]
        final = run.value_token(key)
        if accepted and final != max(accepted):
            lost.append(
                f"round {number + 1}: tokens {sorted(outcomes)} wrote {key} at once, "
                f"{sorted(accepted)} were accepted, and it holds token {final}'s value"
            )
    return lost


def _last_outcome(events: list[Event], contender: str) -> str | None:
    outcomes = [
        e.kind
        for e in events
        if e.contender == contender and e.kind in ("accepted", "rejected", "unknown")
    ]
    return outcomes[-1] if outcomes else None


def malformed_tokens(run: Run) -> str:
    """Writes with no token or a malformed one (None, 0, -1, "abc", 2**63, True, 1.5,
    ""): the resource refuses or the adapter refuses before writing; nothing is
    stored, and the resource still takes a real token afterwards."""
    key = run.key()
    forger = run.recorder("forger")
    for i, bad in enumerate(BAD_TOKENS):
        outcome, detail = run.attempt(bad, key, write_value(f"forger#{i}", 0))
        stored = run.read(key)
        forger.note(f"write with token {bad!r} -> {outcome}" + (f" ({detail})" if detail else ""))
        run.expect(
            stored is None,
            "malformed-accepted",
            f"a write with token {bad!r} was stored ({outcome}); {key} holds {stored!r}",
        )
    holder = run.term("holder")
    must_accept(run, holder, key)
    return f"{len(BAD_TOKENS)} malformed tokens stored nothing; token {holder.token} then wrote"


def env_token(run: Run) -> str:
    """A command run under the lock gets the token in ``ETCDFENCE_TOKEN`` and writes
    through its own adapter: accepted while the term lasts, rejected after a newer
    term wrote."""
    key = run.key()
    holder = run.term("supervisor")
    child = run.writer("child", env=holder.token.to_env())
    child.run("child", key, None)
    parsed = [e.token for e in child.events() if e.kind == "write"]
    run.expect(
        parsed == [holder.token.value],
        "env-parse",
        f"the child parsed {parsed} from ETCDFENCE_TOKEN={holder.token}",
    )
    run.expect(
        _last_outcome(child.events(), "child") == "accepted",
        "current-refused",
        f"the child's write with the term's token {holder.token} was not accepted",
    )
    must_accept(run, holder, key)  # the supervisor and its child share the term
    holder.release()
    newer = run.term("newer")
    must_accept(run, newer, key)
    child.run("child", key, None)
    outcome = _last_outcome(child.events(), "child")
    run.expect(
        outcome == "rejected",
        "stale-write-accepted" if outcome == "accepted" else "stale-write-unclear",
        f"the child's write with its environment's token {holder.token} after "
        f"{newer.token} was {outcome}",
    )
    _holds(run, key, newer)
    return (
        f"a {_one(run.kit.writers_are)} with ETCDFENCE_TOKEN={holder.token} wrote, and was "
        f"rejected after token {newer.token} wrote"
    )


def _one(kind: str) -> str:
    return {"processes": "process", "threads": "thread"}.get(kind, kind)


def header_token(run: Run) -> str:
    """Tokens travel as ``Fencing-Token: <decimal>``: large values round-trip exactly,
    malformed ones do not parse, and header-carried tokens fence the resource."""
    for value in LARGE:
        name, text = FencingToken(value).to_header()
        back = parse_token(text.encode("ascii"))
        run.expect(
            name == HEADER and back == value and FencingToken.from_header(text).value == value,
            "header-round-trip",
            f"{value} became {name}: {text!r} and parsed back as {back}",
        )
    for text in BAD_HEADERS:
        try:
            FencingToken.from_header(text)
        except InvalidTokenError:
            continue
        run.expect(False, "header-parse", f"{HEADER}: {text!r} parsed as a token")
    key = run.key()
    older = run.term("older")
    sent = FencingToken.from_header(older.token.to_header()[1])
    must_accept(run, older, key, sent)
    older.release()
    newer = run.term("newer")
    must_accept(run, newer, key, FencingToken.from_header(newer.token.to_header()[1]))
    must_reject(run, older, key, f"{newer.token} came before in its header", sent)
    _holds(run, key, newer)
    return (
        f"{len(LARGE)} large tokens round-tripped; header token {sent} was rejected "
        f"after {newer.token}"
    )


def restart_between_terms(run: Run) -> str:
    """The resource restarts between terms: a stale token must still be rejected after
    it (a mark that is not durable fails here)."""
    key = run.key()
    older = run.term("older")
    must_accept(run, older, key)
    older.release()
    newer = run.term("newer")
    must_accept(run, newer, key)
    newer.recorder.note("restarting the resource")
    run.kit.call("restart")
    must_reject(run, older, key, f"the resource accepted {newer.token} before it restarted")
    must_accept(run, newer, key)
    _holds(run, key, newer)
    return f"after the restart, token {older.token} was still rejected ({newer.token} wrote before)"


#: The highest power of ten the digits scenario crosses (10**15 < 2**53: the large-tokens
#: scenario after it still writes higher tokens).
DIGITS_TOP = 15


def token_digits(run: Run) -> str:
    """Tokens of different digit counts: at every power of ten above etcd's revision
    (up to 10**15), ``10**k - 1`` then ``10**k`` must be accepted and ``10**k - 1``
    after it rejected. A resource comparing tokens as text ("1000" < "999") refuses
    the higher one and takes the stale one. Runs after every scenario with real
    tokens (its tokens are far above etcd's revision)."""
    key = run.key()
    writer = run.recorder("digits")
    floor = run.kit.client.revision()
    crossed = []
    for k in range(len(str(floor + 1)), DIGITS_TOP + 1):
        high = 10**k
        if high - 1 <= floor:
            continue
        must_accept(run, writer, key, high - 1)
        must_accept(run, writer, key, high)
        must_reject(run, writer, key, f"{high} was acknowledged ({high - 1} sorts after it "
                    "as text, not as a number)", high - 1)  # fmt: skip
        crossed.append(high)
    return (
        f"{len(crossed)} digit-count boundaries ({crossed[0] - 1} -> {crossed[0]} up to "
        f"{crossed[-1] - 1} -> {crossed[-1]}) compared as numbers"
    )


def large_tokens(run: Run) -> str:
    """Tokens above 2**53 (where doubles lose integers: JSON numbers in JavaScript, Lua
    numbers) and at int64's edge must compare exactly. Writes tokens far above etcd's
    revisions to its own key: a resource with one mark for every key stays fenced
    against real tokens afterwards, so the kit runs this scenario last."""
    key = run.key()
    big = run.recorder("large")
    if not _takes_large(run, big, key, 2**53 + 2):
        return ""
    must_reject(run, big, key, f"{2**53 + 2} was acknowledged (equal as doubles)", 2**53 + 1)
    if not _takes_large(run, big, key, MAX_TOKEN):
        return ""
    must_reject(run, big, key, f"{MAX_TOKEN} was acknowledged", MAX_TOKEN - 1)
    return f"{2**53 + 1} after {2**53 + 2} and {MAX_TOKEN - 1} after {MAX_TOKEN} were rejected"


def _takes_large(run: Run, big: Recorder, key: str, token: int) -> bool:
    """Write a valid token above 2**53-1. A refusal is its own finding, a *limited
    token range*: not a stale write accepted, but the resource would refuse etcd's
    revisions past 2**53-1 (a store that takes JavaScript-safe integers only). The
    scenario still fails: tokens are int64 and such a store is not fenced for all of
    them (skip the scenario, knowingly, if your store documents that limit)."""
    outcome = run.write(big, key, token)
    return run.expect(
        outcome == "accepted",
        "limited-token-range" if outcome == "rejected" else "current-refused",
        f"the write with token {token} (a valid int64 token above 2**53-1) was {outcome}: "
        "the resource refuses large tokens, so it would refuse real etcd revisions once "
        "they pass 2**53-1 (a limited token range; no stale write was accepted)",
    )


def _refused_unwritten(
    run: Run, key: str, token: object, kind: str, what: str, forger: str = "forger"
) -> bool:
    """A write with ``token`` (a token the bound resource must refuse) is refused and
    writes nothing: ``key`` holds what it held before."""
    before = run.read(key)
    outcome = run.write(run.recorder(forger), key, token)
    stored = run.read(key)
    refused = run.expect(
        outcome == "rejected",
        kind,
        f"the write with {what} was {outcome}; a resource bound to lock "
        f"{run.kit.adapter.bound_lock!r} must refuse it",
    )
    return (
        run.expect(
            stored == before,
            kind,
            f"the write with {what} changed {key} from {before!r} to {stored!r}",
        )
        and refused
    )


def foreign_lock_token(run: Run) -> str:
    """Sequencers: a holder of *another* lock (a real token of the same etcd, higher
    than the bound holder's) writes the bound resource. It must be refused with
    nothing written; the live holder of the bound lock then still writes (an unbound
    resource lets the higher foreign token fence the real holder off)."""
    key = run.key()
    holder = run.term("holder")
    must_accept(run, holder, key)
    other = run.outsider(f"{run.kit.layout.root}/foreign-lock")
    _refused_unwritten(
        run, key, other, "foreign-token-accepted", f"token {other} of lock {other.lock!r}",
        forger="other-lock-holder",
    )  # fmt: skip
    must_accept(run, holder, key)
    _holds(run, key, holder)
    return (
        f"token {other} of lock {other.lock!r} was refused; the holder of "
        f"{holder.token.lock!r} (token {holder.token}) still wrote"
    )


def future_token(run: Run) -> str:
    """A sequencer of the bound lock whose value is far above etcd's current revision
    (a typo'd or forged token): no lock issued it, so it must be refused with nothing
    written — an unbound resource accepts it and then refuses every real holder until
    etcd's revision passes it. The live holder writes afterwards."""
    key = run.key()
    holder = run.term("holder")
    must_accept(run, holder, key)
    ahead = run.kit.client.revision() + FUTURE_AHEAD
    forged = dataclasses.replace(holder.token, value=ahead)
    _refused_unwritten(
        run, key, forged, "future-token-accepted",
        f"token {ahead} of lock {forged.lock!r} (etcd's revision is {ahead - FUTURE_AHEAD})",
    )  # fmt: skip
    must_accept(run, holder, key)
    _holds(run, key, holder)
    return f"token {ahead}, above etcd's revision, was refused; token {holder.token} still wrote"


def bare_token(run: Run) -> str:
    """A bare number — the holder's own token value, with no lock (an int, or a
    ``FencingToken`` read from an old carrier) — on a bound resource: refused with
    nothing written, since the resource cannot tell whose it is."""
    key = run.key()
    holder = run.term("holder")
    must_accept(run, holder, key)
    value = holder.token.value
    for bare, what in ((FencingToken(value), "FencingToken"), (value, "int")):
        _refused_unwritten(
            run, key, bare, "bare-token-accepted", f"the bare number {value} (an {what})"
        )
    must_accept(run, holder, key)
    _holds(run, key, holder)
    return f"the bare number {value} (as FencingToken and as int) was refused; the term wrote"


#: Every scenario, in the order the kit runs them.
SCENARIOS: tuple[Scenario, ...] = (
    Scenario("zombie-after-pause", "a paused holder wakes after its lease expired",
             zombie_after_pause),
    Scenario("zombie-wakes-late", "a stale write seconds after the newer term wrote",
             zombie_wakes_late),
    Scenario("lower-after-higher", "a lower token after a higher one", lower_after_higher),
    Scenario("equal-tokens", "one term writes many times (must be accepted)", equal_tokens),
    Scenario("retried-write", "a write retried after its reply was lost", retried_write),
    Scenario("late-landing", "a lost write lands after later ones of its term", late_landing,
             needs="delay"),
    Scenario("interleaved-terms", "old holders keep writing between new terms",
             interleaved_terms),
    Scenario("concurrent-writers", "writers of several terms at once", concurrent_writers,
             observed=False),
    Scenario("malformed-tokens", "no token or a malformed one", malformed_tokens,
             observed=False),
    Scenario("env-token", "a token passed through ETCDFENCE_TOKEN", env_token, observed=False),
    Scenario("header-token", "a token passed in the Fencing-Token header", header_token),
    Scenario("restart-between-terms", "the resource restarts between terms",
             restart_between_terms, needs="restart"),
    Scenario("foreign-lock-token", "token of another lock", foreign_lock_token,
             binding="bound"),
    Scenario("future-token", "token from the future", future_token, binding="bound"),
    Scenario("bare-token", "bare number on a bound resource", bare_token, binding="bound"),
    Scenario("token-digits", "tokens of different digit counts (999 vs 1000)", token_digits,
             binding="unbound", future_tokens=True),
    Scenario("large-tokens", "tokens beyond 2**53 and at int64's edge", large_tokens,
             binding="unbound", future_tokens=True),
)  # fmt: skip
