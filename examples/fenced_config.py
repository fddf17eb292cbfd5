"""Update a config value stored in etcd, under a lock and through a fence.

The config key is written with ``client.fence(RESOURCE).put(token, key, value)``: one
etcd transaction that checks the token against the resource's high-water mark and, if
it is not stale, advances the mark and writes the value. A writer whose lock expired
while it was paused (and who therefore holds an old token) is rejected, even if it
never noticed it lost the lock.

Where the token comes from, in order:

1. ``--token N`` (to try out a stale write by hand);
2. the environment, when run under a lock: ``etcdfence lock NAME -- python ...`` sets
   ``ETCDFENCE_TOKEN``, ``etcdctl lock NAME -- python ...`` sets ``ETCD_LOCK_REV``;
3. otherwise the script takes the lock ``--lock`` itself for the duration of the write.

Examples::

    python examples/fenced_config.py --key config/app/db --value 10.0.0.5
    etcdfence lock locks/config/app -- python examples/fenced_config.py \\
        --key config/app/db --value 10.0.0.6
    python examples/fenced_config.py --key config/app/db --value old --token 1   # exit 4

Prints ``wrote KEY=VALUE with token T (revision R)`` and exits 0, or prints
``rejected: ...`` and exits 4 when the token is stale, or ``error: ...`` and exits 2 when
``--token`` or the environment's token is malformed (the ``etcdfence`` CLI's codes).
"""

from __future__ import annotations

import argparse
import os
import sys

import etcdfence as ef
from etcdfence.token import ENV_VARS, parse_token

EXIT_OK, EXIT_BAD_TOKEN, EXIT_STALE = 0, 2, 4


def given_token(text: str | None) -> ef.FencingToken | None:
    """The token from ``--token``, else from the environment, else ``None`` (take the
    lock). A malformed one raises :class:`etcdfence.InvalidTokenError`: a token that is there
    but unreadable is an error, never a reason to fall back to taking the lock."""
    if text is not None:
        return ef.FencingToken(parse_token(text, source="--token"))
    if any(os.environ.get(name) for name in ENV_VARS):
        return ef.FencingToken.from_env()
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--endpoints",
        default=os.environ.get("ETCDFENCE_ENDPOINTS", "http://127.0.0.1:2379"),
        help="etcd endpoints (default: $ETCDFENCE_ENDPOINTS or http://127.0.0.1:2379)",
    )
    parser.add_argument("--resource", default="config/app", help="the fenced resource")
    parser.add_argument("--lock", default=None, help="lock name (default: locks/RESOURCE)")
    parser.add_argument("--key", required=True, help="config key to write")
    parser.add_argument("--value", required=True, help="value to write")
    parser.add_argument("--token", default=None, help="use this token")
    parser.add_argument("--ttl", type=int, default=10, help="lock lease TTL in seconds")
    args = parser.parse_args(argv)
    lock_name = args.lock or f"locks/{args.resource}"

    try:
        token = given_token(args.token)
    except ef.InvalidTokenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_TOKEN

    with ef.Client(args.endpoints, timeout=5.0) as client:
        guard = client.fence(args.resource)
        try:
            if token is not None:
                return write(guard, token, args.key, args.value)
            with client.session(ttl=args.ttl) as session, session.lock(lock_name) as token:
                print(f"acquired {lock_name!r} as {token.key} (token {token})")
                return write(guard, token, args.key, args.value)
        except ef.StaleTokenError as exc:
            print(f"rejected: {exc}")
            return EXIT_STALE
        except ef.EtcdfenceError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1


def write(guard: ef.FenceGuard, token: ef.FencingToken, key: str, value: str) -> int:
    """The fenced write itself: one txn, raises StaleTokenError if a newer writer won."""
    revision = guard.put(token, key, value)
    print(f"wrote {key}={value} with token {token} (revision {revision})")
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
