"""TCP forwarder from the root network namespace into a namespace of :mod:`.netns`.

    ip netns exec HUB python _netns_forward.py FD:HOST:PORT [FD:HOST:PORT ...]

Each ``FD`` is a listening socket the parent bound on ``127.0.0.1`` in its own (root)
namespace and passed down; this process runs in the hub namespace (``ip netns exec``),
so the connections it opens to ``HOST:PORT`` (a member inside a namespace) are made
there. Clients in the root namespace thereby reach members without any route or address
of the private range existing outside the namespaces. Runs until killed; imports only
the standard library (it must start fast and never load gRPC).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


async def _handle(
    host: str, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5.0)
    except (OSError, asyncio.TimeoutError):
        writer.close()
        return
    for w in (writer, up_writer):
        sock = w.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
    for w in (writer, up_writer):
        w.close()


async def _main(specs: list[str]) -> None:
    servers = []
    for spec in specs:
        fd_text, host, port_text = spec.split(":")
        listener = socket.socket(fileno=int(fd_text))
        port = int(port_text)

        async def handle(
            r: asyncio.StreamReader, w: asyncio.StreamWriter, host: str = host, port: int = port
        ) -> None:
            await _handle(host, port, r, w)

        servers.append(await asyncio.start_server(handle, sock=listener))
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1:]))
