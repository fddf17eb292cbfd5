"""``etcdfence demo``: a zombie leader, frozen mid-write, is stopped by the fence.

The story (after Martin Kleppmann's "How to do distributed locking"), played by real
processes on an embedded etcd:

1. Contenders A and B (separate Python processes, ``python -m etcdfence._demo
   contender ...``) campaign for one election with a short lease. A wins and writes
   the config stored in etcd through ``client.fence("demo/config")`` with its token.
2. A decides to write again — and right then the demo freezes it with SIGSTOP (a long
   GC pause, a VM migration). A's lease runs out; B is elected and writes with its
   larger token.
3. The demo thaws A with SIGCONT. A still believes it leads and completes the write it
   had already decided on, with its old token. The fence rejects it
   (``StaleTokenError``): the config keeps B's value. Only then does A notice it lost
   leadership and step down.

The parent prints a timestamped timeline (what each node believes, tokens, the fence's
mark after every step) and a verdict. It exits 0 only if the stale write was rejected
and the mark never went down. Contenders report to the parent as JSON lines on their
stdout and take commands (``write``, ``go``, ``quit``) on stdin, so the parent can freeze
A at exactly the moment between deciding to write and writing.

Use :func:`run_demo` (what ``etcdfence demo`` and ``make run`` call); ``python -m
etcdfence._demo`` runs it too.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
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

import structlog

from ._sync.client import Client
from ._sync.elector import LeaderElector
from .errors import EtcdfenceError, StaleTokenError
from .testing import procs
from .token import FencingToken
from .types import Leader

ELECTION = "demo/leader"
RESOURCE = "demo/config"
CONFIG_KEY = "demo/config/current"
DEMO_BUDGET = 50.0  # seconds; the whole story takes ~10 s


class DemoFailed(Exception):
    """The story did not unfold as it must (a timeout, a process died, a bad write)."""


# ==========================================================================================
# contender (child process)
# ==========================================================================================


def _die_with_parent() -> None:
    """Linux: get SIGKILLed when the demo process dies, even while SIGSTOPped."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent already died before prctl
            os._exit(1)


class _Reporter:
    """Writes one JSON object per line to stdout, from any thread."""

    def __init__(self, node: str, stream: IO[str], mark: Callable[[], int]) -> None:
        self.node = node
        self._stream = stream
        self._mark = mark
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: Any) -> None:
        """Report ``event`` with the fence's mark as read right after it happened."""
        try:
            mark: int | None = self._mark()
        except EtcdfenceError:
            mark = None
        record = {"t": time.monotonic(), "node": self.node, "event": event, "mark": mark}
        record.update(fields)
        with self._lock, contextlib.suppress(OSError, ValueError):
            self._stream.write(json.dumps(record) + "\n")
            self._stream.flush()


def contender_main(argv: list[str]) -> int:
    """One contender: campaign, write the fenced config when elected and when told.

    Commands on stdin, one per line: ``write`` (decide to write the next version and
    report ``deciding``), ``go`` (perform the write decided on — no re-check of
    leadership, which is exactly what a paused process does), ``quit``.
    """
    parser = argparse.ArgumentParser(prog="python -m etcdfence._demo contender")
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--id", dest="identity", required=True)
    parser.add_argument("--ttl", type=int, default=2)
    parser.add_argument("--election", default=ELECTION)
    parser.add_argument("--resource", default=RESOURCE)
    parser.add_argument("--config-key", default=CONFIG_KEY)
    args = parser.parse_args(argv)
    _die_with_parent()
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(40),  # errors only, on stderr
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )
    return _Contender(args).main()


