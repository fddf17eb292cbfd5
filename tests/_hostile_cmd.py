"""A command that resists being stopped, for the stop tests of ``etcdfence run``.

``python _hostile_cmd.py LOG MODE``: ignores SIGTERM/SIGINT/SIGHUP and appends a beat
``TOKEN NODE PID TAG TIME`` to LOG every 20 ms from itself and, by MODE (words joined
by ``+``), from a ``child``, a ``setsid`` child (a session of its own) and a double-forked
``daemon``. Everything exits once ``LOG.stop`` exists. The beats are the tree's own
timestamps: a beat after the next leader's first one is an overlap.
"""

from __future__ import annotations

import os
import signal
import sys
import time

BEAT = 0.02


def beat_forever(log: str, token: str, node: str, tag: str) -> None:
    while not os.path.exists(log + ".stop"):
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{token} {node} {os.getpid()} {tag} {time.time():.6f}\n".encode())
        os.close(fd)
        time.sleep(BEAT)
    os._exit(0)


def main(log: str, mode: str) -> None:
    token = os.environ.get("ETCDFENCE_TOKEN", "?")
    node = os.environ.get("NODE", "?")
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    words = set(mode.split("+"))
    if "daemon" in words and os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            beat_forever(log, token, node, "daemon")
        os._exit(0)
    if "setsid" in words and os.fork() == 0:
        os.setsid()
        beat_forever(log, token, node, "setsid")
    if "child" in words and os.fork() == 0:
        beat_forever(log, token, node, "child")
    beat_forever(log, token, node, "main")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
