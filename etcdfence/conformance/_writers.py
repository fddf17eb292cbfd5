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
from ..fence.base import TokenLike
from ..history import Event, Recorder, parse_events
from ..testing.procs import LineReader, start, stop
from ..token import ENV_VARS, FencingToken
from ._adapter import Adapter, as_adapter, build, describe
from ._child import carried_token, record_writes

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

    def send(
        self,
        contender: str,
        key: str,
        token: TokenLike | None,
        count: int = 1,
        at: float | None = None,
        keys: list[str] | None = None,
    ) -> int:
        """Queue ``count`` writes of ``key`` with ``token``; ``at`` (a ``time.time()``
        moment) is the start barrier: the writer waits for it before the first write.
        ``keys``: instead, one write of each of these keys in turn."""
        raise NotImplementedError

    def ready(self) -> None:
        """Return once the writer can write at once (its adapter is built)."""

    def _command(
        self,
        ids: Iterator[int],
        contender: str,
        key: str,
        token: TokenLike | None,
        count: int,
        at: float | None = None,
        keys: list[str] | None = None,
    ) -> dict[str, Any]:
        """A numbered write command, as both kinds of writer carry it."""
        command = {
            "id": next(ids),
            "contender": contender,
            "key": key,
            "resource": self.resource(key),
            "token": carried_token(token),
            "count": count,
        }
        if at is not None:
            command["at"] = at
        if keys:
            command["keys"] = [[k, self.resource(k)] for k in keys]
        return command

    def wait(self, command: int, timeout: float = WRITER_TIMEOUT) -> None:
        raise NotImplementedError

    def events(self) -> list[Event]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def run(self, contender: str, key: str, token: TokenLike | None, count: int = 1) -> None:
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

    def ready(self) -> None:
        if not self._ready:
            self._wait_line(lambda line: '"ready"' in line, WRITER_TIMEOUT, "build its adapter")
            self._ready = True

    def send(
        self,
        contender: str,
        key: str,
        token: TokenLike | None,
        count: int = 1,
        at: float | None = None,
        keys: list[str] | None = None,
    ) -> int:
        self.ready()
        line = self._command(self._ids, contender, key, token, count, at, keys)
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
    """A thread of this process writing through an adapter: its own, built on this
    thread from ``factory`` (and closed on it), or ``adapter``, shared with the kit
    (then the adapter must be thread-safe, or ``route`` sends each write to the
    thread it belongs to). ``env`` plays the environment for a token taken from it.
    ``timeout`` bounds building the adapter and closing it."""

    def __init__(
        self,
        name: str,
        env: Mapping[str, str] | None = None,
        *,
        adapter: Any = None,
        factory: Callable[..., Any] | None = None,
        endpoints: list[str] | None = None,
        route: Callable[[Any, str, str], tuple[str, str | None]] | None = None,
        timeout: float = WRITER_TIMEOUT,
    ) -> None:
        self.name = name
        self.adapter: Adapter | None = None if adapter is None else as_adapter(adapter)
        self.factory, self.endpoints = factory, list(endpoints or [])
        self.route, self.timeout = route, timeout
        self.env = dict(env or {})
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._built = threading.Event()
        self._failure: str | None = None  # why the adapter could not be built or closed
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
        if self.factory is not None:
            try:
                self.adapter = build(self.factory, self.endpoints)
            except BaseException as err:  # the user's factory: reported by ready()
                self._failure = f"its adapter factory failed: {describe(err)}"
        self._built.set()
        try:
            self._commands()
        finally:
            if self.factory is not None and self.adapter is not None:
                try:
                    self.adapter.shutdown()
                except BaseException as err:  # reported by close()
                    self._failure = f"its adapter's close() raised {describe(err)}"

    def _commands(self) -> None:
        while (command := self._queue.get()) is not None:
            name = command["contender"]
            recorder = self._recorders.setdefault(name, Recorder(name, self._sink))
            try:
                if command["token"] is None:
                    command = {**command, "token": _env_token(self.env)}
                assert self.adapter is not None
                record_writes(self.route or self.adapter.attempt, recorder, command)
            except BaseException as err:  # reported by wait()
                self._errors[command["id"]] = err
            finally:
                self._done[command["id"]].set()

    def ready(self) -> None:
        if not self._built.wait(self.timeout):
            raise KitError(
                f"writer thread {self.name}'s adapter factory did not return within "
                f"{self.timeout:g} s"
            )
        if self.adapter is None:
            raise KitError(f"writer thread {self.name}: {self._failure}")

    def send(
        self,
        contender: str,
        key: str,
        token: TokenLike | None,
        count: int = 1,
        at: float | None = None,
        keys: list[str] | None = None,
    ) -> int:
        self.ready()
        line = self._command(self._ids, contender, key, token, count, at, keys)
        command: int = line["id"]
        self._done[command] = threading.Event()
        self._queue.put(line)
        return command

    def wait(self, command: int, timeout: float = WRITER_TIMEOUT) -> None:
        if not self._done[command].wait(timeout):
            raise KitError(f"writer thread {self.name} did not finish within {timeout:.0f} s")
        error = self._errors.get(command)
        if error is not None:
            raise KitError(f"writer thread {self.name} failed: {describe(error)}")

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def close(self) -> None:
        """End the thread (closing an adapter of its own there), waiting at most
        ``timeout``; :class:`KitError` if that failed or did not finish in time."""
        self._queue.put(None)
        if not self._built.is_set():
            raise KitError(f"writer thread {self.name}'s adapter factory never returned")
        self._thread.join(self.timeout)
        if self._thread.is_alive():
            raise KitError(f"writer thread {self.name} (closing its adapter) did not finish "
                           f"within {self.timeout:g} s")  # fmt: skip
        if self._failure is not None and self.adapter is not None:
            raise KitError(f"writer thread {self.name}: {self._failure}")


def _env_token(env: Mapping[str, str]) -> str:
    """The token a child would find in ``env`` (parsed as a child parses it), as a
    command carries it."""
    return FencingToken.from_env(env).to_header()[1]