class _Contender:
    """The contender process's state: its elector, the fence, the commands from stdin."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.client = Client(args.endpoints, timeout=3.0)
        self.guard = self.client.fence(args.resource)
        self.report = _Reporter(args.identity, sys.stdout, self.guard.current)
        self.commands: queue.Queue[str] = queue.Queue()
        self.version = 0
        self.quitting = threading.Event()
        self.elector = LeaderElector(
            self.client,
            args.election,
            identity=args.identity,
            ttl=args.ttl,
            on_elected=lambda token: self.report("elected", token=token.value, key=token.key),
            on_lost=lambda: self.report("resigned" if self.quitting.is_set() else "lost"),
            on_leader_change=self._on_leader_change,
            retry_interval=0.5,
        )

    def main(self) -> int:
        """Campaign in a thread; pass stdin's commands to it until ``quit`` or EOF."""

        def on_term(signum: int, frame: Any) -> None:
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, on_term)
        self.report("started", pid=os.getpid(), ttl=self.args.ttl)
        worker = threading.Thread(target=self._run_elector, name="elector", daemon=True)
        worker.start()
        self.report("campaigning", election=self.args.election)
        try:
            for line in sys.stdin:
                command = line.strip()
                if command == "quit":
                    break
                self.commands.put(command)
        finally:
            self._shut_down(worker)
        return 0

    def _shut_down(self, worker: threading.Thread) -> None:
        self.quitting.set()
        self.commands.put("quit")
        deadline = time.monotonic() + 3.0
        while worker.is_alive() and time.monotonic() < deadline:
            self.elector.stop()  # repeated: a stop() racing a campaign start can be missed
            worker.join(0.1)
        self.report("exit")
        self.client.close()

    def _run_elector(self) -> None:
        try:
            self.elector.run(self.work)
        except BaseException as exc:  # reported, then the process ends
            self.report("crashed", error=f"{type(exc).__name__}: {exc}")

    def _on_leader_change(self, leader: Leader | None) -> None:
        self.report(
            "sees", leader=None if leader is None else leader.value.decode("utf-8", "replace")
        )

    def work(self, token: FencingToken, stop: threading.Event) -> None:
        """One term: write once, then write whenever told, until the term or we end."""
        if not self.write(token, stop):
            return
        while True:
            command = self._next_command(stop)
            if command is None or command == "quit":
                return
            if command == "write":
                self.report("deciding", version=self.version + 1, token=token.value, believes=True)
                # A real process would compute the new config here. If it is paused now
                # it resumes right here, and writes without looking again.
                if self.commands.get() != "go" or not self.write(token, stop):
                    return

    def _next_command(self, stop: threading.Event) -> str | None:
        """The next command from stdin, or None once the term ended (``stop`` set)."""
        while True:
            try:
                return self.commands.get(timeout=0.05)
            except queue.Empty:
                if stop.is_set():
                    return None

    def write(self, token: FencingToken, stop: threading.Event) -> bool:
        """Write the next config version through the fence; report what became of it."""
        self.version += 1
        version, report = self.version, self.report
        body = json.dumps({"writer": self.args.identity, "token": token.value, "version": version})
        try:
            revision = self.guard.put(token, self.args.config_key, body)
        except StaleTokenError as exc:
            report(
                "write",
                result="rejected",
                version=version,
                token=token.value,
                current=exc.current,
                elector_noticed=stop.is_set(),
            )
            return False
        except EtcdfenceError as exc:  # not the story's point, but never hide it
            report("write", result="error", version=version, token=token.value, error=str(exc))
            return False
        report("write", result="accepted", version=version, token=token.value, revision=revision)
        return True


# ==========================================================================================
# the demo (parent process)
# ==========================================================================================


@dataclass
class _Node:
    name: str
    proc: subprocess.Popen[str]
    stderr: IO[str]
    belief: str = "starting"
    token: int | None = None
    frozen: bool = False
    exited: bool = False
    reader: procs.LineReader | None = None


@dataclass
class _Story:
    """What the verdict needs, collected while the timeline unfolds."""

    marks: list[int] = field(default_factory=list)
    accepted: list[tuple[str, int]] = field(default_factory=list)
    rejected: list[tuple[str, int, int]] = field(default_factory=list)


