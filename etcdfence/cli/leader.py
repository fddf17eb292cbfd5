"""``etcdfence leader NAME``: the current leader of an election, as one JSON line.

:func:`leader_record` is the JSON shape ``leader`` and ``observe`` share.
"""

from __future__ import annotations

import argparse
import base64
from typing import Any

from ..types import Leader
from . import _options as opt
from ._exits import EXIT_OK
from ._output import add_write_out, emit, show

RECORD_HELP = """\
Output is one JSON object per line: name, key, value, encoding ('utf-8', or
'base64' when the value is not UTF-8), create_revision, lease_id (hex) and
revision. When nobody leads, every field but name is null."""


def add_parser(subparsers: Any) -> None:
    """Add ``leader`` to the command line."""
    p = opt.add_command(
        subparsers,
        "leader",
        "print the current leader of an election as JSON",
        "Print the current leader of election NAME (no session is created).\n" + RECORD_HELP,
        "  etcdfence leader services/scheduler\n"
        "  etcdfence leader services/scheduler | jq -r .value",
    )
    p.add_argument("name", metavar="NAME", type=opt.name, help="election name")
    add_write_out(p, "json", ("json", "table"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``etcdfence leader NAME``."""
    with opt.make_client(args) as client:
        print_leader(leader_record(args.name, client.leader(args.name)), args.write_out)
    return EXIT_OK


#: The columns of ``-w table`` for ``leader`` and ``observe``.
TABLE_COLUMNS = ("name", "value", "key", "create_revision", "lease_id", "revision")


def print_leader(record: dict[str, Any], write_out: str) -> None:
    """One leader record as a JSON line or a table."""
    if write_out == "json":
        emit(record)
    else:
        show([record], "table", TABLE_COLUMNS)


def leader_record(name: str, leader: Leader | None) -> dict[str, Any]:
    """The JSON object ``leader``/``observe`` print for one leader (or nobody)."""
    if leader is None:
        return {
            "name": name,
            "key": None,
            "value": None,
            "encoding": None,
            "create_revision": None,
            "lease_id": None,
            "revision": None,
        }
    try:
        value, encoding = leader.value.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        value, encoding = base64.b64encode(leader.value).decode("ascii"), "base64"
    return {
        "name": name,
        "key": leader.key,
        "value": value,
        "encoding": encoding,
        "create_revision": leader.create_revision,
        "lease_id": f"{leader.lease_id:x}",
        "revision": leader.revision,
    }
