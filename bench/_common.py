"""What every benchmark topic shares: results on disk, the rendered part, the machine,
an embedded etcd, request counters, ``/proc`` readings, child processes, statistics.

One topic = one module in ``bench/`` (``drain``, ``handoff``, ``recipes``, ``throughput``, ``hold``,
``failover``, ``cluster``, ``ordering``, ``client``, ``sql``, ``redisfence``, ``beat_failover``, …)
with two halves:

* ``measure(quick: bool) -> dict`` starts its own etcd, measures its contenders *side by
  side in one run* (alternating in rounds, so the noise of a shared machine hits every
  contender alike) and writes the raw numbers to ``bench/results/<topic>.json``;
* ``render(data) -> Part`` turns those numbers into the topic's report section (markdown,
  its rows of the targets table, its findings) and draws its plots into
  ``bench/results/``.

``python -m bench.<topic> [--quick]`` does both and writes ``bench/results/<topic>.part.json``;
``--render-only`` redraws from the last ``<topic>.json``. ``bench/report.py`` only
assembles ``bench/REPORT.md`` from the parts; ``bench/run_all.py`` (``make bench``) runs
the topics one process each, then the report.

Generated files live in ``bench/results/`` (``BENCH_RESULTS`` points elsewhere, e.g. for
a trial run that must not replace the committed results); code lives in ``bench/``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

Json = dict[str, Any]

#: The topics in report order.
TOPICS = (
    "drain",
    "handoff",
    "recipes",
    "throughput",
    "hold",
    "failover",
    "cluster",
    "ordering",
    "client",
    "sql",
    "redisfence",
    "scale",
    "http_gates",
    "admit",
    "kit_power",
    "beat_failover",
)


def results_dir() -> Path:
    """Where raw data, rendered parts and plots go (``BENCH_RESULTS``, else bench/results)."""
    return Path(os.environ.get("BENCH_RESULTS") or HERE / "results").resolve()


# --------------------------------------------------------------------------- machine


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (what else runs on this machine)."""
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> Json:
    """Everything a reader needs to judge the numbers: cores, CPU, versions, load."""
    from etcdfence.testing import etcd_version, find_etcd

    try:
        etcd = ".".join(map(str, etcd_version(find_etcd())))
    except Exception as exc:  # no binary: the benches will fail anyway
        etcd = f"unknown ({exc.__class__.__name__})"
    mem_kb = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "etcd": etcd,
        "grpcio": _version("grpcio"),
        "protobuf": _version("protobuf"),
        "etcdfence": _version("etcdfence"),
        "python3-etcd3": _version("python3-etcd3"),
        "loadavg": loadavg(),
    }


# --------------------------------------------------------------------------- etcd


def start_etcd(*, fsync: bool = True, extra: list[str] | None = None) -> Any:
    """A fresh single-member etcd on loopback (use as a context manager).

    ``fsync=False`` adds ``--unsafe-no-fsync``: the WAL is not synced, so the disk
    stops dominating every write and the clients' and etcd's CPU costs show.
    """
    from etcdfence.testing import EtcdServer

    args = [] if fsync else ["--unsafe-no-fsync"]
    return EtcdServer(extra_args=[*args, *(extra or [])])


def real_token(endpoint: str, name: str = "bench/token") -> Any:
    """A fencing token a real lock issued (acquired and released at once) on ``endpoint``.

    Every etcd fence refuses a token above etcd's current revision (FutureTokenError), so
    a guard bench writes with one of these, not a made-up large number; the equal token
    is accepted again and again (one term writing many times)."""
    import etcdfence as ef

    with ef.Client(endpoint) as client, client.session(ttl=10) as session:
        lock = session.lock(name)
        token = lock.acquire(timeout=10)
        lock.release()
    return token


def host_port(endpoint: str) -> tuple[str, int]:
    host, port = endpoint.rsplit("//", 1)[-1].rsplit(":", 1)
    return host, int(port)


def fsync_label(fsync: bool) -> str:
    return "fsync" if fsync else "no-fsync"


def quiet() -> None:
    """Keep the output to the progress lines: the library logs through structlog, and
    python3-etcd3 0.13's watcher thread dies with ``NameError: six`` whenever one of its
    clients is closed (harmless here: the client is done)."""
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    default = threading.excepthook

    def hook(args: Any) -> None:
        name = args.thread.name if args.thread is not None else ""
        if not (args.exc_type is NameError and name.startswith("etcd3_watch")):
            default(args)

    threading.excepthook = hook


def server_messages(endpoint: str) -> collections.Counter[str]:
    """Requests and stream messages etcd has received so far, by gRPC method
    (``grpc_server_msg_received_total`` on its ``/metrics``)."""
    text = urllib.request.urlopen(endpoint + "/metrics", timeout=5).read().decode()
    out: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        if line.startswith("grpc_server_msg_received_total{"):
            labels, value = line.rsplit(" ", 1)
            method = labels.split('grpc_method="', 1)[1].split('"', 1)[0]
            out[method] += int(float(value))
    return out


