"""systemd's readiness and watchdog protocol (``sd_notify``), with the stdlib socket.

Under a ``Type=notify`` unit systemd sets ``$NOTIFY_SOCKET`` (a unix datagram socket;
a leading ``@`` means Linux's abstract namespace) and, with ``WatchdogSec=``,
``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``). ``etcdfence run``/``lock`` then send

* ``READY=1`` once they lead / hold the lock (a standby stays "activating": give the
  unit ``TimeoutStartSec=infinity``, see ``examples/deploy/``), with ``STATUS=`` lines
  that ``systemctl status`` shows;
* ``WATCHDOG=1`` every half watchdog interval, **only while** the health check holds
  (the session is live and etcd answered keepalives in time). A supervisor that is
  wedged or cut off stops pinging, and systemd restarts it after ``WatchdogSec``;
* ``STOPPING=1`` when they exit.

Without ``$NOTIFY_SOCKET`` every call is a no-op. The variables are removed from the
command's environment: it is not the unit's main process and must not speak for it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable

from ._output import warn

#: What systemd sets for the main process; the supervised command must not inherit it.
NOTIFY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
#: The shortest time between two pings, whatever ``$WATCHDOG_USEC`` says (no busy loop).
MIN_PING_INTERVAL = 0.01


def _address(raw: str) -> str | bytes:
    """``$NOTIFY_SOCKET`` as ``socket.connect`` takes it (``@name`` is abstract)."""
    if raw.startswith("@"):
        return b"\0" + raw[1:].encode()
    return raw


def _watchdog_interval(environ: dict[str, str] | os._Environ[str]) -> float | None:
    """Seconds between watchdog pings (half of ``$WATCHDOG_USEC``), or None when the
    watchdog is off or meant for another process (``$WATCHDOG_PID``)."""
    raw = environ.get("WATCHDOG_USEC")
    if not raw:
        return None
    pid = environ.get("WATCHDOG_PID")
    if pid and pid.strip() != str(os.getpid()):
        return None
    try:
        usec = int(raw)
    except ValueError:
        warn(f"ignoring $WATCHDOG_USEC={raw!r}: not a whole number of microseconds")
        return None
    return max(usec / 2e6, MIN_PING_INTERVAL) if usec > 0 else None


class Notifier:
    """Talks to systemd when ``$NOTIFY_SOCKET`` is set; otherwise does nothing.

    Use :meth:`from_env` in a command, :meth:`ready`/:meth:`status` as its state
    changes, :meth:`start_watchdog` with its health check, and :meth:`close` (which
    sends ``STOPPING=1``) when it exits.
    """

    def __init__(self, address: str | None, watchdog_interval: float | None = None) -> None:
        self.address = address
        self.watchdog_interval = watchdog_interval if address else None
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready = False
        self._warned = False
        self.pings = 0
        if address:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(True)

    @classmethod
    def from_env(cls) -> Notifier:
        """The notifier systemd's environment asks for (a no-op one outside systemd)."""
        address = os.environ.get("NOTIFY_SOCKET") or None
        return cls(address, _watchdog_interval(os.environ) if address else None)

    def send(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` lines as one datagram; False if there is no socket or
        the send failed (systemd gone: nothing to do about it here)."""
        if self._sock is None or self.address is None:
            return False
        try:
            self._sock.sendto("\n".join(assignments).encode(), _address(self.address))
        except OSError as exc:
            if not self._warned:  # once: a wrong $NOTIFY_SOCKET must not flood the log
                self._warned = True
                warn(f"cannot notify systemd at $NOTIFY_SOCKET={self.address!r}: {exc}")
            return False
        return True

    def ready(self, status: str) -> None:
        """``READY=1`` (the first time) with ``STATUS=status``."""
        if self._ready:
            self.status(status)
            return
        self._ready = True
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        """A one-line status ``systemctl status`` shows."""
        self.send(f"STATUS={status}")

    def start_watchdog(self, healthy: Callable[[], bool]) -> None:
        """Ping ``WATCHDOG=1`` every half interval while ``healthy()`` holds."""
        interval = self.watchdog_interval
        if interval is None or self._thread is not None:
            return

        def ping() -> None:
            try:
                ok = healthy()
            except Exception:  # a broken check is not a healthy service
                ok = False
            if ok and self.send("WATCHDOG=1"):
                self.pings += 1

        def loop() -> None:
            while not self._stop.wait(interval):
                ping()

        ping()
        self._thread = threading.Thread(target=loop, name="etcdfence-watchdog", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 2.0) -> None:
        """``STOPPING=1``, stop the watchdog pings (waiting up to ``timeout`` seconds for
        their thread), close the socket."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(max(0.0, min(2.0, timeout)))
        self.send("STOPPING=1")
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def child_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` without systemd's notify variables (for the supervised command)."""
    return {k: v for k, v in env.items() if k not in NOTIFY_ENV}
