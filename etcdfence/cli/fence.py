"""``etcdfence fence show|put|off|repair``: a resource's fencing mark in etcd, fenced
writes, fencing off a term's writes still in flight, and repairing a forged mark."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ..errors import InvalidArgumentError
from ..token import FencingToken
from . import _options as opt
from ._exits import EXIT_OK
from ._output import add_write_out
from ._output import show as print_records


def add_parser(subparsers: Any) -> None:
    """Add ``fence`` and its actions ``show``, ``put``, ``off`` and ``repair``."""
    p = opt.add_command(
        subparsers,
        "fence",
        "inspect a fence or write through it",
        "Work with the fencing high-water mark of a resource stored in etcd\n"
        "(at PREFIX+RESOURCE, a 20-digit decimal).",
        "  etcdfence fence show config/db\n"
        "  etcdfence fence put config/db config/db/primary 10.0.0.5 --token 1234\n"
        "  etcdfence fence off config/db --token 1234\n"
        "  etcdfence fence repair config/db",
    )
    actions = p.add_subparsers(
        title="fence commands", metavar="ACTION", dest="fence_action", required=True
    )
    show_p = _add_action(
        actions,
        "show",
        "print a resource's high-water mark as JSON",
        "Print {resource, key, mark} for RESOURCE; mark 0 means no write was fenced yet.",
        "  etcdfence fence show config/db\n  etcdfence fence show config/db --lock jobs/db",
    )
    _add_lock(show_p)
    put = _add_action(
        actions,
        "put",
        "write KEY=VALUE if the token is not stale",
        "Write KEY=VALUE in one etcd transaction with the mark of RESOURCE, only if\n"
        "--token is not below the mark (then the mark advances to it). A stale token\n"
        "writes nothing and exits 4. Prints {resource, key, token, revision}.",
        "  etcdfence fence put config/db config/db/primary 10.0.0.5 --token 1234\n"
        "  etcdfence lock config/db -- etcdfence fence put config/db config/db/primary 10.0.0.6\n"
        "  etcdfence lock jobs/db -- etcdfence fence put config/db db/primary x --lock jobs/db",
    )
    put.add_argument("data_key", metavar="KEY", type=opt.key, help="the etcd key to write")
    put.add_argument("value", metavar="VALUE", type=opt.utf8, help="the value to write")
    _add_token(put)
    _add_lock(put)
    off = _add_action(
        actions,
        "off",
        "refuse every write of a token still in flight",
        "Claim a fresh epoch of --token at the mark of RESOURCE: from then on every\n"
        "guarded write with that token sent before (by any process, a lost one held in\n"
        "the network included) is refused wherever it lands. Use it after a writer\n"
        "reported an unknown outcome it could not fence off, or died with writes in\n"
        "flight; then re-read the data and decide. A token below the mark exits 4 (its\n"
        "writes are refused anyway). Prints {resource, key, token, epoch}.",
        "  etcdfence fence off config/db --token 1234\n"
        "  ETCDFENCE_TOKEN=1234 etcdfence fence off config/db",
    )
    _add_token(off)
    _add_lock(off)
    _add_action(
        actions,
        "repair",
        "lower a forged mark (its token is above etcd's revision)",
        "Lower the mark of RESOURCE if it is provably forged: its token is above etcd's\n"
        "current revision, so no lock or election issued it (a typo'd or hostile token\n"
        "written to the mark), and it refuses every real holder. The mark becomes\n"
        "(REVISION, 9999999999), by a compare-and-set on exactly the mark judged, so a\n"
        "write in between is never undone. Every token up to REVISION is refused from\n"
        "then on: a live holder must re-acquire (its new token is above REVISION).\n"
        "A mark not above the revision (it may be real), or one that moved meanwhile, is\n"
        "left as it was: exit 7. Prints {resource, key, old_mark, new_mark, revision}.",
        "  etcdfence fence repair config/db\n"
        "  etcdfence fence repair config/db --prefix /app/fences/",
    )


def _token(arg: str) -> FencingToken:
    """``--token``: a bare number, or a whole sequencer as ``FencingToken.to_text`` and the
    ``Fencing-Token`` header write it (``1234; lock="jobs/db"; ...``)."""
    try:
        return FencingToken.from_text(arg, source="--token")
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_token(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--token",
        type=_token,
        default=None,
        help="fencing token: a number, or a whole sequencer ('1234; lock=\"jobs/db\"; ...', "
        "the Fencing-Token header form) for a --lock bound resource (default: the "
        "ETCDFENCE_* variables `etcdfence lock` exports, then $ETCD_LOCK_REV/$ETCD_LOCK_KEY)",
    )


def _add_lock(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lock",
        type=opt.name,
        default=None,
        metavar="NAME",
        help="bind RESOURCE to lock or election NAME, as the library's lock=: a token of "
        "another lock or cluster, or a bare number, is refused (exit 2) with nothing "
        "written. Not read from $ETCDFENCE_LOCK: that names the token's own lock, so "
        "it would bind nothing; the binding is the resource's, give it here",
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
        guard = client.fence(args.resource, prefix=args.prefix, lock=args.lock)
        record = {"resource": args.resource, "key": guard.key.decode(), "mark": guard.current()}
        if args.lock is not None:
            record["lock"] = args.lock
    print_records([record], args.write_out, list(record))
    return EXIT_OK


def put(args: argparse.Namespace) -> int:
    """``etcdfence fence put RESOURCE KEY VALUE --token T``."""
    token = args.token if args.token is not None else FencingToken.from_env()
    with opt.make_client(args) as client:
        guard = client.fence(args.resource, prefix=args.prefix, lock=args.lock)
        revision = guard.put(token, args.data_key, args.value)
    record = {
        "resource": args.resource,
        "key": args.data_key,
        "token": token.value,
        "revision": revision,
    }
    print_records([record], args.write_out, list(record))
    return EXIT_OK


def off(args: argparse.Namespace) -> int:
    """``etcdfence fence off RESOURCE --token T``."""
    token = args.token if args.token is not None else FencingToken.from_env()
    with opt.make_client(args) as client:
        guard = client.fence(args.resource, prefix=args.prefix, lock=args.lock)
        epoch = guard.fence_off(token)
        record = {
            "resource": args.resource,
            "key": guard.key.decode(),
            "token": token.value,
            "epoch": epoch,
        }
    print_records([record], args.write_out, list(record))
    return EXIT_OK


def repair(args: argparse.Namespace) -> int:
    """``etcdfence fence repair RESOURCE``."""
    with opt.make_client(args) as client:
        guard = client.fence(args.resource, prefix=args.prefix)
        done = guard.repair()
        record = {"resource": args.resource, "key": guard.key.decode(), **done.as_dict()}
    print_records([record], args.write_out, list(record))
    return EXIT_OK


_ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {
    "show": show,
    "put": put,
    "off": off,
    "repair": repair,
}
