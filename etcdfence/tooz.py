"""A tooz driver on etcdfence: ``tooz.coordination.get_coordinator("etcdfence://...", member)``.

Use it when an application (or an OpenStack service) already speaks tooz and should
coordinate through etcd with fencing tokens. Install ``etcdfence[tooz]``; the driver is
registered under tooz's ``tooz.backends`` entry point as ``etcdfence``::

    etcdfence://HOST:PORT[,HOST:PORT...][?OPTION=VALUE&...]

Options (query parameters; ``get_coordinator`` keyword arguments take precedence):

==================  =======  ===========================================================
``timeout``         30       whole seconds (1..9e9) a member, lock or leadership
                             outlives the last ``heartbeat()`` (also the lease TTL: a
                             dead process's holds end within it)
``request_timeout`` 5        seconds every etcd request may take (0.01..86400)
``prefix``          tooz     the key prefix for this driver's locks, groups, elections
``tls``             false    ``true``: talk https (implied by ``ca_cert``/``cert_cert``)
``ca_cert``                  CA bundle that signed etcd's certificate
``cert_cert``                client certificate (with ``cert_key``)
``cert_key``                 the client certificate's key
``server_name``              name expected in etcd's certificate
``username``                 etcd user (also ``user:password@`` before the hosts)
``password``                 its password
``executor``        thread   tooz's executor kind for the asynchronous results
==================  =======  ===========================================================

The coordinator holds one etcdfence session (a lease with TTL ``timeout``). tooz's
contract is that the application calls ``heartbeat()`` (or ``start(start_heart=True)``);
when no heartbeat came for ``timeout`` seconds the session is revoked — group
memberships, locks and leaderships of this coordinator end, as with tooz's other
timeout-based drivers — and the next use opens a new one.

Locks (:class:`EtcdfenceLock`) carry a fencing token (``lock.token``) while held: send
it with every write the lock protects. Exclusive and shared locks go through
``session.rwlock`` (the writer's token fences; a reader's token is the revision that
confirmed its hold, shared by the coordinator's shared holders).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

try:
    import tooz
    from tooz import coordination, locking
    from tooz import utils as tooz_utils
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without tooz
    raise ImportError(
        "etcdfence.tooz needs the tooz package; install it with `pip install 'etcdfence[tooz]'`"
    ) from exc

from . import _txn
from ._sync.client import Client
from ._sync.session import MAX_LEASE_TTL
from .errors import (
    AcquireTimeoutError,
    AuthError,
    EtcdfenceError,
    GroupNotEmptyError,
    GroupNotFoundError,
    MemberExistsError,
    SessionExpiredError,
    UnavailableError,
)

if TYPE_CHECKING:
    from ._sync.group import Group
    from ._sync.lock import Lock as _Side
    from ._sync.session import Session
    from .token import FencingToken
    from .types import KeyValue, Member

LOG = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_TIMEOUT = 30
DEFAULT_REQUEST_TIMEOUT = 5.0
#: A request that may take longer than a day is a mistake in the URL.
MAX_REQUEST_TIMEOUT = 86_400.0
_OPTIONS = frozenset(
    {
        "timeout",
        "request_timeout",
        "prefix",
        "tls",
        "ca_cert",
        "cert_cert",
        "cert_key",
        "server_name",
        "username",
        "password",
        "executor",
    }
)


class BadURLError(tooz.ToozError):
    """The ``etcdfence://`` URL or one of its options is invalid (raised by
    ``get_coordinator``, before anything connects)."""


def _as_bytes(value: str | bytes) -> bytes:
    """tooz ids are bytes; ``str`` ids are accepted and normalised to UTF-8 bytes."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"tooz ids are bytes or str, got {type(value).__name__}")


def _segment(value: str | bytes) -> str:
    """An id as one key segment: percent-encoded, so any bytes fit and stay readable."""
    return urllib.parse.quote(_as_bytes(value), safe="-_.~")


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """etcdfence errors as tooz errors (the original stays as ``__cause__``)."""
    try:
        yield
    except tooz.ToozError:
        raise
    except (UnavailableError, AuthError) as err:
        raise coordination.ToozConnectionError(str(err)) from err
    except EtcdfenceError as err:
        raise tooz.ToozError(str(err)) from err


