"""The scenarios: each one a story of terms and writes that a fencing resource must get
right, told with real etcd terms (locks) and the user's real resource."""

from __future__ import annotations

from ..errors import InvalidTokenError
from ..testing.history import Event, Recorder, parse_write_value, write_value
from ..token import HEADER, MAX_TOKEN, FencingToken, parse_token
from ._kit import KIT_UNKNOWN, Holder, Run, Scenario

__all__ = ["SCENARIOS"]

#: Tokens no resource may accept: missing, not positive, not an int, beyond int64.
BAD_TOKENS: tuple[object, ...] = (None, 0, -1, "abc", 2**63, True, 1.5, "")
#: Header values that must not parse as a token.
BAD_HEADERS = ("", "abc", "-1", "0", "+5", "1e3", "0x10", "12 34", str(2**63), "\u0663", "7.0")
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
    a sequence) stops it from putting old data back."""
    key = run.key()
    writer = run.term("writer")
    must_accept(run, writer, key)
    stray = writer.recorder.write(run.resource(key), key, writer.token)
    release = run.kit.adapter.call("delay", writer.token, key, stray.value)
    writer.recorder.unknown(stray, f"{KIT_UNKNOWN}held in the network by delay(); writer gave up")
    must_accept(run, writer, key)
    must_accept(run, writer, key)
    last = [e.write_id for e in writer.recorder.events if e.kind == "write"][-1]
    writer.recorder.note("the held write is delivered now")
    run.kit.adapter.resolve(release())
    run.observe(key)
    stored = run.read(key)
    parsed = None if stored is None else parse_write_value(stored)
    run.expect(
        parsed is not None and parsed[0] == last,
        "late-landing",
        f"{key} holds {stored!r} after the held write was delivered, not the last "
        f"acknowledged write {last}",
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


#: Writers of the concurrent scenario, and writes each makes in the burst.
WRITERS, BURST = 3, 15


def concurrent_writers(run: Run) -> str:
    """Writers of three successive terms write at once (processes when the adapter came
    as ``module:factory``), then each older one once more after the newest wrote."""
    key = run.key()
    holders = []
    for i in range(WRITERS):
        holders.append(run.term(f"w{i + 1}"))
        if i < WRITERS - 1:
            holders[-1].release()
    writers = [run.writer(h.name) for h in holders]  # start together, ready at first send
    commands = [
        w.send(h.name, key, h.token.value, BURST) for w, h in zip(writers, holders, strict=True)
    ]
    for writer, command in zip(writers, commands, strict=True):
        writer.wait(command)
    newest = holders[-1]
    writers[-1].run(newest.name, key, newest.token.value)
    for writer, holder in zip(writers[:-1], holders[:-1], strict=True):
        writer.run(holder.name, key, holder.token.value)
        outcome = _last_outcome(writer.events(), holder.name)
        run.expect(
            outcome == "rejected",
            "stale-write-accepted" if outcome == "accepted" else "stale-write-unclear",
            f"{holder.name}'s write with token {holder.token} after {newest.name}'s "
            f"{newest.token} was acknowledged was {outcome}",
        )
    _holds(run, key, newest)
    return (
        f"{WRITERS} {run.kit.writers_are} wrote {BURST} times each at once with tokens "
        f"{', '.join(str(h.token) for h in holders)}; the newest term's value stayed"
    )


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
        outcome, detail = run.kit.adapter.attempt(bad, key, write_value(f"forger#{i}", 0))
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
    run.kit.adapter.call("restart")
    must_reject(run, older, key, f"the resource accepted {newer.token} before it restarted")
    must_accept(run, newer, key)
    _holds(run, key, newer)
    return f"after the restart, token {older.token} was still rejected ({newer.token} wrote before)"


def large_tokens(run: Run) -> str:
    """Tokens above 2**53 (where doubles lose integers: JSON numbers in JavaScript, Lua
    numbers) and at int64's edge must compare exactly. Writes tokens far above etcd's
    revisions to its own key: a resource with one mark for every key stays fenced
    against real tokens afterwards, so the kit runs this scenario last."""
    key = run.key()
    big = run.recorder("large")
    must_accept(run, big, key, 2**53 + 2)
    must_reject(run, big, key, f"{2**53 + 2} was acknowledged (equal as doubles)", 2**53 + 1)
    must_accept(run, big, key, MAX_TOKEN)
    must_reject(run, big, key, f"{MAX_TOKEN} was acknowledged", MAX_TOKEN - 1)
    return f"{2**53 + 1} after {2**53 + 2} and {MAX_TOKEN - 1} after {MAX_TOKEN} were rejected"


#: Every scenario, in the order the kit runs them.
SCENARIOS: tuple[Scenario, ...] = (
    Scenario("zombie-after-pause", "a paused holder wakes after its lease expired",
             zombie_after_pause),
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
    Scenario("large-tokens", "tokens beyond 2**53 and at int64's edge", large_tokens),
)  # fmt: skip
