"""``etcdfence status NAME`` / ``--prefix P``: who leads, since when, and who waits.

What etcd can tell, and what it cannot. A contender is a key ``NAME/<lease hex>``
(etcdctl's and Go's layout) attached to its session's lease; the owner is the one
with the lowest create revision, the others wait in create-revision order. So
``status`` shows, per election or lock: the leader's value (its identity; empty for
a lock), key and lease, **since which revision** it holds (its key's create
revision) and how many revisions the cluster has moved since, and each contender's
lease with its remaining and granted TTL (``LeaseTimeToLive``).

Two things it deliberately does not invent:

* **How long, in seconds.** etcd stores no timestamps — not for keys, not for leases
  (a lease's remaining TTL is refreshed by every keepalive, so granted − remaining
  says nothing about age). The leader itself knows: ``run --health`` reports
  ``leading_for_seconds`` on ``/readyz`` and ``etcdfence_supervisor_leading_since_seconds``
  on ``/metrics``.
* **The exact token.** A fencing token is the revision of the response that confirmed
  ownership; etcd does not store it. It equals the key's create revision when the
  holder did not have to wait, and is larger when it did, so ``status`` reports
  ``token_min`` (that create revision); the holder has the exact value
  (``$ETCDFENCE_TOKEN``, ``/readyz``).
"""

from __future__ import annotations

import argparse
import base64
from typing import Any

from .._keys import contender_prefix, to_key
from .._sync.client import Client
from .._txn import range_request
from .._wire import messages as m
from ..types import KeyValue
from . import _options as opt
from ._exits import EXIT_OK, EXIT_USAGE, CommandError
from ._output import add_write_out, show

DESCRIPTION = """\
Show who leads election NAME (or holds lock NAME) and who waits, from the keys
NAME/<lease hex> (etcdctl's layout): the leader's value, key and lease, the
revision it holds since (its key's create revision) and how many revisions passed
since, then the queue in order; for everyone the lease's remaining and granted TTL.
With --prefix P: every election and lock whose keys lie under P.

etcd stores no timestamps, so 'how long' in seconds is not shown (held_for_seconds
is null): the leader itself reports it (run --health: /readyz leading_for_seconds).
etcd does not store the fencing token either: token_min is the key's create
revision, which is the token unless the holder had to wait (then it is larger);
the holder knows the exact one ($ETCDFENCE_TOKEN, /readyz)."""

EXAMPLES = """\
  etcdfence status services/scheduler               # a table
  etcdfence status services/scheduler -w json | jq .leader.value
  etcdfence status --prefix services/               # every election and lock below it"""

#: The table's columns, one row per contender (``-w table``).
COLUMNS = (
    "name",
    "role",
    "value",
    "key",
    "lease_id",
    "create_revision",
    "ttl_remaining",
    "ttl_granted",
)


