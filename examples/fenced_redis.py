"""Write one Redis key, fenced by a token: a stale writer's value never lands.

Run it with an explicit token::

    python examples/fenced_redis.py --token 42 --resource orders --key latest --value v1

or under a lock, which hands the token down in the environment (``ETCDFENCE_TOKEN``
from ``etcdfence lock``, ``ETCD_LOCK_REV`` from ``etcdctl lock``)::

    etcdfence lock jobs/orders -- python examples/fenced_redis.py --key latest --value v1

The key is written as ``{orders}:latest`` (the resource is the hash tag, so the key and
the fence's mark ``etcdfence:fence:{orders}`` share a Redis Cluster slot). Exit status:
0 written, 2 no/invalid token, 3 stale token (a newer holder has already written;
nothing was changed), 4 Redis unreachable or the outcome unknown.

``redis_conformance_parts(client, resource)`` builds the ``write`` / ``read`` /
``restart`` callables the fencing conformance kit takes for RedisFence.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import redis

from etcdfence.errors import EtcdUnavailableError, InvalidToken, StaleTokenError
from etcdfence.redis import RedisFence
from etcdfence.token import FencingToken, parse_token

EXIT_OK, EXIT_BAD_TOKEN, EXIT_STALE, EXIT_UNAVAILABLE = 0, 2, 3, 4


def redis_conformance_parts(
    client: redis.Redis, resource: str, *, restart_command: str | None = None
) -> dict[str, Callable[..., Any] | None]:
    """``write(token, key, value)``, ``read(key) -> bytes | None`` and ``restart``
    for the conformance kit: ``Adapter(**redis_conformance_parts(client, "orders"))``.

    Keys are placed under the resource's hash tag (``{orders}:<key>``). ``write``
    raises :class:`~etcdfence.errors.StaleTokenError` when refused. ``restart`` is
    None unless ``restart_command`` (a shell command that starts the Redis again) is
    given: it then stops the Redis like a crash (``SHUTDOWN NOSAVE``), starts it with
    the command and waits until it answers. On a Redis without persistence the
    kit's restart scenario must then fail: the mark is gone after the restart.
    """
    fence = RedisFence(client, resource)

    def write(token: FencingToken | int, key: str, value: str | bytes) -> None:
        fence.put(token, fence.key_for(key), value)

    def read(key: str) -> bytes | None:
        value: bytes | None = client.get(fence.key_for(key))
        return value

    def restart() -> None:
        kwargs = client.connection_pool.connection_kwargs
        admin = redis.Redis(host=kwargs.get("host", "127.0.0.1"), port=kwargs.get("port", 6379),
                            retry=None, socket_timeout=5)  # fmt: skip
        try:
            admin.execute_command("SHUTDOWN", "NOSAVE")
        except redis.exceptions.ConnectionError:
            pass  # the answer to SHUTDOWN is the closed connection
        finally:
            admin.close()
        subprocess.run(restart_command or "", shell=True, check=True, timeout=60)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                return
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    return {"write": write, "read": read, "restart": restart if restart_command else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--redis", default="127.0.0.1:6379", help="host:port")
    parser.add_argument("--resource", default="orders", help="the fenced resource (hash tag)")
    parser.add_argument("--key", required=True, help="written as {resource}:key")
    parser.add_argument("--value", required=True)
    parser.add_argument("--token", help="default: ETCDFENCE_TOKEN / ETCD_LOCK_REV")
    args = parser.parse_args(argv)
    try:
        token = (
            FencingToken.from_env()
            if args.token is None
            else FencingToken(parse_token(args.token, source="--token"))
        )
    except InvalidToken as err:
        print(f"no usable fencing token: {err}", file=sys.stderr)
        return EXIT_BAD_TOKEN
    host, port = args.redis.rsplit(":", 1)
    client = redis.Redis(host=host, port=int(port), socket_timeout=5, socket_connect_timeout=5)
    try:
        fence = RedisFence(client, args.resource)
        key = fence.key_for(args.key)
        fence.put(token, key, args.value)
    except StaleTokenError as err:
        print(f"refused: {err}", file=sys.stderr)
        return EXIT_STALE
    except EtcdUnavailableError as err:  # unreachable, or the outcome unknown
        print(f"not written (or not known to be): {err}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    finally:
        client.close()
    print(f"{key} = {args.value!r} with token {token}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
