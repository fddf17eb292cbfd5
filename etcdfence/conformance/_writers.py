"""Writers that run beside the kit: real processes (from a ``module:factory`` spec) or,
for an in-process adapter, threads. Both take the same commands and report history
events; scenarios that need several writers at once use them."""

from __future__ import annotations

import itertools
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..errors import EtcdfenceError
from ..testing.history import Event, Recorder, parse_events
from ..testing.procs import LineReader, start, stop
from ..token import ENV_VARS
from ._adapter import Adapter, as_adapter
from ._child import record_writes

__all__ = ["KitError", "ProcessWriter", "ThreadWriter", "Writer"]

#: Seconds a writer may take to build its adapter or to finish one command.
WRITER_TIMEOUT = 60.0


class KitError(EtcdfenceError):
    """The kit itself could not run a scenario (a writer died, etcd did not answer)."""


class Writer:
    """The common face of both kinds: ``send`` a command, ``wait`` for it, ``events``."""

    name: str
    #: The kit's data prefix: a key's resource name (for the history) is what follows it.
    data_prefix: str = ""

    def resource(self, key: str) -> str:
        """The history's resource name of ``key`` (the same the kit's own writes use)."""
        return key[len(self.data_prefix) :] if key.startswith(self.data_prefix) else key

    def send(self, contender: str, key: str, token: int | None, count: int = 1) -> int:
        raise NotImplementedError

    def _command(
        self, ids: Iterator[int], contender: str, key: str, token: int | None, count: int
    ) -> dict[str, Any]:
        """A numbered write command, as both kinds of writer carry it."""
        return {
            "id": next(ids),
            "contender": contender,
            "key": key,
            "resource": self.resource(key),
            "token": token,
            "count": count,
        }

    def wait(self, command: int, timeout: float = WRITER_TIMEOUT) -> None:
        raise NotImplementedError

    def events(self) -> list[Event]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def run(self, contender: str, key: str, token: int | None, count: int = 1) -> None:
        """``send`` and ``wait``: one command, done."""
        self.wait(self.send(contender, key, token, count))


class ProcessWriter(Writer):
    """A child process (``python -m etcdfence.conformance._child SPEC``) with its own
    adapter from the factory; ``env`` is added to its environment (a token for
    :meth:`~etcdfence.FencingToken.from_env`, say). It sees the parent's ``sys.path``
    and ``ETCDFENCE_ENDPOINTS``."""

    def __init__(
        self, spec: str, name: str, endpoints: list[str], env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        child_env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        child_env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *paths])
        child_env["ETCDFENCE_ENDPOINTS"] = ",".join(endpoints)
        child_env.update(env or {})
        args = [sys.executable, "-m", "etcdfence.conformance._child", spec]
        self.proc = start(args, env=child_env, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        self.out = LineReader(self.proc.stdout, name=f"conformance-{name}")
        self.err = LineReader(self.proc.stderr, name=f"conformance-{name}-err")
        self._ids = itertools.count(1)
        self._ready = False  # waited for at the first command: writers start in parallel

    def _wait_line(self, predicate: Callable[[str], bool], timeout: float, what: str) -> None:
        try:
            self.out.wait_for(predicate, timeout)
        except AssertionError:
            tail = "\n".join(self.err.lines[-15:])
            status = self.proc.poll()
            raise KitError(
                f"writer process {self.name} did not {what} within {timeout:.0f} s"
                + ("" if status is None else f" (exited {status})")
                + (f"; its stderr ends:\n{tail}" if tail else "")
            ) from None

    def send(self, contender: str, key: str, token: int | None, count: int = 1) -> int:
        if not self._ready:
            self._wait_line(lambda line: '"ready"' in line, WRITER_TIMEOUT, "build its adapter")
            self._ready = True
        line = self._command(self._ids, contender, key, token, count)
        command: int = line["id"]
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(line) + "\n")
            self.proc.stdin.flush()
        except OSError as err:
            raise KitError(f"writer process {self.name} is gone: {err}") from None
        return command

    def wait(self, command: int, timeout: float = WRITER_TIMEOUT) -> None:
        done = f'"detail":"done {command}"'
        self._wait_line(lambda line: done in line, timeout, f"finish command {command}")

    def events(self) -> list[Event]:
        return [e for e in parse_events(self.out.lines) if e.contender != "writer"]

    def close(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()  # EOF: the child closes its adapter and exits
            except OSError:
                pass
        try:
            self.proc.wait(10.0)
        except subprocess.TimeoutExpired:
            stop(self.proc)
        self.out.join(2.0)


class ThreadWriter(Writer):
    """A thread of this process writing through ``adapter`` (its own, or one shared
    with the kit: then the adapter must be thread-safe). ``env`` plays the
    environment for a token taken from it."""

    def __init__(
        self, adapter: Any, name: str, env: Mapping[str, str] | None = None, *, owned: bool = False
    ) -> None:
        self.name = name
        self.adapter: Adapter = as_adapter(adapter)
        self.owned = owned  # shut the adapter down with the writer
        self.env = dict(env or {})
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._done: dict[int, threading.Event] = {}
        self._errors: dict[int, BaseException] = {}
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._ids = itertools.count(1)
        self._recorders: dict[str, Recorder] = {}
        self._thread = threading.Thread(target=self._serve, name=f"conformance-{name}", daemon=True)
        self._thread.start()

    def _sink(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)

    def _serve(self) -> None:
        while (command := self._queue.get()) is not None:
            name = command["contender"]
            recorder = self._recorders.setdefault(name, Recorder(name, self._sink))
            try:
                if command["token"] is None:
                    command = {**command, "token": _env_token(self.env)}
                record_writes(self.adapter, recorder, command)
            except Exception as err:  # reported by wait()
                self._errors[command["id"]] = err
            finally:
                self._done[command["id"]].set()

    def send(self, contender: str, key: str, token: int | None, count: int = 1) -> int:
        line = self._command(self._ids, contender, key, token, count)
        command: int = line["id"]
        self._done[command] = threading.Event()
        self._queue.put(line)
        return command

    def wait(self, command: int, timeout: float = WRITER_TIMEOUT) -> None:
        if not self._done[command].wait(timeout):
            raise KitError(f"writer thread {self.name} did not finish within {timeout:.0f} s")
        error = self._errors.get(command)
        if error is not None:
            raise KitError(f"writer thread {self.name} failed: {type(error).__name__}: {error}")

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10.0)
        if self.owned:
            self.adapter.shutdown()


def _env_token(env: Mapping[str, str]) -> int:
    """The token a child would find in ``env`` (parsed as a child parses it)."""
    from ..token import FencingToken

    return FencingToken.from_env(env).value