def add_parser(subparsers: Any) -> None:
    """Add ``status`` to the command line."""
    p = opt.add_command(
        subparsers,
        "status",
        "who leads an election or holds a lock, since when, and the queue",
        DESCRIPTION,
        EXAMPLES,
    )
    p.add_argument("name", metavar="NAME", type=opt.name, nargs="?", help="election/lock name")
    p.add_argument(
        "--prefix",
        metavar="PREFIX",
        type=opt.key,
        default=None,
        help="every election and lock whose keys are under PREFIX (instead of NAME)",
    )
    add_write_out(p, "table", ("table", "json"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``etcdfence status NAME | --prefix P [-w json|table]``."""
    if (args.name is None) == (args.prefix is None):
        raise CommandError("give either NAME or --prefix PREFIX", EXIT_USAGE)
    with opt.make_client(args) as client:
        prefix = args.prefix if args.prefix is not None else args.name + "/"
        revision, kvs = _read(client, prefix)
        groups = _contenders(kvs, args.name)
        records = [
            _record(client, name, contenders, revision)
            for name, contenders in sorted(groups.items())
        ]
    if args.write_out == "json":
        show(records, "json", ())
    else:
        show([row for record in records for row in _rows(record)], "table", COLUMNS)
    return EXIT_OK


def _read(client: Client, prefix: str) -> tuple[int, list[KeyValue]]:
    """Every key under ``prefix`` and the revision of that one read."""
    response = client.connection.call(
        "Range", range_request(to_key(prefix), prefix=True), idempotent=True
    )
    return int(response.header.revision), [KeyValue.from_wire(kv) for kv in response.kvs]


def _is_contender(kv: KeyValue) -> bool:
    """A key of etcdctl's layout ``NAME/<its lease in hex>``."""
    _, sep, leaf = kv.key.decode("utf-8", "replace").rpartition("/")
    return bool(sep and kv.lease_id and leaf == f"{kv.lease_id:x}")


def _contenders(kvs: list[KeyValue], name: str | None) -> dict[str, list[KeyValue]]:
    """The elections and locks among ``kvs`` (``name``, or every NAME that has a key
    ``NAME/<lease hex>``), each with its queue: every key under ``NAME/``, oldest first.

    One rule for who leads, the one campaigns wait on (Go's and etcdctl's): the key
    under ``NAME/`` with the lowest create revision — as ``leader NAME`` reports. A
    data key or a nested election's key (``NAME/sub/...``) under ``NAME/`` is in that
    order too: it is shown where it blocks, never skipped."""
    names = {name} if name is not None else set()
    for kv in kvs:
        if _is_contender(kv):
            names.add(kv.key.decode("utf-8", "replace").rpartition("/")[0])
    groups: dict[str, list[KeyValue]] = {}
    for group in names:
        prefix = to_key(contender_prefix(group))
        queue = [kv for kv in kvs if kv.key.startswith(prefix)]
        groups[group] = sorted(queue, key=lambda kv: kv.create_revision)
    return groups


def _text(value: bytes) -> tuple[str, str]:
    try:
        return value.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(value).decode("ascii"), "base64"


def _lease(client: Client, lease_id: int) -> tuple[int | None, int | None]:
    """(remaining, granted) TTL in seconds; (None, None) if the lease is gone (or the
    key has none)."""
    if not lease_id:
        return None, None
    response = client.connection.call(
        "LeaseTimeToLive", m.LeaseTimeToLiveRequest(ID=lease_id), idempotent=True
    )
    if int(response.TTL) < 0:
        return None, None
    return int(response.TTL), int(response.grantedTTL)


def _record(client: Client, name: str, kvs: list[KeyValue], revision: int) -> dict[str, Any]:
    """One election/lock as ``-w json`` prints it."""
    contenders = []
    for position, kv in enumerate(kvs):
        value, encoding = _text(kv.value)
        remaining, granted = _lease(client, kv.lease_id)
        contenders.append(
            {
                "position": position,
                "key": kv.key.decode("utf-8", "replace"),
                "value": value,
                "encoding": encoding,
                "lease_id": f"{kv.lease_id:x}",
                "create_revision": kv.create_revision,
                "ttl_remaining": remaining,
                "ttl_granted": granted,
                "contender": _is_contender(kv),
            }
        )
    leader = None
    if contenders:
        since = kvs[0].create_revision
        leader = {
            **contenders[0],
            "since_revision": since,
            "revisions_since": revision - since,
            "token_min": since,
            "held_for_seconds": None,  # etcd keeps no timestamps (see the help)
        }
    return {"name": name, "revision": revision, "leader": leader, "queue": contenders[1:]}


def _rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The table rows of one election: the leader, then the queue (or 'nobody')."""
    leader = record["leader"]
    if leader is None:
        return [{"name": record["name"], "role": "(nobody)"}]
    rows = [{**leader, "name": record["name"], "role": _role(leader, "leader")}]
    for contender in record["queue"]:
        role = _role(contender, f"waiting #{contender['position']}")
        rows.append({**contender, "name": record["name"], "role": role})
    return rows


def _role(entry: dict[str, Any], role: str) -> str:
    return role if entry["contender"] else f"{role} (not a contender key)"
