"""etcdfence imports and works in one process with python3-etcd3 and with aetcd.

Each runs in a fresh interpreter: the other library is imported *first* (its
generated modules fill protobuf's default descriptor pool), then etcdfence, and
both talk to the same etcd. (etcd3 and aetcd cannot share a process with each
other — both register ``auth.proto`` in the default pool — which is exactly the
collision etcdfence's private pool avoids.)
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

ETCD3 = """
import etcd3
import etcdfence as ef
host, port = ENDPOINT.rsplit("//", 1)[-1].split(":")
legacy = etcd3.client(host=host, port=int(port))
legacy.put(PREFIX + "/from-etcd3", "a")
with ef.Client(ENDPOINT) as client:
    assert client.get(PREFIX + "/from-etcd3").value == b"a"
    rev = client.put(PREFIX + "/from-ef", "b")
    with client.session(ttl=5) as session:
        token = session.lock(PREFIX + "/lock").acquire(timeout=5)
        assert token.value > rev
value, meta = legacy.get(PREFIX + "/from-ef")
assert value == b"b", value
print("ok", token.value)
"""

AETCD = """
import asyncio
import aetcd
import etcdfence as ef

async def main():
    host, port = ENDPOINT.rsplit("//", 1)[-1].split(":")
    async with aetcd.Client(host=host, port=int(port)) as legacy:
        await legacy.put((PREFIX + "/from-aetcd").encode(), b"a")
        async with ef.AsyncClient(ENDPOINT) as client:
            assert (await client.get(PREFIX + "/from-aetcd")).value == b"a"
            rev = await client.put(PREFIX + "/from-ef", "b")
            async with client.session(ttl=5) as session:
                token = await session.election(PREFIX + "/e").campaign("me", timeout=5)
                assert token.value > rev
        got = await legacy.get((PREFIX + "/from-ef").encode())
        assert got.value == b"b", got
        print("ok", token.value)

asyncio.run(main())
"""


@pytest.mark.parametrize("script", [ETCD3, AETCD], ids=["etcd3", "aetcd"])
def test_coexists_in_one_process(
    script: str, etcd_endpoints: list[str], etcd_namespace: str
) -> None:
    prelude = f"ENDPOINT = {etcd_endpoints[0]!r}\nPREFIX = {etcd_namespace!r}\n"
    result = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[-1].startswith("ok ")
