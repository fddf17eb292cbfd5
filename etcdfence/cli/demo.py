"""``etcdfence demo``: a zombie leader, frozen mid-write, is stopped by the fence.

The story (after Martin Kleppmann's "How to do distributed locking"), played by real
processes on an embedded etcd:

1. Contenders A and B (separate Python processes, :mod:`etcdfence.cli._demo_child`)
   campaign for one election with a short lease. A wins and writes the config stored
   in etcd through a fence with its token.
2. A decides to write again — and right then the demo freezes it with SIGSTOP (a long
   GC pause, a VM migration). A's lease runs out; B is elected and writes with its
   larger token.
3. The demo thaws A with SIGCONT. A still believes it leads and completes the write it
   had already decided on, with its old token. The fence rejects it
   (``StaleTokenError``): the config keeps B's value. Only then does A notice it lost
   leadership and step down.

The parent prints a timestamped timeline (what each node believes, tokens, the fence's
mark after every step) and a verdict. The contenders report in the history event
format (:mod:`etcdfence.history`: one JSON event per line on stdout) and take commands
(``write``, ``go``, ``quit``) on stdin, so the parent can freeze A at exactly the
moment between deciding to write and writing. The parent also watches every key of the
run (an :class:`~etcdfence.history.Observer`), and the verdict is the history
checker's on the contenders' events and etcd's changes, plus the story's own ending:
it exits 0 only if A's stale write was rejected, the config keeps B's write and the
checker finds no violation (the mark never went down, no acknowledged write lost, no
two nodes believing they led at once).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from ..errors import EtcdfenceError
from ..history import CheckResult, Event, History, Observer, check, parse_events, parse_write_value
from . import _options as opt
from ._demo_child import CRASHED, DECIDING, EXIT, LAYOUT, NOBODY, RESOURCE, SEES, STARTED
from ._process import Signals

CONFIG_KEY = LAYOUT.data_key(RESOURCE)
DEMO_BUDGET = 50.0  # seconds; the whole story takes ~10 s

DESCRIPTION = """\
Start an embedded etcd and two contender processes, A and B, electing on one
name and writing one etcd-stored config through a fence. A leads and writes,
decides to write again and is frozen (SIGSTOP) past its lease; B takes over and
writes; A is thawed and writes with its old token — the fence rejects it. Prints
a timestamped timeline and a verdict; exits 0 only if the stale write was rejected
and the history checker found no violation. Takes about 10 s; leaves no process
behind. Connection options are accepted and ignored (the demo brings its own etcd)."""


def add_parser(subparsers: Any) -> None:
    """Add ``demo`` to the command line."""
    p = opt.add_command(
        subparsers,
        "demo",
        "the zombie-leader story on an embedded etcd",
        DESCRIPTION,
        "  etcdfence demo\n  etcdfence demo --ttl 3",
    )
    p.add_argument(
        "--ttl",
        metavar="SECONDS",
        type=opt.ttl,
        default=2,
        help="the contenders' lease TTL in seconds (default: 2)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``etcdfence demo``: play the story (see the module's docstring)."""
    with Signals(raising=True):  # SIGTERM/SIGINT: the demo cleans up, then 128+N
        return run_demo(ttl=args.ttl)


class DemoFailed(Exception):
    """The story did not unfold as it must (a timeout, a process died, a bad write)."""


def _is(name: str, kind: str, detail: str | None = None) -> Callable[[str, Event], bool]:
    """A predicate for :meth:`_Demo.expect`: ``name``'s next event of ``kind`` (and
    ``detail``, if given)."""
    return lambda who, e: who == name and e.kind == kind and (detail is None or e.detail == detail)


def _version(event: Event) -> str:
    """The config version a write stands for: its number in the writer's sequence."""
    return (event.write_id or "#?").rpartition("#")[2]


@dataclass
class _Node:
    name: str
    proc: subprocess.Popen[str]
    stderr: IO[str]
    belief: str = "starting"
    token: int | None = None
    frozen: bool = False
    exited: bool = False
    reader: Any = None


@dataclass
class _Story:
    """What the verdict needs, collected while the timeline unfolds."""

    events: list[Event] = field(default_factory=list)
    marks: list[int] = field(default_factory=list)


