"""An etcd cluster whose members live in network namespaces, for partitions *between members*.

Use :class:`NetnsCluster` when a test needs the network between etcd members to fail —
a symmetric cut, a one-way (asymmetric) cut, a flapping link, or the raft leader
isolated in a minority — rather than the link between a client and etcd (that is
:class:`~etcdfence.testing.FaultProxy`'s job). :class:`~etcdfence.testing.EtcdCluster`
cannot do this: members on loopback dial their peers from ``127.0.0.1``, so no
address-based rule tells them apart.

Layout (all of it inside namespaces this module creates and deletes; no route, address
or rule is added to the namespace the tests run in)::

    root namespace                hub namespace               member namespaces
    127.0.0.1:<free port> ─fd─▶  forwarder (10.213.0.254) ─┐
                                  bridge br0 ───── veth ───▶ m0: eth0 10.213.0.1  etcd
                                                  ── veth ───▶ m1: eth0 10.213.0.2  etcd
                                                  ── veth ───▶ m2: eth0 10.213.0.3  etcd

- every member runs ``ip netns exec <member ns> etcd …`` listening on its namespace's
  address (client port 2379, peer port 2380; each namespace has its own ports);
- a small forwarder (``_netns_forward.py``) runs in the hub namespace on listening
  sockets bound on ``127.0.0.1`` in the root namespace and handed down as file
  descriptors: :attr:`NetnsCluster.endpoints` are those loopback URLs, one per member,
  so a client given one endpoint talks to exactly that member;
- faults are ``iptables -A INPUT -s <peer> -j DROP`` in the *receiving* member's
  namespace (a lost packet, not a send error). Client traffic comes from the hub's
  address and is never dropped: an isolated member still serves the clients connected
  to it, which is the point of the classic "leader in a minority" scenario.

Needs root, ``ip`` (iproute2) and ``iptables`` (or ``iptables-nft``/``iptables-legacy``);
:func:`netns_unavailable` says why not, for a ``pytest.skip``. Namespaces left behind by
a process that was SIGKILLed are deleted by the next cluster that starts.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError
from .server import (
    _HOST,
    EtcdCluster,
    EtcdServer,
    _make_workdir,
    _pdeathsig_prefix,
    _sweep_stale_workdirs,
)

__all__ = ["NetnsCluster", "NetnsUnavailable", "netns_unavailable"]

SUBNET = "10.213.0"
"""The /24 the members use; it exists only inside the namespaces of a cluster."""
HUB_ADDRESS = f"{SUBNET}.254"
CLIENT_PORT = 2379
PEER_PORT = 2380
_PREFIX = "efn"
_FORWARDER = str(Path(__file__).with_name("_netns_forward.py"))
_counter = 0
_counter_lock = threading.Lock()


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be used here (not root, or ``ip``/``iptables`` missing)."""


def _iptables() -> str | None:
    for name in ("iptables", "iptables-nft", "iptables-legacy"):
        path = shutil.which(name) or next(
            (p for d in ("/usr/sbin", "/sbin") if os.access(p := f"{d}/{name}", os.X_OK)), None
        )
        if path:
            return path
    return None


def _ip() -> str | None:
    return shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip", "/bin/ip") if os.access(p, os.X_OK)), None
    )