class _Demo:
    def __init__(self, out: IO[str], ttl: int) -> None:
        self.out = out
        self.ttl = ttl
        self.t0 = time.monotonic()
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.nodes: dict[str, _Node] = {}
        self.story = _Story()
        self.client: Client | None = None
        self.endpoint = ""

    # -- output -------------------------------------------------------------------------

    def mark(self) -> int:
        assert self.client is not None
        value = self.client.fence(RESOURCE).current()
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
        (else the demo's own read). The demo reads the mark for every row, in order;
        those reads make up the history the verdict checks.
        """
        stamp = (time.monotonic() if at is None else at) - self.t0
        observed = self.mark() if self.client is not None else 0
        shown = observed if mark is None else mark
        state = f"{self.beliefs():<34} mark={shown}" if self.nodes else ""
        self.out.write(f"t+{stamp:5.2f}s  {who:<4}  {text:<58}  {state}".rstrip() + "\n")
        self.out.flush()

    # -- contenders ---------------------------------------------------------------------

    def spawn(self, name: str) -> _Node:
        command = [
            sys.executable, "-m", "etcdfence._demo", "contender",
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
        with contextlib.suppress(ValueError):
            self.events.put((name, json.loads(line)))

    def send(self, node: _Node, command: str) -> None:
        assert node.proc.stdin is not None
        node.proc.stdin.write(command + "\n")
        node.proc.stdin.flush()

    def signal(self, node: _Node, signum: int) -> None:
        if node.proc.poll() is None:
            node.proc.send_signal(signum)

    # -- events -------------------------------------------------------------------------

    def expect(
        self,
        what: str,
        predicate: Callable[[str, dict[str, Any]], bool],
        timeout: float,
    ) -> dict[str, Any]:
        """Print events as they come until one satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DemoFailed(f"timed out after {timeout:.0f}s waiting for {what}")
            try:
                name, record = self.events.get(timeout=min(remaining, 0.1))
            except queue.Empty:
                self._check_alive(what)
                continue
            node = self.nodes[name]
            self.show(node, record)
            if predicate(name, record):
                return record

    def _check_alive(self, what: str) -> None:
        """Fail if a contender's output ended without its ``exit`` report. The reader
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
                name, record = self.events.get(timeout=remaining)
            except queue.Empty:
                return
            self.show(self.nodes[name], record)

    def show(self, node: _Node, record: dict[str, Any]) -> None:
        """Print a contender's report as a timeline row, updating what it believes."""
        describe = _DESCRIBE.get(str(record.get("event")))
        text = describe(self, node, record) if describe is not None else None
        if text is not None:
            mark = record.get("mark")
            self.line(node.name, text, record.get("t"), mark if isinstance(mark, int) else None)

    def _started(self, node: _Node, record: dict[str, Any]) -> str | None:
        node.belief = "-"
        return f"process started (pid {record['pid']}, lease ttl {record['ttl']}s)"

    def _campaigning(self, node: _Node, record: dict[str, Any]) -> str | None:
        node.belief = "candidate"
        return f"campaigns for {record['election']!r}"

    def _sees(self, node: _Node, record: dict[str, Any]) -> str | None:
        leader = record.get("leader")
        if node.token is not None or leader == node.name:
            return None  # a leader seeing itself: its "elected" row says it
        node.belief = f"follower({leader})" if leader else "candidate"
        return f"sees leader: {leader}" if leader else "sees: nobody leads"

    def _elected(self, node: _Node, record: dict[str, Any]) -> str | None:
        node.token = int(record["token"])
        node.belief = f"LEADER({node.token})"
        return f"elected leader, fencing token {node.token}"

    def _deciding(self, node: _Node, record: dict[str, Any]) -> str | None:
        return (
            f"decides to write config v{record['version']} "
            f"(believes it leads, token {record['token']})"
        )

    def _write(self, node: _Node, record: dict[str, Any]) -> str | None:
        result = record.get("result")
        if result == "accepted":
            self.story.accepted.append((node.name, int(record["token"])))
            return f"writes config v{record['version']} with token {record['token']} -> accepted"
        if result == "error":
            return f"write of config v{record['version']} FAILED: {record.get('error')}"
        self.story.rejected.append((node.name, int(record["token"]), int(record["current"])))
        return (
            f"writes config v{record['version']}, token {record['token']}"
            f" -> REJECTED: stale, mark is {record['current']}"
        )

    def _lost(self, node: _Node, record: dict[str, Any]) -> str | None:
        node.token = None
        node.belief = "stepped-down"
        return "notices it lost leadership: stops working, campaigns again"

    def _resigned(self, node: _Node, record: dict[str, Any]) -> str | None:
        node.token = None
        node.belief = "resigned"
        return "resigns (demo over)"

    def _crashed(self, node: _Node, record: dict[str, Any]) -> str | None:
        return f"crashed: {record.get('error')}"

    def _exit(self, node: _Node, record: dict[str, Any]) -> str | None:
        node.exited = True
        node.belief = "exited"
        return "exits"

    def _stderr_tail(self, node: _Node) -> str:
        with contextlib.suppress(OSError, ValueError):
            node.stderr.seek(0)
            tail = node.stderr.read()[-2000:].strip()
            if tail:
                return f"\n--- {node.name} stderr ---\n{tail}"
        return ""

    # -- the story ----------------------------------------------------------------------

    def play(self) -> bool:
        ttl = self.ttl
        a = self.spawn("A")
        self.expect("A to be elected", lambda n, r: n == "A" and r["event"] == "elected", 20)
        self.expect("A's first write", lambda n, r: n == "A" and r["event"] == "write", 10)
        b = self.spawn("B")
        self.expect(
            "B to see A lead",
            lambda n, r: n == "B" and r["event"] == "sees" and r.get("leader") == "A",
            20,
        )
        self.send(a, "write")
        self.expect("A to decide to write", lambda n, r: n == "A" and r["event"] == "deciding", 10)
        self.signal(a, signal.SIGSTOP)
        a.frozen = True
        frozen_at = time.monotonic()
        self.line("demo", "SIGSTOP A between deciding and writing (think: GC pause)")
        self.send(a, "go")  # waits in A's stdin pipe: the write it will do on waking
        self.expect(
            "B to be elected after A's lease expired",
            lambda n, r: n == "B" and r["event"] == "elected",
            ttl + 15,
        )
        self.expect("B's write", lambda n, r: n == "B" and r["event"] == "write", 10)
        self.line("demo", "A's lease expired while frozen: two nodes think they lead")
        time.sleep(max(0.3, ttl + 0.5 - (time.monotonic() - frozen_at)))
        self.signal(a, signal.SIGCONT)
        a.frozen = False
        self.line(
            "demo",
            f"SIGCONT A after {time.monotonic() - frozen_at:.1f}s: "
            f"it resumes mid-write, token {a.token}",
        )
        self.expect("A's delayed write", lambda n, r: n == "A" and r["event"] == "write", 10)
        self.expect("A to notice it lost", lambda n, r: n == "A" and r["event"] == "lost", 10)
        self.drain(0.5)
        outcome = self.judge()
        # A (now a follower) first: were B to resign first, A would lead and write again.
        for node in (a, b):
            self.send(node, "quit")
            with contextlib.suppress(DemoFailed):  # cleanup() makes sure of it anyway
                self.expect(
                    f"{node.name} to exit",
                    lambda n, r, who=node.name: n == who and r["event"] == "exit",  # type: ignore[misc]
                    5,
                )
        return self.verdict(outcome)

    def judge(self) -> dict[str, Any]:
        """Everything the verdict needs, read right after the story's climax."""
        assert self.client is not None
        kv = self.client.get(CONFIG_KEY)
        return {
            "raw": kv.value.decode() if kv is not None else None,
            "config": json.loads(kv.value) if kv is not None else None,
            "mark": self.mark(),
            "accepted": list(self.story.accepted),
            "rejected": list(self.story.rejected),
        }

    def verdict(self, outcome: dict[str, Any]) -> bool:
        self.mark()  # one last read for the history check
        marks = self.story.marks
        monotonic = all(x <= y for x, y in itertools.pairwise(marks))
        a_rejected = [r for r in outcome["rejected"] if r[0] == "A"]
        a_tokens = [t for n, t in outcome["accepted"] if n == "A"]
        b_tokens = [t for n, t in outcome["accepted"] if n == "B"]
        config = outcome["config"]
        history = " -> ".join(str(m) for i, m in enumerate(marks) if i == 0 or m != marks[i - 1])
        self.out.write("\n")
        self.out.write(f"config in etcd after the stale write ({CONFIG_KEY}): {outcome['raw']}\n")
        self.out.write(f"fence mark history (every read, in order): {history}\n")
        ok = (
            bool(a_rejected)
            and monotonic
            and bool(b_tokens)
            and config is not None
            and config.get("writer") == "B"
            and all(t < min(b_tokens) for t in a_tokens)
        )
        if ok:
            token, current = a_rejected[0][1], a_rejected[0][2]
            self.out.write(
                "without the fence, A's late write would have replaced B's config while B "
                "believed itself the only leader.\n"
            )
            self.out.write(
                f"verdict: PASS — zombie leader A's write with token {token} was rejected "
                f"(mark {current}); the mark never decreased; the config keeps B's write.\n"
            )
        else:
            why = []
            if not a_rejected:
                why.append("A's stale write was NOT rejected")
            if not monotonic:
                why.append("the mark decreased")
            if not config or config.get("writer") != "B":
                why.append(f"the config holds {config!r}, not B's write")
            self.out.write(f"verdict: FAIL — {'; '.join(why) or 'unexpected story'}\n")
        self.out.flush()
        return ok

    def cleanup(self) -> None:
        for node in self.nodes.values():
            procs.stop(node.proc, timeout=3)  # SIGTERM (and SIGCONT if frozen), then kill
            for stream in (node.proc.stdin, node.proc.stdout, node.stderr):
                with contextlib.suppress(OSError, AttributeError):
                    stream.close()  # type: ignore[union-attr]


#: A contender's report -> the method that updates the node and words its timeline row
#: (None: no row). Events not listed here are not shown.
_DESCRIBE: dict[str, Callable[[_Demo, _Node, dict[str, Any]], str | None]] = {
    "started": _Demo._started,
    "campaigning": _Demo._campaigning,
    "sees": _Demo._sees,
    "elected": _Demo._elected,
    "deciding": _Demo._deciding,
    "write": _Demo._write,
    "lost": _Demo._lost,
    "resigned": _Demo._resigned,
    "crashed": _Demo._crashed,
    "exit": _Demo._exit,
}


def run_demo(*, ttl: int = 2, out: IO[str] | None = None) -> int:
    """Play the zombie-leader story; 0 if the fence rejected the stale write, else 1."""
    from .testing import EtcdServer, EtcdStartError

    stream = sys.stdout if out is None else out
    demo = _Demo(stream, ttl)
    stream.write(
        "etcdfence demo: a leader frozen mid-write comes back as a zombie; the fence stops it.\n"
        f"  election {ELECTION!r} (lease ttl {ttl}s), config key {CONFIG_KEY!r} written "
        f"through fence {RESOURCE!r}\n"
        "  columns: time since start, node, what happened, [what each node believes], "
        "the fence's mark\n\n"
    )
    alarm = threading.Timer(DEMO_BUDGET, lambda: os.kill(os.getpid(), signal.SIGALRM))
    previous = signal.getsignal(signal.SIGALRM)

    def over_budget(signum: int, frame: Any) -> None:
        raise DemoFailed(f"the demo took longer than {DEMO_BUDGET:.0f}s")

    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        signal.signal(signal.SIGALRM, over_budget)
        alarm.daemon = True
        alarm.start()
    server = EtcdServer()
    try:
        try:
            server.start()
        except EtcdStartError as exc:
            raise DemoFailed(f"could not start the embedded etcd: {exc}") from None
        demo.endpoint = server.endpoint
        demo.client = Client(server.endpoint, timeout=3.0)
        version = ".".join(map(str, server.version))
        demo.line("demo", f"embedded etcd {version} up at {server.endpoint} (pid {server.pid})")
        ok = demo.play()
    except (DemoFailed, EtcdfenceError, OSError) as exc:
        stream.write(f"\nverdict: FAIL — {exc}\n")
        ok = False
    finally:
        alarm.cancel()
        if in_main:
            signal.signal(signal.SIGALRM, previous)
        demo.cleanup()
        if demo.client is not None:
            demo.client.close()
        server.stop()
    stream.flush()
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m etcdfence._demo [contender ...]``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "contender":
        return contender_main(argv[1:])
    return run_demo()


if __name__ == "__main__":
    raise SystemExit(main())