class _Demo:
    def __init__(self, out: IO[str], ttl: int) -> None:
        self.out = out
        self.ttl = ttl
        self.t0 = time.monotonic()
        self.events: queue.Queue[tuple[str, Event]] = queue.Queue()
        self.nodes: dict[str, _Node] = {}
        self.story = _Story()
        self.client: Any = None
        self.observer: Observer | None = None
        self.endpoint = ""

    # -- output -------------------------------------------------------------------------

    def mark(self) -> int:
        value = int(LAYOUT.guard(self.client, RESOURCE).current())
        self.story.marks.append(value)
        return value

    def beliefs(self) -> str:
        return " ".join(
            f"{node.name}={node.belief}{',FROZEN' if node.frozen else ''}"
            for node in self.nodes.values()
        )

    def line(self, who: str, text: str, at: float | None = None, mark: int | None = None) -> None:
        """One timeline row: time, node, event, what each node believes, the mark.

        The mark shown is the one the reporting contender read right after the event
        (``current``), else the demo's own read (it reads the mark for every row).
        """
        stamp = (time.monotonic() if at is None else at) - self.t0
        observed = self.mark() if self.client is not None else 0
        shown = observed if mark is None else mark
        state = f"{self.beliefs():<34} mark={shown}" if self.nodes else ""
        self.out.write(f"t+{stamp:5.2f}s  {who:<4}  {text:<58}  {state}".rstrip() + "\n")
        self.out.flush()

    # -- contenders ---------------------------------------------------------------------

    def spawn(self, name: str) -> _Node:
        from ..testing import procs

        command = [
            sys.executable, "-m", "etcdfence.cli._demo_child",
            "--endpoints", self.endpoint, "--id", name, "--ttl", str(self.ttl),
        ]  # fmt: skip
        stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in cleanup()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDFENCE_")}
        # in the demo's process group: a Ctrl-C at the terminal reaches the contenders too
        proc = procs.start(
            command, env=env, stdin=subprocess.PIPE, stderr=stderr, new_group=False, bufsize=1
        )
        node = _Node(name, proc, stderr)
        self.nodes[name] = node
        node.reader = procs.LineReader(
            proc.stdout, on_line=lambda line, _at: self._take(name, line), name=f"demo-{name}"
        )
        return node

    def _take(self, name: str, line: str) -> None:
        for event in parse_events([line]):  # the history event format; other lines skipped
            self.events.put((name, event))

    def send(self, node: _Node, command: str) -> None:
        assert node.proc.stdin is not None
        node.proc.stdin.write(command + "\n")
        node.proc.stdin.flush()

    def signal(self, node: _Node, signum: int) -> None:
        if node.proc.poll() is None:
            node.proc.send_signal(signum)

    # -- events -------------------------------------------------------------------------

    def expect(self, what: str, predicate: Callable[[str, Event], bool], timeout: float) -> Event:
        """Print events as they come until one satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DemoFailed(f"timed out after {timeout:.0f}s waiting for {what}")
            try:
                name, event = self.events.get(timeout=min(remaining, 0.1))
            except queue.Empty:
                self._check_alive(what)
                continue
            self.show(self.nodes[name], event)
            if predicate(name, event):
                return event

    def _check_alive(self, what: str) -> None:
        """Fail if a contender's output ended without its exit report. The reader
        queues every line before it marks the end, so once the end is seen, an empty
        queue means every line of it has been shown."""
        for node in self.nodes.values():
            ended = node.reader is not None and node.reader.eof
            if ended and self.events.empty() and not node.exited:
                raise DemoFailed(
                    f"contender {node.name} exited unexpectedly while waiting for {what}"
                    + self._stderr_tail(node)
                )

    def drain(self, seconds: float) -> None:
        """Print whatever arrives within ``seconds``."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                name, event = self.events.get(timeout=remaining)
            except queue.Empty:
                return
            self.show(self.nodes[name], event)

    def show(self, node: _Node, event: Event) -> None:
        """Keep a contender's event for the checker and print it as a timeline row,
        updating what the node believes."""
        self.story.events.append(event)
        describe = _DESCRIBE.get(event.kind)
        text = describe(self, node, event) if describe is not None else None
        if text is not None:
            self.line(node.name, text, event.t, event.current)

    def _note(self, node: _Node, event: Event) -> str | None:
        detail = event.detail or ""
        if detail == STARTED:
            node.belief = "-"
            return f"process started (pid {node.proc.pid}, lease ttl {self.ttl}s)"
        if detail == DECIDING:
            done = sum(
                1 for e in self.story.events if e.contender == node.name and e.kind == "write"
            )
            return f"decides to write config v{done + 1} (believes it leads, token {event.token})"
        if detail == EXIT:
            node.exited, node.belief = True, "exited"
            return "exits"
        if detail.startswith(CRASHED):
            return detail
        if detail.startswith(SEES) or detail == NOBODY:
            leader = detail[len(SEES) :] if detail.startswith(SEES) else None
            if node.token is not None or leader == node.name:
                return None  # a leader seeing itself: its "elected" row says it
            node.belief = f"follower({leader})" if leader else "candidate"
            return f"sees leader: {leader}" if leader else "sees: nobody leads"
        return None

    def _campaign(self, node: _Node, event: Event) -> str | None:
        node.belief = "candidate"
        return f"campaigns for {LAYOUT.election!r}"

    def _elected(self, node: _Node, event: Event) -> str | None:
        node.token = event.token
        node.belief = f"LEADER({node.token})"
        return f"elected leader, fencing token {node.token}"

    def _accepted(self, node: _Node, event: Event) -> str | None:
        return f"writes config v{_version(event)} with token {event.token} -> accepted"

    def _rejected(self, node: _Node, event: Event) -> str | None:
        return (
            f"writes config v{_version(event)}, token {event.token}"
            f" -> REJECTED: stale, mark is {event.current}"
        )

    def _unknown(self, node: _Node, event: Event) -> str | None:
        return f"write of config v{_version(event)} FAILED: {event.detail}"

    def _lost(self, node: _Node, event: Event) -> str | None:
        node.token = None
        if event.detail == "resigned":
            node.belief = "resigned"
            return "resigns (demo over)"
        node.belief = "stepped-down"
        return "notices it lost leadership: stops working, campaigns again"

    def _stderr_tail(self, node: _Node) -> str:
        with contextlib.suppress(OSError, ValueError):
            node.stderr.seek(0)
            tail = node.stderr.read()[-2000:].strip()
            if tail:
                return f"\n--- {node.name} stderr ---\n{tail}"
        return ""

    # -- the story ----------------------------------------------------------------------

    def play(self) -> bool:
        a = self.spawn("A")
        self.expect("A to be elected", _is("A", "elected"), 20)
        self.expect("A's first write", _is("A", "accepted"), 10)
        b = self.spawn("B")
        self.expect("B to see A lead", _is("B", "note", SEES + "A"), 20)
        self.send(a, "write")
        self.expect("A to decide to write", _is("A", "note", DECIDING), 10)
        self.signal(a, signal.SIGSTOP)
        a.frozen = True
        frozen_at = time.monotonic()
        self.line("demo", "SIGSTOP A between deciding and writing (think: GC pause)")
        self.send(a, "go")  # waits in A's stdin pipe: the write it will do on waking
        self.expect("B to be elected after A's lease expired", _is("B", "elected"), self.ttl + 15)
        self.expect("B's write", _is("B", "accepted"), 10)
        self.line("demo", "A's lease expired while frozen: two nodes think they lead")
        time.sleep(max(0.3, self.ttl + 0.5 - (time.monotonic() - frozen_at)))
        self.signal(a, signal.SIGCONT)
        a.frozen = False
        self.line(
            "demo",
            f"SIGCONT A after {time.monotonic() - frozen_at:.1f}s: "
            f"it resumes mid-write, token {a.token}",
        )
        self.expect("A's delayed write", lambda n, e: n == "A" and e.kind == "rejected", 10)
        self.expect("A to notice it lost", _is("A", "lost", "lost"), 10)
        self.drain(0.5)
        outcome = self.judge()
        # A (now a follower) first: were B to resign first, A would lead and write again.
        for node in (a, b):
            self.send(node, "quit")
            with contextlib.suppress(DemoFailed):  # cleanup() makes sure of it anyway
                self.expect(f"{node.name} to exit", _is(node.name, "note", EXIT), 5)
        return self.verdict(outcome)

    def judge(self) -> tuple[str | None, History]:
        """The config and the history (events, etcd's changes, the final value), read
        right after the story's climax."""
        assert self.observer is not None
        kv = self.client.get(CONFIG_KEY)
        self.mark()
        self.observer.sync()
        history = History.collect(self.story.events, self.observer)
        history.read_final(self.client)
        return (None if kv is None else kv.value.decode()), history

    def verdict(self, outcome: tuple[str | None, History]) -> bool:
        raw, history = outcome
        self.mark()  # one last read for the mark history
        result: CheckResult = check(history)
        marks = self.story.marks
        changes = " -> ".join(str(m) for i, m in enumerate(marks) if i == 0 or m != marks[i - 1])
        written = None if raw is None else parse_write_value(raw)
        writer = None if written is None else written[0].partition("#")[0]
        a_rejected = [e for e in history.events if e.contender == "A" and e.kind == "rejected"]
        monotonic = all(x <= y for x, y in itertools.pairwise(marks))
        self.out.write("\n")
        self.out.write(f"config in etcd after the stale write ({CONFIG_KEY}): {raw}\n")
        self.out.write(f"fence mark history (every read, in order): {changes}\n")
        self.out.write(f"history check: {result}\n")
        if a_rejected and writer == "B" and monotonic and result.ok:
            first = a_rejected[0]
            self.out.write(
                "without the fence, A's late write would have replaced B's config while B "
                "believed itself the only leader.\n"
            )
            self.out.write(
                f"verdict: PASS — zombie leader A's write with token {first.token} was "
                f"rejected (mark {first.current}); the mark never decreased; the config "
                "keeps B's write.\n"
            )
            self.out.flush()
            return True
        why = [] if result.ok else [result.report()]
        if not a_rejected:
            why.append("A's stale write was NOT rejected")
        if not monotonic:
            why.append("the mark decreased")
        if writer != "B":
            why.append(f"the config holds {raw!r}, not B's write")
        self.out.write(f"verdict: FAIL — {'; '.join(why) or 'unexpected story'}\n")
        self.out.flush()
        return False

    def cleanup(self) -> None:
        from ..testing import procs

        for node in self.nodes.values():
            procs.stop(node.proc, timeout=3)  # SIGTERM (and SIGCONT if frozen), then kill
            for stream in (node.proc.stdin, node.proc.stdout, node.stderr):
                with contextlib.suppress(OSError, AttributeError):
                    stream.close()  # type: ignore[union-attr]
        if self.observer is not None:
            self.observer.stop()