def netns_unavailable() -> str | None:
    """Why a :class:`NetnsCluster` cannot run here, or ``None`` if it can.

    Use it to skip a test cleanly: ``if (why := netns_unavailable()): pytest.skip(why)``.
    """
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns, iptables)"
    if _ip() is None:
        return "`ip` (iproute2) is not installed"
    if _iptables() is None:
        return "`iptables` is not installed (apt-get install iptables)"
    probe = subprocess.run(
        [str(_ip()), "netns", "list"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    return None


def _run(args: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise NetnsUnavailable(f"{' '.join(args)} failed: {result.stderr.strip()}")
    return result


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _sweep_stale_namespaces() -> None:
    """Delete namespaces of this module whose creating process is gone (and kill what
    still runs in them: only processes we started end up there)."""
    ip = _ip()
    if ip is None:
        return
    listing = _run([ip, "netns", "list"], check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        match = re.fullmatch(rf"{_PREFIX}(\d+)x\d+-(hub|m\d+)", name)
        if match is None or _pid_alive(int(match.group(1))):
            continue
        for pid_text in _run([ip, "netns", "pids", name], check=False).stdout.split():
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(pid_text), signal.SIGKILL)
        _run([ip, "netns", "delete", name], check=False)


@dataclass(eq=False)
class _Network:
    """The namespaces, links and forwarder of one cluster (shared with its finalizer)."""

    tag: str
    size: int
    ip: str
    iptables: str
    created: list[str] = field(default_factory=list)
    forwarder: subprocess.Popen[str] | None = None
    listeners: list[socket.socket] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def hub(self) -> str:
        return f"{self.tag}-hub"

    def member_ns(self, index: int) -> str:
        return f"{self.tag}-m{index}"

    @staticmethod
    def address(index: int) -> str:
        return f"{SUBNET}.{index + 1}"

    def _ipn(self, ns: str, *args: str) -> None:
        _run([self.ip, "-n", ns, *args])

    def setup(self) -> None:
        """Create the namespaces, the bridge, one veth per member and the forwarder."""
        with self.lock:
            for name in [self.hub, *(self.member_ns(i) for i in range(self.size))]:
                _run([self.ip, "netns", "add", name])
                self.created.append(name)
            hub = self.hub
            # bridged frames of the hub stay out of iptables (br_netfilter may be loaded)
            _run(
                [self.ip, "netns", "exec", hub, "sysctl", "-qw",
                 "net.bridge.bridge-nf-call-iptables=0"],
                check=False,
            )  # fmt: skip
            self._ipn(hub, "link", "set", "lo", "up")
            self._ipn(hub, "link", "add", "br0", "type", "bridge")
            self._ipn(hub, "addr", "add", f"{HUB_ADDRESS}/24", "dev", "br0")
            self._ipn(hub, "link", "set", "br0", "up")
            for i in range(self.size):
                ns = self.member_ns(i)
                self._ipn(hub, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0",
                          "netns", ns)  # fmt: skip
                self._ipn(hub, "link", "set", f"v{i}", "master", "br0", "up")
                self._ipn(ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                self._ipn(ns, "link", "set", "eth0", "up")
                self._ipn(ns, "link", "set", "lo", "up")
            self._start_forwarder()

    def _start_forwarder(self) -> None:
        specs = []
        for i in range(self.size):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((_HOST, 0))
            sock.listen(128)
            self.listeners.append(sock)
            self.ports.append(int(sock.getsockname()[1]))
            specs.append(f"{sock.fileno()}:{self.address(i)}:{CLIENT_PORT}")
        in_main = threading.current_thread() is threading.main_thread()
        self.forwarder = subprocess.Popen(
            [*(_pdeathsig_prefix() if in_main else []), self.ip, "netns", "exec", self.hub,
             sys.executable, "-I", _FORWARDER, *specs],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            pass_fds=[s.fileno() for s in self.listeners],
            text=True,
            start_new_session=True,
        )  # fmt: skip
        assert self.forwarder.stdout is not None
        if self.forwarder.stdout.readline().strip() != "ready":
            raise NetnsUnavailable("the namespace forwarder did not start")
        # the forwarder owns the listening sockets now; ours would only steal connections
        for sock in self.listeners:
            sock.close()
        self.listeners.clear()

    # -- rules ------------------------------------------------------------------------

    def xt(self, index: int, *args: str, check: bool = True) -> bool:
        result = _run(
            [self.ip, "netns", "exec", self.member_ns(index), self.iptables, "-w", *args],
            check=check,
        )
        return result.returncode == 0

    def drop(self, src: int, dst: int) -> None:
        rule = ("INPUT", "-s", self.address(src), "-j", "DROP")
        with self.lock:
            if not self.xt(dst, "-C", *rule, check=False):
                self.xt(dst, "-A", *rule)

    def undrop(self, src: int, dst: int) -> None:
        rule = ("INPUT", "-s", self.address(src), "-j", "DROP")
        with self.lock:
            while self.xt(dst, "-C", *rule, check=False):
                self.xt(dst, "-D", *rule)

    def flush(self) -> None:
        with self.lock:
            for i in range(self.size):
                self.xt(i, "-F", "INPUT", check=False)

    def rules(self) -> list[tuple[int, int]]:
        """``(src, dst)`` pairs currently dropped, read back from the namespaces."""
        out = []
        for dst in range(self.size):
            text = _run(
                [self.ip, "netns", "exec", self.member_ns(dst), self.iptables, "-w", "-S",
                 "INPUT"],
                check=False,
            ).stdout  # fmt: skip
            for src in range(self.size):
                if f"-s {self.address(src)}/32 -j DROP" in text:
                    out.append((src, dst))
        return out

    def teardown(self) -> None:
        with self.lock:
            for sock in self.listeners:
                sock.close()
            self.listeners.clear()
            if self.forwarder is not None and self.forwarder.poll() is None:
                self.forwarder.kill()
                self.forwarder.wait(5)
            if self.forwarder is not None and self.forwarder.stdout is not None:
                self.forwarder.stdout.close()
            self.forwarder = None
            for name in reversed(self.created):
                _run([self.ip, "netns", "delete", name], check=False)
            self.created.clear()


_live_networks: set[_Network] = set()


def _teardown(network: _Network) -> None:
    network.teardown()
    _live_networks.discard(network)


@atexit.register
def _teardown_all() -> None:
    for network in list(_live_networks):
        _teardown(network)


class _NetnsMember(EtcdServer):
    """An :class:`EtcdServer` started inside a member namespace: it listens on its
    namespace address; :attr:`endpoint` is the forwarded loopback URL in the root
    namespace."""

    def __init__(self, *, netns: str, ip: str, address: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._netns = netns
        self._ip_bin = ip
        self._address = address

    @property
    def netns(self) -> str:
        """The member's network namespace."""
        return self._netns

    @property
    def address(self) -> str:
        """The member's address inside the namespaces."""
        return self._address

    @property
    def peer_url(self) -> str:
        return f"http://{self._address}:{PEER_PORT}"

    def command(self) -> list[str]:
        args = super().command()
        inside = f"http://{self._address}:{CLIENT_PORT}"
        for flag in ("--listen-client-urls", "--advertise-client-urls"):
            args[args.index(flag) + 1] = inside
        return [self._ip_bin, "netns", "exec", self._netns, *args]


class NetnsCluster(EtcdCluster):
    """``size`` etcd members, each in its own network namespace, with faults on the links
    between members (see :mod:`etcdfence.testing.netns` for the layout).

    Everything :class:`~etcdfence.testing.EtcdCluster` does (kill, pause, resume,
    restart, :attr:`endpoints`), plus link faults — all drop packets at the receiver and
    are undone by :meth:`heal`:

    - :meth:`cut` ``(i, j)``: no packets between members ``i`` and ``j``, either way;
    - :meth:`cut_oneway` ``(src, dst)``: ``dst`` receives nothing from ``src``;
    - :meth:`isolate` ``(i)``: member ``i`` is cut from every peer (its clients still
      reach it);
    - :meth:`flap` ``(i, j, period)``: the link goes down and up every ``period``
      seconds in a background thread until :meth:`heal`.

    :meth:`leader_index` finds the leader by majority: an isolated ex-leader still
    claims leadership for a while, and a member right after a heal reports none.
    Raises :class:`NetnsUnavailable` on :meth:`start` where :func:`netns_unavailable`
    returns a reason.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        binary: str | None = None,
        extra_args: Sequence[str] = (),
        heartbeat_interval_ms: int = 50,
        election_timeout_ms: int = 500,
        start_timeout: float = 60.0,
    ) -> None:
        super().__init__(
            size,
            binary=binary,
            extra_args=extra_args,
            heartbeat_interval_ms=heartbeat_interval_ms,
            election_timeout_ms=election_timeout_ms,
            start_timeout=start_timeout,
        )
        self._network: _Network | None = None
        self._flappers: list[tuple[threading.Thread, threading.Event]] = []

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> NetnsCluster:
        """Create the namespaces and the forwarder, then start every member."""
        if self._members:
            return self
        why = netns_unavailable()
        if why is not None:
            raise NetnsUnavailable(why)
        _sweep_stale_namespaces()
        global _counter
        with _counter_lock:
            _counter += 1
            tag = f"{_PREFIX}{os.getpid()}x{_counter}"
        ip, iptables = _ip(), _iptables()
        assert ip is not None and iptables is not None
        network = _Network(tag, self._size, ip, iptables)
        self._network = network
        _live_networks.add(network)
        weakref.finalize(self, _teardown, network)
        try:
            network.setup()
            super().start()
        except BaseException:
            self.stop()
            raise
        return self

    def _create_members(self) -> list[EtcdServer]:
        network = self._net
        _sweep_stale_workdirs()
        workdir = _make_workdir("netns")
        self._workdir_box.append(workdir)
        names = [f"etcd{i}" for i in range(self._size)]
        initial = ",".join(
            f"{name}=http://{network.address(i)}:{PEER_PORT}" for i, name in enumerate(names)
        )
        token = f"etcdfence-{network.tag}"
        return [
            _NetnsMember(
                netns=network.member_ns(i),
                ip=network.ip,
                address=network.address(i),
                binary=self._binary,
                extra_args=self._extra_args,
                name=name,
                heartbeat_interval_ms=self._heartbeat,
                election_timeout_ms=self._election,
                start_timeout=self._start_timeout,
                client_port=network.ports[i],
                peer_port=PEER_PORT,
                initial_cluster=initial,
                initial_cluster_token=token,
                workdir=workdir,
            )
            for i, name in enumerate(names)
        ]

    def stop(self, *, grace: float = 1.0) -> None:
        """Stop flapping, stop every member, delete the namespaces. Idempotent."""
        self._stop_flapping()
        super().stop(grace=grace)
        if self._network is not None:
            _teardown(self._network)

    def __enter__(self) -> NetnsCluster:
        return self.start()

    def __repr__(self) -> str:
        tag = self._network.tag if self._network else "-"
        return f"<NetnsCluster {tag} {self._members!r}>"

    @property
    def _net(self) -> _Network:
        if self._network is None:
            raise RuntimeError("cluster not started")
        return self._network

    # ---------------------------------------------------------------- link faults

    def _check(self, *indexes: int) -> None:
        for index in indexes:
            if isinstance(index, bool) or not isinstance(index, int):
                raise InvalidArgumentError(f"member index must be an int, got {index!r}")
            if not 0 <= index < self._size:
                raise InvalidArgumentError(f"no member {index} in a cluster of {self._size}")
        if len(indexes) == 2 and indexes[0] == indexes[1]:
            raise InvalidArgumentError(f"a link needs two different members, got {indexes}")

    def address(self, index: int) -> str:
        """Member ``index``'s address inside the namespaces (e.g. ``10.213.0.1``)."""
        self._check(index)
        return _Network.address(index)

    def cut_oneway(self, src: int, dst: int) -> None:
        """Member ``dst`` drops every packet from member ``src`` (``src`` still hears
        ``dst``'s packets, but TCP acknowledgements it sends back are lost too)."""
        self._check(src, dst)
        self._net.drop(src, dst)

    def cut(self, i: int, j: int) -> None:
        """No packets between members ``i`` and ``j`` in either direction."""
        self._check(i, j)
        self._net.drop(i, j)
        self._net.drop(j, i)

    def uncut(self, i: int, j: int) -> None:
        """Undo :meth:`cut` / :meth:`cut_oneway` between ``i`` and ``j`` (both ways)."""
        self._check(i, j)
        self._net.undrop(i, j)
        self._net.undrop(j, i)

    def isolate(self, index: int) -> None:
        """Cut member ``index`` from every other member (a minority of one)."""
        self._check(index)
        for other in range(self._size):
            if other != index:
                self.cut(index, other)

    def partition(self, *groups: Sequence[int]) -> None:
        """Cut every link between members of different ``groups`` (members not named
        form a group of their own)."""
        named = [i for group in groups for i in group]
        self._check(*set(named))
        rest = [i for i in range(self._size) if i not in named]
        sides = [list(g) for g in groups] + ([rest] if rest else [])
        for a, side in enumerate(sides):
            for other in sides[a + 1 :]:
                for i in side:
                    for j in other:
                        self.cut(i, j)

    def flap(self, i: int, j: int, period: float) -> None:
        """Cut and restore the link ``i``–``j`` every ``period`` seconds (starting with a
        cut) in a background thread, until :meth:`heal`."""
        self._check(i, j)
        if not period > 0:
            raise InvalidArgumentError(f"period must be > 0, got {period!r}")
        stop = threading.Event()

        def run() -> None:
            down = False
            while not stop.is_set():
                with contextlib.suppress(NetnsUnavailable):
                    if down:
                        self.uncut(i, j)
                    else:
                        self.cut(i, j)
                    down = not down
                stop.wait(period)
            with contextlib.suppress(NetnsUnavailable, RuntimeError):
                self.uncut(i, j)

        thread = threading.Thread(target=run, name=f"netns-flap-{i}-{j}", daemon=True)
        self._flappers.append((thread, stop))
        thread.start()

    def _stop_flapping(self) -> None:
        flappers, self._flappers = self._flappers, []
        for _, stop in flappers:
            stop.set()
        for thread, _ in flappers:
            thread.join(10)

    def heal(self) -> None:
        """Stop every flapping link and remove every drop rule."""
        self._stop_flapping()
        self._net.flush()

    def cuts(self) -> list[tuple[int, int]]:
        """``(src, dst)`` pairs whose packets are dropped now (read from the kernel)."""
        return self._net.rules()

    # ---------------------------------------------------------------- leadership

    def leader_index(self, timeout: float = 1.0) -> int | None:
        """The member a majority of members names as leader (and which itself says it
        leads), or ``None``. An isolated ex-leader that still believes it leads is not
        returned once the majority elected another."""
        statuses = [self.member_status(i, timeout) for i in range(len(self._members))]
        ids: dict[str, int] = {}
        votes: dict[str, int] = {}
        for index, status in enumerate(statuses):
            if status is None:
                continue
            member_id = str(status.get("header", {}).get("member_id", ""))
            ids[member_id] = index
            leader = str(status.get("leader", "") or "")
            if leader and leader != "0":
                votes[leader] = votes.get(leader, 0) + 1
        for leader, count in votes.items():
            if count > self._size // 2 and leader in ids:
                status = statuses[ids[leader]]
                if status is not None and str(status.get("leader", "")) == leader:
                    return ids[leader]
        return None