# -- the URL -------------------------------------------------------------------------------


def _number(options: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    raw = options.get(name, default)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise BadURLError(f"etcdfence URL: {name}={raw!r} is not a number") from None
    if not low <= value <= high:  # NaN fails this too
        raise BadURLError(f"etcdfence URL: {name}={raw!r} must be a number in {low}..{high:g}")
    return value


def _whole_seconds(options: dict[str, Any], name: str, default: int, high: int) -> int:
    """A number of whole seconds in 1..high (``timeout`` is the lease TTL, which etcd
    keeps in whole seconds: ``2.5`` is refused rather than silently cut to 2)."""
    value = _number(options, name, default, 1, high)
    if value != int(value):
        raise BadURLError(
            f"etcdfence URL: {name}={options.get(name)!r} must be whole seconds "
            "(it is the etcd lease TTL)"
        )
    return int(value)


def _flag(options: dict[str, Any], name: str) -> bool:
    raw = str(options.get(name, "false")).lower()
    if raw not in ("1", "0", "true", "false", "yes", "no"):
        raise BadURLError(f"etcdfence URL: {name}={raw!r} must be true or false")
    return raw in ("1", "true", "yes")


def _hosts(netloc: str, tls: bool) -> tuple[list[str], str | None, str | None]:
    """``[user[:password]@]host:port[,host:port...]`` -> endpoints, user, password."""
    user = password = None
    if "@" in netloc:
        auth, netloc = netloc.rsplit("@", 1)
        user, _, password_text = auth.partition(":")
        user = urllib.parse.unquote(user) or None
        password = urllib.parse.unquote(password_text) if password_text else None
    endpoints = []
    for host in netloc.split(","):
        if not host.strip():
            raise BadURLError(f"etcdfence URL: empty host in {netloc!r} (HOST:PORT[,HOST:PORT])")
        parts = urllib.parse.urlsplit("//" + host.strip())
        try:
            port = parts.port or 2379
        except ValueError:
            raise BadURLError(f"etcdfence URL: bad port in {host!r}") from None
        if not parts.hostname:
            raise BadURLError(f"etcdfence URL: no host name in {host!r}")
        name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        endpoints.append(f"{'https' if tls else 'http'}://{name}:{port}")
    return endpoints, user, password


def parse_url(parsed_url: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The driver's settings from tooz's split URL and its collapsed options.

    Raises :class:`BadURLError` (a ``tooz.ToozError``) for anything it cannot use.
    """
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise BadURLError(
            f"etcdfence URL: unknown option(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(_OPTIONS))}"
        )
    if not parsed_url.netloc:
        raise BadURLError("etcdfence URL needs hosts: etcdfence://HOST:PORT[,HOST:PORT...]")
    tls = _flag(options, "tls") or bool(options.get("ca_cert") or options.get("cert_cert"))
    endpoints, user, password = _hosts(parsed_url.netloc, tls)
    if bool(options.get("cert_cert")) != bool(options.get("cert_key")):
        raise BadURLError("etcdfence URL: cert_cert and cert_key go together")
    timeout = _whole_seconds(options, "timeout", DEFAULT_TIMEOUT, MAX_LEASE_TTL)
    prefix = str(options.get("prefix", "tooz")).strip("/")
    if not prefix:
        raise BadURLError("etcdfence URL: prefix must not be empty")
    return {
        "endpoints": endpoints,
        "ttl": timeout,
        "request_timeout": _number(
            options, "request_timeout", DEFAULT_REQUEST_TIMEOUT, 0.01, MAX_REQUEST_TIMEOUT
        ),
        "prefix": prefix,
        "username": options.get("username") or user,
        "password": options.get("password") or password,
        "ca_file": options.get("ca_cert"),
        "cert_file": options.get("cert_cert"),
        "key_file": options.get("cert_key"),
        "server_name": options.get("server_name"),
    }


# -- locks -----------------------------------------------------------------------------------


class _Gate:
    """This coordinator's side of one lock name: which of its lock objects hold it.

    etcd sees one holder per coordinator (its session); the gate makes several lock
    objects of one coordinator exclude each other like separate processes would, and
    lets shared holders of one coordinator share its one read hold — but not past a
    writer queued since (this coordinator's, waiting here, or another's, with a key
    under ``<name>/write/``): then new shared acquires wait until the hold is given
    back and queue behind that writer at etcd, as separate readers would.

    A hold that ended without a release (the heartbeat watchdog revoked the session,
    the lease was lost) is dropped here at the next look (:meth:`purge`): its lock
    objects no longer hold, and this coordinator's other lock objects may acquire.
    """

    #: Seconds between looks at a hold that may have ended without a release.
    POLL = 0.2

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.writer: EtcdfenceLock | None = None
        self.write_side: _Side | None = None  # set once the writer holds at etcd
        self.writers_waiting = 0  # this coordinator's exclusive acquires waiting here
        self.readers: dict[EtcdfenceLock, int] = {}
        self.busy = False  # a read hold is being taken or given back at etcd
        self.read_side: _Side | None = None
        self.draining = False  # a writer is queued behind the read hold: no new sharers

    def purge(self) -> None:
        """Forget holds whose session ended (under ``cond``)."""
        if self.write_side is not None and self.write_side.token is None:
            self.writer = self.write_side = None
            self.cond.notify_all()
        if self.read_side is not None and self.read_side.token is None and not self.busy:
            self.readers.clear()
            self.read_side, self.draining = None, False
            self.cond.notify_all()

    def wait(self, ready: Callable[[], bool], blocking: bool, deadline: float | None) -> bool:
        """Wait (under ``cond``) until ``ready()``; False when not blocking or at deadline."""
        self.purge()
        while not ready():
            if not blocking:
                return False
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self.cond.wait(self.POLL if remaining is None else min(remaining, self.POLL))
            self.purge()
        return True


class EtcdfenceLock(locking.Lock):
    """A tooz lock on etcd: exclusive, or shared with ``acquire(shared=True)``.

    ``token`` is the :class:`~etcdfence.FencingToken` of the current hold (``None``
    when not held, including once the hold ended without a release — the heartbeat
    watchdog revoked the session): pass it to the resource with every write the lock
    protects, so a holder that lost the lock (paused past ``timeout``, cut off) is
    refused.
    """

    def __init__(self, driver: EtcdfenceDriver, name: bytes) -> None:
        super().__init__(name)
        self._driver = driver
        self._etcd_name = f"{driver.prefix}/lock/{_segment(name)}"
        self._gate = driver._gate(self._etcd_name)

    @property
    def token(self) -> FencingToken | None:
        """The current hold's token; ``None`` when not held (or the hold was lost)."""
        gate = self._gate
        with gate.cond:
            if gate.writer is self:
                side = gate.write_side
            elif gate.readers.get(self):
                side = gate.read_side
            else:
                return None
        return None if side is None else side.token

    def acquire(
        self, blocking: bool | float = True, shared: bool = False, timeout: float | None = None
    ) -> bool:
        blocking, timeout = tooz_utils.convert_blocking(blocking, timeout)
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        with _translated():
            if shared:
                return self._acquire_shared(bool(blocking), deadline)
            return self._acquire_exclusive(bool(blocking), deadline)

    def _take(self, side: _Side, blocking: bool, deadline: float | None) -> FencingToken | None:
        if not blocking:
            return side.try_acquire()
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return side.acquire(timeout=remaining)
        except AcquireTimeoutError:
            return None

    def _acquire_exclusive(self, blocking: bool, deadline: float | None) -> bool:
        gate = self._gate
        with gate.cond:
            gate.writers_waiting += 1
            try:
                free = gate.wait(
                    lambda: gate.writer is None and not gate.readers and not gate.busy,
                    blocking,
                    deadline,
                )
            finally:
                gate.writers_waiting -= 1
                gate.cond.notify_all()
            if not free:
                return False
            gate.writer = self
        token = side = None
        try:
            side = self._driver._exclusive_side(self._etcd_name)
            token = self._take(side, blocking, deadline)
        finally:
            with gate.cond:
                if token is None:
                    gate.writer = None
                else:
                    gate.write_side = side
                gate.cond.notify_all()
        return token is not None

    def _acquire_shared(self, blocking: bool, deadline: float | None) -> bool:
        gate = self._gate
        while True:
            with gate.cond:
                if not gate.wait(
                    lambda: (
                        gate.writer is None
                        and not gate.busy
                        and not gate.writers_waiting
                        and not (gate.readers and gate.draining)
                    ),
                    blocking,
                    deadline,
                ):
                    return False
                held = gate.read_side if gate.readers else None
                if held is None:
                    gate.busy = True
            if held is None:
                return self._take_shared(blocking, deadline)
            queued = self._driver._writer_queued(self._etcd_name)  # outside the gate
            with gate.cond:
                if gate.read_side is not held or not gate.readers:
                    continue  # the hold was given back meanwhile: look again
                if queued:
                    gate.draining = True  # join no more: let the hold go to the writer
                    continue
                if gate.writer is None and not gate.writers_waiting and not gate.draining:
                    gate.readers[self] = gate.readers.get(self, 0) + 1
                    return True

    def _take_shared(self, blocking: bool, deadline: float | None) -> bool:
        """Take this coordinator's read hold at etcd (``gate.busy`` is set)."""
        gate = self._gate
        token = None
        try:
            side = self._driver._shared_side(self._etcd_name)
            token = self._take(side, blocking, deadline)
        finally:
            with gate.cond:
                gate.busy = False
                if token is not None:
                    gate.read_side, gate.draining = side, False
                    gate.readers[self] = 1
                gate.cond.notify_all()
        return token is not None

    def release(self) -> bool:
        gate = self._gate
        with gate.cond:
            gate.purge()
            if gate.writer is self:
                side, gate.write_side = gate.write_side, None
                gate.writer = None
            elif gate.readers.get(self):
                gate.readers[self] -= 1
                if gate.readers[self] == 0:
                    del gate.readers[self]
                if gate.readers:
                    return True
                side, gate.read_side, gate.draining = gate.read_side, None, False
                gate.busy = True
            else:
                return False
        try:
            return self._give_back(side)
        finally:
            with gate.cond:
                gate.busy = False
                gate.cond.notify_all()

    @staticmethod
    def _give_back(side: _Side | None) -> bool:
        """Release ``side`` at etcd: True if it still held (False once broken or expired)."""
        if side is None:
            return False
        with _translated():
            try:
                held = side.is_owner()
            except SessionExpiredError:
                return False
            side.release()
            return held

    def is_still_owner(self) -> bool:
        gate = self._gate
        with gate.cond:
            side = gate.write_side if gate.writer is self else None
            if side is None and gate.readers.get(self):
                side = gate.read_side
        if side is None:
            return False
        with _translated():
            try:
                return side.is_owner()
            except SessionExpiredError:
                return False

    def break_(self) -> bool:
        """Delete the current holders' keys (every coordinator's): waiters go on."""
        with _translated():
            return self._driver._break(self._etcd_name)


# -- the driver ----------------------------------------------------------------------------------


class EtcdfenceDriver(
    coordination.CoordinationDriverCachedRunWatchers,
    coordination.CoordinationDriverWithExecutor,
):
    """tooz's coordination API on etcd through etcdfence (see the module docstring)."""

    CHARACTERISTICS = (
        coordination.Characteristics.DISTRIBUTED_ACROSS_THREADS,
        coordination.Characteristics.DISTRIBUTED_ACROSS_PROCESSES,
        coordination.Characteristics.DISTRIBUTED_ACROSS_HOSTS,
        # etcd's API guarantees: https://etcd.io/docs/v3.5/learning/api_guarantees/
        coordination.Characteristics.LINEARIZABLE,
        coordination.Characteristics.SERIALIZABLE,
    )

    def __init__(self, member_id: bytes, parsed_url: Any, options: dict[str, Any]) -> None:
        member_id = _as_bytes(member_id)
        super().__init__(member_id, parsed_url, options)
        self._settings = parse_url(parsed_url, self._options)
        self.prefix: str = self._settings["prefix"]
        self.timeout: int = self._settings["ttl"]
        self._client: Client | None = None
        self._session: Session | None = None
        self._session_lock = threading.RLock()
        # a name's gate lives while a lock object of it does (they hold it strongly)
        self._gates: weakref.WeakValueDictionary[str, _Gate] = weakref.WeakValueDictionary()
        self._gates_lock = threading.Lock()
        self._leading: dict[bytes, Any] = {}
        # group -> the session this coordinator joined it on: leave/update act on that
        # membership only, never on a replacement's of the same member id
        self._member_sessions: dict[bytes, Session] = {}
        self._last_beat = time.monotonic()
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def _start(self) -> None:
        s = self._settings
        with _translated():
            self._client = Client(
                s["endpoints"],
                timeout=s["request_timeout"],
                username=s["username"],
                password=s["password"],
                ca_file=s["ca_file"],
                cert_file=s["cert_file"],
                key_file=s["key_file"],
                server_name=s["server_name"],
            )
            try:
                self._last_beat = time.monotonic()
                self._live_session()
            except BaseException:
                self._client.close()
                self._client = None
                raise
        super()._start()
        self._stopping.clear()
        self._watchdog = threading.Thread(
            target=self._watch_beats, name="etcdfence-tooz-watchdog", daemon=True
        )
        self._watchdog.start()

    def _stop(self) -> None:
        self._stopping.set()
        if self._watchdog is not None:
            self._watchdog.join(5)
            self._watchdog = None
        self._leading.clear()
        with self._session_lock:
            session, self._session = self._session, None
        client, self._client = self._client, None
        try:
            if session is not None:
                with contextlib.suppress(EtcdfenceError):
                    session.close()
        finally:
            if client is not None:
                client.close()
        super()._stop()

    def heartbeat(self) -> float:
        """Keep this coordinator's memberships, locks and leaderships for another
        ``timeout`` seconds (renewing the session if it was lost); returns the seconds
        until the next heartbeat is due."""
        self._last_beat = time.monotonic()
        if self._client is not None:
            with _translated():
                self._live_session()
        return self.timeout / 2.0

    def _watch_beats(self) -> None:
        """Revoke the session once no heartbeat came for ``timeout`` seconds."""
        while not self._stopping.is_set():
            overdue = self._last_beat + self.timeout - time.monotonic()
            if overdue > 0:
                self._stopping.wait(min(overdue, 1.0))
                continue
            with self._session_lock:
                session, self._session = self._session, None
            if session is not None and not session.expired:
                LOG.warning(
                    "etcdfence tooz driver: no heartbeat for %ss; its groups, locks and "
                    "leaderships end",
                    self.timeout,
                )
                with contextlib.suppress(EtcdfenceError):
                    session.close()
            self._stopping.wait(1.0)

    def _live_session(self) -> Session:
        """The coordinator's session, opened anew if it expired or was revoked."""
        with self._session_lock:
            session = self._session
            if session is None or session.expired:
                if self._client is None:
                    raise tooz.ToozError("the coordinator is not started")
                session = self._client.session(self.timeout)
                session.open()
                self._session = session
            return session

    @property
    def client(self) -> Client:
        """The etcdfence client (for what tooz's API does not cover)."""
        if self._client is None:
            raise tooz.ToozError("the coordinator is not started")
        return self._client

    def _submit(self, fn: Callable[..., T], *args: Any) -> coordination.CoordinatorResult[T]:
        def run() -> T:
            with _translated():
                return fn(*args)

        return coordination.CoordinatorResult(self._executor.submit(run))

    # -- locks ---------------------------------------------------------------------------

    def get_lock(self, name: bytes) -> EtcdfenceLock:
        """An exclusive (or, with ``acquire(shared=True)``, shared) lock with a token."""
        return EtcdfenceLock(self, _as_bytes(name) if name else name)

    def _gate(self, name: str) -> _Gate:
        with self._gates_lock:
            gate = self._gates.get(name)
            if gate is None:
                gate = self._gates[name] = _Gate()
            return gate

    def _exclusive_side(self, name: str) -> _Side:
        return self._live_session().rwlock(name).write()

    def _shared_side(self, name: str) -> _Side:
        return self._live_session().rwlock(name).read()

    def _writer_queued(self, name: str) -> bool:
        """Whether a writer's key waits under ``name/write/`` (while this coordinator
        reads, every such key was created after its read key: it queues behind it)."""
        return bool(self.client.get_prefix(name + "/write/"))

    def _break(self, name: str) -> bool:
        """Delete the keys that hold ``name`` now (the first writer, or the readers ahead
        of every writer; for a mutex the first key), each guarded by its create revision."""
        kvs = sorted(self.client.get_prefix(name + "/"), key=lambda kv: kv.create_revision)
        holders: list[KeyValue] = []
        for kv in kvs:
            writer = b"/read/" not in kv.key[len(name) :]
            if writer and holders:
                break
            holders.append(kv)
            if writer:
                break
        broken = False
        for kv in holders:
            response = self.client.txn_raw(_txn.guarded_delete(kv.key, kv.create_revision))
            broken = broken or bool(response.succeeded)
        return broken

    # -- groups --------------------------------------------------------------------------

    def _group(self, group_id: bytes) -> Group:
        return self.client.group(f"{self.prefix}/group/{_segment(group_id)}")

    def _missing(self, group: Group, group_id: bytes) -> tooz.ToozError:
        """The error for a member that is not there: its group's, or its own."""
        if not group.exists():
            return coordination.GroupNotCreated(group_id)
        return coordination.MemberNotJoined(group_id, self._member_id)

    def create_group(self, group_id: bytes) -> coordination.CoordinatorResult[None]:
        def create() -> None:
            if not self._group(group_id).create():
                raise coordination.GroupAlreadyExist(group_id)

        return self._submit(create)

    def get_groups(self) -> coordination.CoordinatorResult[list[bytes]]:
        def groups() -> list[bytes]:
            base = f"{self.prefix}/group/"
            names = self.client.groups(base)
            return [urllib.parse.unquote_to_bytes(n[len(base) :]) for n in names]

        return self._submit(groups)

    def join_group(
        self, group_id: bytes, capabilities: coordination.Capabilities | None = None
    ) -> coordination.CoordinatorResult[None]:
        group_id = _as_bytes(group_id)
        value = b"" if capabilities is None else tooz_utils.dumps(capabilities)

        def join() -> None:
            group = self._group(group_id)
            if group_id in self._joined_groups and group.member(self._member_id) is not None:
                raise coordination.MemberAlreadyExist(group_id, self._member_id)
            session = self._live_session()
            try:
                group.join(self._member_id, value, session=session, create=False)
            except EtcdfenceError as err:
                self._raise_group_error(err, group_id)
            self._member_sessions[group_id] = session
            self._joined_groups.add(group_id)

        return self._submit(join)

    def _raise_group_error(self, err: EtcdfenceError, group_id: bytes) -> None:
        if isinstance(err, GroupNotFoundError):
            raise coordination.GroupNotCreated(group_id) from err
        if isinstance(err, GroupNotEmptyError):
            raise coordination.GroupNotEmpty(group_id) from err
        if isinstance(err, MemberExistsError):
            raise coordination.MemberAlreadyExist(group_id, self._member_id) from err
        raise err

    def leave_group(self, group_id: bytes) -> coordination.CoordinatorResult[None]:
        group_id = _as_bytes(group_id)

        def leave() -> None:
            group = self._group(group_id)
            session = self._member_sessions.pop(group_id, None)
            left = group.leave(self._member_id, session=session)
            self._joined_groups.discard(group_id)
            if not left:
                raise self._missing(group, group_id)

        return self._submit(leave)

    def delete_group(self, group_id: bytes) -> coordination.CoordinatorResult[None]:
        group_id = _as_bytes(group_id)

        def delete() -> None:
            try:
                self._group(group_id).delete()
            except EtcdfenceError as err:
                self._raise_group_error(err, group_id)

        return self._submit(delete)

    def _destroy_group(self, group_id: bytes) -> None:
        """Remove a group with its members (what an operator's cleanup would do)."""
        name = self._group(_as_bytes(group_id)).name
        with _translated():
            self.client.delete(name + "/", prefix=True)

    def _members(self, group_id: bytes) -> dict[bytes, Member]:
        group = self._group(group_id)
        info = group.members_info()
        if not info and not group.exists():
            raise coordination.GroupNotCreated(group_id)
        return {_as_bytes(mid): member for mid, member in info.items()}

    def get_members(self, group_id: bytes) -> coordination.CoordinatorResult[set[bytes]]:
        group_id = _as_bytes(group_id)
        return self._submit(lambda: set(self._members(group_id)))

    def get_members_with_capabilities(
        self, group_id: bytes
    ) -> coordination.CoordinatorResult[dict[bytes, coordination.Capabilities | None]]:
        group_id = _as_bytes(group_id)

        def members() -> dict[bytes, coordination.Capabilities | None]:
            return {m: _caps(info.capabilities) for m, info in self._members(group_id).items()}

        return self._submit(members)

    def _member(self, group_id: bytes, member_id: bytes) -> Member:
        group = self._group(group_id)
        member = group.member(_as_bytes(member_id))
        if member is None:
            if not group.exists():
                raise coordination.GroupNotCreated(group_id)
            raise coordination.MemberNotJoined(group_id, member_id)
        return member

    def get_member_capabilities(
        self, group_id: bytes, member_id: bytes
    ) -> coordination.CoordinatorResult[coordination.Capabilities | None]:
        group_id = _as_bytes(group_id)
        return self._submit(lambda: _caps(self._member(group_id, member_id).capabilities))

    def get_member_info(
        self, group_id: bytes, member_id: bytes
    ) -> coordination.CoordinatorResult[dict[str, Any]]:
        """Capabilities, and the etcd revisions at which the member joined
        (``created_revision``) and last updated them (``updated_revision``), and the
        lease that keeps it joined."""
        group_id = _as_bytes(group_id)

        def info() -> dict[str, Any]:
            member = self._member(group_id, member_id)
            return {
                "capabilities": _caps(member.capabilities),
                "created_revision": member.create_revision,
                "updated_revision": member.mod_revision,
                "lease_id": member.lease_id,
            }

        return self._submit(info)

    def update_capabilities(
        self, group_id: bytes, capabilities: coordination.Capabilities
    ) -> coordination.CoordinatorResult[None]:
        group_id = _as_bytes(group_id)
        value = tooz_utils.dumps(capabilities)

        def update() -> None:
            group = self._group(group_id)
            session = self._member_sessions.get(group_id)
            if not group.update(self._member_id, value, session=session):
                raise self._missing(group, group_id)

        return self._submit(update)

    # -- watchers and leaders ---------------------------------------------------------------

    def run_watchers(self, timeout: float | None = None) -> list[Any]:
        """Report joins and leaves since the last run, then run for leader in every
        group with an ``elected_as_leader`` watcher."""
        result = super().run_watchers(timeout)
        self.run_elect_coordinator()
        return result

    def _election_name(self, group_id: bytes) -> str:
        return f"{self.prefix}/leader/{_segment(group_id)}"

    def run_elect_coordinator(self) -> None:
        """Become leader of every watched group whose leadership is free right now
        (never waits) and run its ``elected_as_leader`` callbacks once per term."""
        with _translated():
            for group_id, hooks in list(self._hooks_elected_leader.items()):
                election = self._leading.get(group_id)
                if election is not None and election.token is not None:
                    continue  # still leading (the term ends with the session)
                self._leading.pop(group_id, None)
                election = self._live_session().election(self._election_name(group_id))
                try:
                    election.campaign(self._member_id, timeout=0)
                except AcquireTimeoutError:
                    continue
                self._leading[group_id] = election
                hooks.run(coordination.LeaderElected(group_id, self._member_id))

    def stand_down_group_leader(self, group_id: bytes) -> bool:
        """Resign the leadership of ``group_id``; False if not leading it."""
        election = self._leading.pop(group_id, None)
        if election is None:
            return False
        with _translated():
            election.resign()
        return True

    def unwatch_elected_as_leader(self, group_id: bytes, callback: Any) -> None:
        """Remove the callback; with the last one gone, stand down from leading."""
        super().unwatch_elected_as_leader(group_id, callback)
        if group_id not in self._hooks_elected_leader:
            self.stand_down_group_leader(group_id)

    def get_leader(self, group_id: bytes) -> coordination.CoordinatorResult[bytes]:
        def leader() -> Any:
            found = self.client.leader(self._election_name(group_id))
            return None if found is None else found.value

        return self._submit(leader)


def _caps(value: bytes) -> coordination.Capabilities | None:
    return tooz_utils.loads(value) if value else None  # type: ignore[no-any-return]