#: A contender's event kind -> the method that updates the node and words its timeline
#: row (None: no row). Kinds not listed here (``write``: its outcome has the row) are
#: not shown.
_DESCRIBE: dict[str, Callable[[_Demo, _Node, Event], str | None]] = {
    "note": _Demo._note,
    "campaign": _Demo._campaign,
    "elected": _Demo._elected,
    "accepted": _Demo._accepted,
    "rejected": _Demo._rejected,
    "unknown": _Demo._unknown,
    "lost": _Demo._lost,
}


def run_demo(*, ttl: int = 2, out: IO[str] | None = None) -> int:
    """Play the zombie-leader story; 0 if the fence rejected the stale write, else 1."""
    stream = sys.stdout if out is None else out
    demo = _Demo(stream, ttl)
    stream.write(
        "etcdfence demo: a leader frozen mid-write comes back as a zombie; the fence stops it.\n"
        f"  election {LAYOUT.election!r} (lease ttl {ttl}s), config key {CONFIG_KEY!r} "
        f"written through fence {RESOURCE!r}\n"
        "  columns: time since start, node, what happened, [what each node believes], "
        "the fence's mark\n\n"
    )
    with _budget():
        try:
            ok = _play_on_embedded_etcd(demo)
        except (DemoFailed, EtcdfenceError, OSError) as exc:
            stream.write(f"\nverdict: FAIL — {exc}\n")
            ok = False
    stream.flush()
    return 0 if ok else 1


