"""Plumbing shared by the curve benchmarks (``bench_drain``, ``bench_handoff``,
``bench_throughput``, ``bench_hold``, ``bench_failover``, ``bench_cluster``), which
``make bench`` runs and ``bench/report.py`` turns into ``bench/REPORT.md`` and the PNG
plots.

Each curve benchmark is a script that starts its own etcd (``etcdfence.testing``),
measures its contenders *side by side in one run* (alternating in rounds, so the
noise of a shared 2-core machine hits every contender alike) and writes one JSON
file to ``bench/out/``. Nothing here draws; ``report.py`` does.

What lives here: the machine description, starting etcd durable or with
``--unsafe-no-fsync``, request counters for etcdfence (wrapping the connection's
two entry points) and for python3-etcd3 (a gRPC client interceptor), CPU and memory
of a process from ``/proc``, child-process line readers with arrival timestamps, and
the JSON result files.

Run it directly to print the machine description: ``python bench/bench_curves.py``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import grpc

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
ROOT = HERE.parent

Json = dict[str, Any]


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


def host_port(endpoint: str) -> tuple[str, int]:
    host, port = endpoint.rsplit("//", 1)[-1].rsplit(":", 1)
    return host, int(port)


def fsync_label(fsync: bool) -> str:
    return "fsync" if fsync else "no-fsync"


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


# grpc ships no type stubs, so its interceptor bases are Any to mypy
class GrpcCounter(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):  # type: ignore[misc]
    """A gRPC client interceptor counting unary calls by method, stream opens, and
    the requests sent on streams (watch create / cancel, keepalive pings)."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter

    @staticmethod
    def _short(details: Any) -> str:
        return str(details.method).rsplit("/", 1)[-1]

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.counter.add(self._short(details))
        return continuation(details, request)

    def intercept_stream_stream(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        name = self._short(details)
        self.counter.add("stream:" + name)
        counter = self.counter

        def counted() -> Iterator[Any]:
            for request in request_iterator:
                if name == "Watch":
                    kind = request.WhichOneof("request_union") or "other"
                    counter.add("watch:" + kind.replace("_request", ""))
                else:
                    counter.add(name + ":message")
                yield request

        return continuation(details, counted())


def count_etcd3(client: Any, counter: Counter) -> None:
    """Count every request a python3-etcd3 client sends from now on: its endpoints'
    channels are wrapped with :class:`GrpcCounter` and its cached stubs dropped, so
    every stub (KV, Lease, Watch) is rebuilt on the counting channel."""
    interceptor = GrpcCounter(counter)
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


class LineReader:
    """Lines of a child's stdout, each stamped with ``time.monotonic()`` on arrival
    (read by a thread, so the stamp is not delayed by the parent's own work)."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: queue.Queue[tuple[float, str] | None] = queue.Queue()
        self.seen: list[str] = []
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put((time.monotonic(), line.rstrip("\n")))
        self.lines.put(None)

    def next(self, timeout: float) -> tuple[float, str]:
        try:
            item = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no line within {timeout}s (seen: {self.seen[-5:]})") from None
        if item is None:
            raise EOFError(f"child exited (seen: {self.seen[-5:]})")
        self.seen.append(item[1])
        return item


def spawn(args: list[str], env: dict[str, str] | None = None) -> tuple[Any, LineReader]:
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        bufsize=1,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    return proc, LineReader(proc.stdout)


def reap(proc: Any, timeout: float = 5.0) -> None:
    """Make sure a child we started is gone (terminate, then kill)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def python_child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def wait_until(check: Callable[[], bool], timeout: float, what: str, step: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


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


# --------------------------------------------------------------------------- results


def bench_args(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (make bench QUICK=1)")
    parser.add_argument("--out", type=Path, default=OUT, help="where the JSON result goes")
    return parser


def save(name: str, data: Json, out: Path = OUT) -> Path:
    """Write ``out/<name>.json`` with the machine description and load attached."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    data = {"bench": name, "machine": machine(), **data}
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}", flush=True)
    return path


def load(name: str, out: Path = OUT) -> Json | None:
    path = out / f"{name}.json"
    if not path.exists():
        return None
    data: Json = json.loads(path.read_text())
    return data


class Stopwatch:
    """Wall time and the load average around a benchmark, for its JSON result."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.load_before = loadavg()

    def result(self) -> Json:
        return {
            "seconds": round(time.monotonic() - self.started, 1),
            "load_before": self.load_before,
            "load_after": loadavg(),
        }


if __name__ == "__main__":
    json.dump(machine(), sys.stdout, indent=1)
    print()
