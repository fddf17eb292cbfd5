"""``etcdfence fence show|put``: a resource's fencing mark in etcd, and fenced writes."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ..token import FencingToken
from . import _options as opt
from ._exits import EXIT_OK
from ._output import add_write_out
from ._output import show as print_records


def add_parser(subparsers: Any) -> None:
    """Add ``fence`` and its actions ``show`` and ``put`` to the command line."""
    p = opt.add_command(
        subparsers,
        "fence",
        "inspect a fence or write through it",
        "Work with the fencing high-water mark of a resource stored in etcd\n"
        "(at PREFIX+RESOURCE, a 20-digit decimal).",
        "  etcdfence fence show config/db\n"
        "  etcdfence fence put config/db config/db/primary 10.0.0.5 --token 1234",
    )
    actions = p.add_subparsers(
        title="fence commands", metavar="ACTION", dest="fence_action", required=True
    )
    _add_action(
        actions,
        "show",
        "print a resource's high-water mark as JSON",
        "Print {resource, key, mark} for RESOURCE; mark 0 means no write was fenced yet.",
        "  etcdfence fence show config/db",
    )
    put = _add_action(
        actions,
        "put",
        "write KEY=VALUE if the token is not stale",
        "Write KEY=VALUE in one etcd transaction with the mark of RESOURCE, only if\n"
        "--token is not below the mark (then the mark advances to it). A stale token\n"
        "writes nothing and exits 4. Prints {resource, key, token, revision}.",
        "  etcdfence fence put config/db config/db/primary 10.0.0.5 --token 1234\n"
        "  etcdfence lock config/db -- etcdfence fence put config/db config/db/primary 10.0.0.6",
    )
    put.add_argument("data_key", metavar="KEY", type=opt.key, help="the etcd key to write")
    put.add_argument("value", metavar="VALUE", type=opt.utf8, help="the value to write")
    put.add_argument(
        "--token",
        type=opt.token,
        default=None,
        help="fencing token (default: $ETCDFENCE_TOKEN, then $ETCD_LOCK_REV)",
    )


def _add_action(
    actions: Any, name: str, help_text: str, description: str, examples: str
) -> argparse.ArgumentParser:
    """A ``fence`` action's parser, with the RESOURCE and ``--prefix`` all actions take."""
    p = opt.add_command(actions, name, help_text, description, examples)
    p.add_argument(
        "resource", metavar="RESOURCE", type=opt.name, help="name of the guarded resource"
    )
    p.add_argument(
        "--prefix",
        type=opt.key,
        default="/etcdfence/fence/",
        help="where marks are stored (default: /etcdfence/fence/)",
    )
    add_write_out(p, "json", ("json", "table"))
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """``etcdfence fence ACTION ...``: the action's function."""
    return _ACTIONS[args.fence_action](args)


def show(args: argparse.Namespace) -> int:
    """``etcdfence fence show RESOURCE``."""
    with opt.make_client(args) as client:
        guard = client.fence(args.resource, prefix=args.prefix)
        record = {"resource": args.resource, "key": guard.key.decode(), "mark": guard.current()}
    print_records([record], args.write_out, list(record))
    return EXIT_OK


def put(args: argparse.Namespace) -> int:
    """``etcdfence fence put RESOURCE KEY VALUE --token T``."""
    token = FencingToken(args.token) if args.token is not None else FencingToken.from_env()
    with opt.make_client(args) as client:
        guard = client.fence(args.resource, prefix=args.prefix)
        revision = guard.put(token, args.data_key, args.value)
    record = {
        "resource": args.resource,
        "key": args.data_key,
        "token": token.value,
        "revision": revision,
    }
    print_records([record], args.write_out, list(record))
    return EXIT_OK


_ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {"show": show, "put": put}