def _play_on_embedded_etcd(demo: _Demo) -> bool:
    """Start the embedded etcd and the observer, play the story, clean everything up."""
    from .._sync.client import Client
    from ..testing import EtcdServer, EtcdStartError

    server = EtcdServer()
    try:
        try:
            server.start()
        except EtcdStartError as exc:
            raise DemoFailed(f"could not start the embedded etcd: {exc}") from None
        demo.endpoint = server.endpoint
        demo.client = Client(server.endpoint, timeout=3.0)
        demo.observer = Observer(demo.client, LAYOUT, start_revision=1).start()
        version = ".".join(map(str, server.version))
        demo.line("demo", f"embedded etcd {version} up at {server.endpoint} (pid {server.pid})")
        return demo.play()
    finally:
        demo.cleanup()
        if demo.client is not None:
            demo.client.close()
        server.stop()


@contextlib.contextmanager
def _budget() -> Any:
    """Raise :class:`DemoFailed` in the main thread if the demo overruns its budget."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def over_budget(signum: int, frame: Any) -> None:
        raise DemoFailed(f"the demo took longer than {DEMO_BUDGET:.0f}s")

    alarm = threading.Timer(DEMO_BUDGET, lambda: os.kill(os.getpid(), signal.SIGALRM))
    previous = signal.signal(signal.SIGALRM, over_budget)
    alarm.daemon = True
    alarm.start()
    try:
        yield
    finally:
        alarm.cancel()
        signal.signal(signal.SIGALRM, previous)