# --------------------------------------------------------------------------- /proc


_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of a process so far (``None``: this process)."""
    if pid is None:
        return time.process_time()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size now (not the peak)."""
    who = "self" if pid is None else str(pid)
    return int(Path(f"/proc/{who}/statm").read_text().split()[1]) * _PAGE


def threads_of(pid: int | None = None) -> int:
    who = "self" if pid is None else str(pid)
    for line in Path(f"/proc/{who}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


# --------------------------------------------------------------------------- counting


class Counter:
    """A thread-safe tally of requests by kind."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()

    def add(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.counts[kind] += n

    def snapshot(self) -> collections.Counter[str]:
        with self._lock:
            return collections.Counter(self.counts)


def count_etcdfence(client: Any, counter: Counter) -> None:
    """Count every request an etcdfence client (sync or async) sends from now on.

    ``client.on_call`` reports each request (by method, every attempt) and each
    stream open: a ``Watch`` stream carries exactly one create request
    (``stream:Watch`` = one watch created); the session's one ``LeaseKeepAlive``
    stream is counted once when opened, its pings are not.
    """
    client.on_call(lambda record: counter.add(record.method))


def count_etcd3(client: Any, counter: Counter) -> None:
    """Count every request a python3-etcd3 client sends from now on: its endpoints'
    channels are wrapped with a gRPC client interceptor (unary calls by method, stream
    opens, and the requests sent on streams: watch create / cancel, keepalive pings),
    and its cached stubs dropped, so every stub is rebuilt on the counting channel."""
    import grpc

    # grpc ships no type stubs, so its interceptor bases are Any to mypy
    class GrpcCounter(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):  # type: ignore[misc]
        @staticmethod
        def _short(details: Any) -> str:
            return str(details.method).rsplit("/", 1)[-1]

        def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            counter.add(self._short(details))
            return continuation(details, request)

        def intercept_stream_stream(
            self, continuation: Any, details: Any, request_iterator: Any
        ) -> Any:
            name = self._short(details)
            counter.add("stream:" + name)

            def counted() -> Iterator[Any]:
                for request in request_iterator:
                    if name == "Watch":
                        kind = request.WhichOneof("request_union") or "other"
                        counter.add("watch:" + kind.replace("_request", ""))
                    else:
                        counter.add(name + ":message")
                    yield request

            return continuation(details, counted())

    interceptor = GrpcCounter()
    for endpoint in client.endpoints.values():
        endpoint.channel = grpc.intercept_channel(endpoint.channel, interceptor)
    client._clear_old_stubs()


def requests_of(counts: collections.Counter[str]) -> int:
    """Requests etcd must serve: unary calls plus watch creations (and cancellations).

    etcdfence opens one stream per watch (``stream:Watch``: exactly one create
    request) and cancels by closing it. python3-etcd3 multiplexes its watches on one
    stream per client and sends ``watch:create`` / ``watch:cancel`` messages on it;
    for it those messages count, the shared stream's opening does not. Keepalive
    pings are not requests of the lock protocol and are never counted.
    """
    multiplexed = any(kind.startswith("watch:") for kind in counts)
    total = 0
    for kind, n in counts.items():
        if kind.startswith("watch:"):
            total += n
        elif kind == "stream:Watch":
            total += 0 if multiplexed else n
        elif ":" not in kind:
            total += n
    return total


# --------------------------------------------------------------------------- children


def python_child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


# --------------------------------------------------------------------------- stats


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values`` by linear interpolation."""
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def interleave(contenders: dict[str, Callable[[], int]], rounds: int) -> dict[str, float]:
    """Run each contender ``rounds`` times in alternation; return median ops/s.

    Each callable performs a batch and returns the number of operations it did.
    """
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.perf_counter()
            ops = fn()
            rates[name].append(ops / (time.perf_counter() - start))
    return {name: statistics.median(r) for name, r in rates.items()}


class Stopwatch:
    """Wall time and the load average around a measurement, for its JSON result."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.load_before = loadavg()

    def result(self) -> Json:
        return {
            "seconds": round(time.monotonic() - self.started, 1),
            "load_before": self.load_before,
            "load_after": loadavg(),
        }


# --------------------------------------------------------------------------- raw data


def save_data(topic: str, data: Json, clock: Stopwatch | None = None) -> Json:
    """Write ``results/<topic>.json`` (machine description and load attached); return it."""
    out = results_dir()
    out.mkdir(parents=True, exist_ok=True)
    data = {"bench": topic, "machine": machine(), **data, **(clock.result() if clock else {})}
    path = out / f"{topic}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {_shown(path)}", flush=True)
    return data


def load_data(topic: str) -> Json | None:
    path = results_dir() / f"{topic}.json"
    if not path.exists():
        return None
    data: Json = json.loads(path.read_text())
    return data


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


# --------------------------------------------------------------------------- rendering


@dataclass
class Part:
    """One topic's share of the report, as rendered from its raw data."""

    topic: str
    title: str
    section: str  # markdown, without the heading (report.py numbers the sections)
    targets: list[list[str]] = field(default_factory=list)  # [what, goal, measured, verdict]
    findings: str = ""  # markdown with its own ### heading, or ""
    machine: Json | None = None
    note: str = ""  # where the numbers come from, when not from a plain run
    missed: list[str] = field(default_factory=list)

    def add(self, key: str, what: str, measured: str, ok: bool | None, goal: str) -> None:
        """Add a row to the targets table (``ok`` None: no verdict); ``key`` names the
        target for the topic's own findings (``self.missed`` lists the keys not met)."""
        verdict = "n/a" if ok is None else ("**met**" if ok else "**NOT met**")
        self.targets.append([what, goal, measured, verdict])
        if ok is False:
            self.missed.append(key)


def save_part(part: Part) -> Path:
    out = results_dir()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{part.topic}.part.json"
    path.write_text(json.dumps(asdict(part), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {_shown(path)}", flush=True)
    return path


def load_part(topic: str, where: Path | None = None) -> Part | None:
    path = (where or results_dir()) / f"{topic}.part.json"
    if not path.exists():
        return None
    return Part(**json.loads(path.read_text()))


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def ms(x: float) -> str:
    return f"{x:.2f} ms" if x < 10 else f"{x:.1f} ms"


def ratio(x: float) -> str:
    return f"{x:.2f}×"


MODE_TEXT = {"fsync": "durable etcd (fsync)", "no-fsync": "etcd --unsafe-no-fsync"}
STYLE = {"fsync": "-", "no-fsync": "--"}


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend (imported when a topic draws)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_plot(fig: Any, name: str) -> str:
    """Write a figure to ``results/<name>``; return its link as seen from bench/REPORT.md."""
    plt = pyplot()
    out = results_dir()
    out.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return f"{out.name}/{name}"


def plain_axis(
    ax: Any, axis: str = "x", ticks: list[float] | None = None, minor: bool = False
) -> None:
    """Plain numbers (1, 100, 10000) instead of 10^n on a log axis."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    target = ax.xaxis if axis == "x" else ax.yaxis
    if ticks is not None:
        target.set_ticks(ticks)
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(FuncFormatter(_one_two_five) if minor else NullFormatter())


def _one_two_five(value: float, _: Any) -> str:
    """Label the 2, 3 and 5 ×10^n minor ticks of a log axis, leave the others bare."""
    if value <= 0:
        return ""
    mantissa = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if mantissa in (2, 3, 5) else ""


# --------------------------------------------------------------------------- a topic's CLI


def topic_args(doc: str | None) -> argparse.ArgumentParser:
    """The options every topic script takes; topics add their own sizes."""
    parser = argparse.ArgumentParser(
        description=(doc or "").splitlines()[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds (make bench QUICK=1)")
    parser.add_argument(
        "--render-only", action="store_true", help="redraw from the last results/<topic>.json"
    )
    return parser


def run_topic(
    topic: str, measure: Callable[[], Json], render: Callable[[Json], Part], render_only: bool
) -> int:
    """Measure (unless ``render_only``), then render and save the topic's part."""
    if render_only:
        data = load_data(topic)
        if data is None:
            print(f"no {_shown(results_dir() / topic)}.json to render", file=sys.stderr)
            return 1
    else:
        data = measure()
    save_part(render(data))
    return 0


def rounds_waiters_main(
    topic: str,
    doc: str | None,
    measure: Callable[..., Json],
    render: Callable[[Json], Part],
    argv: list[str] | None,
    waiters: str,
) -> int:
    """The CLI of a topic sized by ``--rounds``, ``--waiters`` (a list of N) and
    ``--modes`` (etcd with and without fsync): ``measure(quick, rounds=, waiters=,
    modes=)``. Used by ``drain`` and ``recipes``."""
    parser = topic_args(doc)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--waiters", default=waiters)
    parser.add_argument("--modes", default=None, help="fsync,no-fsync (quick: fsync only)")
    args = parser.parse_args(argv)

    def run() -> Json:
        return measure(
            args.quick,
            rounds=args.rounds,
            waiters=[int(x) for x in args.waiters.split(",")],
            modes=args.modes.split(",") if args.modes else None,
        )

    return run_topic(topic, run, render, args.render_only)
