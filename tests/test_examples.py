"""Every script in ``examples/`` runs as a subprocess against a real etcd and does what
its docstring promises (output and exit code)."""

from __future__ import annotations

import ast
import itertools
import json
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env

import etcdfence as ef

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PYTHON = sys.executable
OURS = ["leader_job.py", "fenced_config.py", "http_service.py", "async_service.py"]


def example(
    script: str, *args: str, env: dict[str, str], timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=ROOT,
    )


def spawn(script: str, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [PYTHON, str(EXAMPLES / script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 30.0) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


def wait_for_a_fenced_write(
    env: dict[str, str], resource: str, proc: subprocess.Popen[str], timeout: float = 30.0
) -> None:
    """Until the first leader wrote through ``client.fence(resource)``: a fixed sleep
    lets a slow-starting first process lose to the second on a busy machine."""
    deadline = time.monotonic() + timeout
    with ef.Client(env["ETCDFENCE_ENDPOINTS"]) as client:
        while client.fence(resource).current() == 0:
            assert proc.poll() is None, f"it exited first: {finish(proc)}"
            assert time.monotonic() < deadline, f"no fenced write to {resource} in {timeout}s"
            time.sleep(0.02)


def tokens_of(output: str, pattern: str) -> list[int]:
    return [int(t) for t in re.findall(pattern, output)]


# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_example_has_a_docstring_and_help(script: str) -> None:
    tree = ast.parse((EXAMPLES / script).read_text())
    docstring = ast.get_docstring(tree)
    assert docstring and len(docstring.splitlines()) > 3, f"{script} needs a module docstring"
    result = example(script, "--help", env=clean_env())
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


@pytest.mark.integration
def test_leader_job_runs_on_one_node_at_a_time(env: dict[str, str], etcd_namespace: str) -> None:
    name = f"{etcd_namespace}/job"
    common = ["--name", name, "--ttl", "2", "--interval", "0.2"]
    first = spawn("leader_job.py", "--id", "first", "--iterations", "3", *common, env=env)
    wait_for_a_fenced_write(env, name, first)  # "first" won; "second" queues behind it
    second = spawn("leader_job.py", "--id", "second", "--iterations", "2", *common, env=env)
    code1, out1, err1 = finish(first)
    code2, out2, err2 = finish(second)
    assert (code1, code2) == (0, 0), err1 + err2
    runs1 = tokens_of(out1, r"\[first\] run \d+ \(token (\d+)\)")
    runs2 = tokens_of(out2, r"\[second\] run \d+ \(token (\d+)\)")
    assert len(runs1) == 3 and len(runs2) == 2
    assert max(runs1) < min(runs2), "the later leader carries the larger token"
    assert "done after 3 run(s)" in out1 and "done after 2 run(s)" in out2

    with ef.Client(env["ETCDFENCE_ENDPOINTS"]) as client:
        assert client.fence(name).current() == runs2[0]
        kv = client.get(f"results/{name}")
        assert kv is not None and json.loads(kv.value)["by"] == "second"


@pytest.mark.serial  # the handover takes under 5 s
@pytest.mark.integration
def test_apscheduler_leader_runs_jobs_on_one_replica_and_hands_over(
    env: dict[str, str], etcd_namespace: str
) -> None:
    name = f"{etcd_namespace}/scheduler"
    common = ["--name", name, "--ttl", "10", "--interval", "0.2"]
    first = spawn("apscheduler_leader.py", "--id", "first", "--runs", "3", *common, env=env)
    wait_for_a_fenced_write(env, f"reports/{name}", first)  # "first" leads; "second" waits
    second = spawn("apscheduler_leader.py", "--id", "second", "--runs", "2", *common, env=env)
    code1, out1, err1 = finish(first)
    first_done = time.monotonic()
    code2, out2, err2 = finish(second)
    handover = time.monotonic() - first_done
    assert (code1, code2) == (0, 0), err1 + err2
    runs1 = tokens_of(out1, r"\[first\] run \d+ \(token (\d+)\)")
    runs2 = tokens_of(out2, r"\[second\] run \d+ \(token (\d+)\)")
    assert len(runs1) == 3 and len(runs2) == 2, out1 + out2
    assert max(runs1) < min(runs2), "the later leader carries the larger token"
    assert "done after 3 run(s)" in out1 and "done after 2 run(s)" in out2
    assert handover < 5, f"first resigned at shutdown, yet second took {handover:.1f}s (TTL 10)"
    with ef.Client(env["ETCDFENCE_ENDPOINTS"]) as client:
        assert client.fence(f"reports/{name}").current() == runs2[0]
        kv = client.get(f"results/{name}")
        assert kv is not None and json.loads(kv.value)["by"] == "second"
        client.delete(f"results/{name}")


@pytest.mark.integration
def test_leader_job_duration_bounds_the_run(env: dict[str, str], etcd_namespace: str) -> None:
    started = time.monotonic()
    result = example(
        "leader_job.py",
        *("--name", f"{etcd_namespace}/timed", "--id", "solo", "--duration", "1"),
        *("--interval", "0.2", "--endpoints", env["ETCDFENCE_ENDPOINTS"]),
        env=clean_env(),
    )
    assert result.returncode == 0, result.stderr
    assert len(re.findall(r"\[solo\] run \d+", result.stdout)) >= 3
    assert time.monotonic() - started < 10


@pytest.mark.integration
def test_fenced_config_locks_writes_and_rejects_stale_tokens(
    env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client
) -> None:
    resource, key = f"{etcd_namespace}/config", f"{etcd_namespace}/config-db"
    args = ["--resource", resource, "--key", key]

    first = example("fenced_config.py", *args, "--value", "v1", env=env)
    assert first.returncode == 0, first.stderr
    assert f"acquired 'locks/{resource}'" in first.stdout
    (token1,) = tokens_of(first.stdout, r"wrote \S+ with token (\d+)")
    assert etcd_client.fence(resource).current() == token1

    stale = example("fenced_config.py", *args, "--value", "old", "--token", "1", env=env)
    assert stale.returncode == 4
    assert "rejected: stale fencing token" in stale.stdout
    kv = etcd_client.get(key)
    assert kv is not None and kv.value == b"v1"

    # Under `etcdfence lock`, the token comes from the environment.
    locked = subprocess.run(
        [PYTHON, "-m", "etcdfence", "lock", f"locks/{resource}", "--",
         PYTHON, str(EXAMPLES / "fenced_config.py"), *args, "--value", "v2"],
        capture_output=True, text=True, env=env, timeout=30,
    )  # fmt: skip
    assert locked.returncode == 0, locked.stderr
    assert "acquired" not in locked.stdout
    (token2,) = tokens_of(locked.stdout, r"wrote \S+ with token (\d+)")
    assert token2 > token1

    replay = example("fenced_config.py", *args, "--value", "late", "--token", str(token1), env=env)
    assert replay.returncode == 4
    kv = etcd_client.get(key)
    assert kv is not None and kv.value == b"v2"


def _request(url: str, method: str = "GET", data: bytes | None = None, **headers: str) -> Any:
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.integration
def test_http_service_fences_writes_by_header(
    env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client
) -> None:
    resource = f"{etcd_namespace}/store"
    server = spawn("http_service.py", "serve", "--port", "0", "--resource", resource, env=env)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        match = re.match(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert match, line
        url = match.group(1)

        # Two terms of one lock: the old holder's token and the new holder's.
        tokens = []
        for _ in range(2):
            with etcd_client.session(ttl=5) as session, session.lock(resource) as token:
                tokens.append(token)
        old, new = tokens
        assert old < new

        status, body = _request(
            f"{url}/kv/greeting", "PUT", b"hello", **{"Fencing-Token": str(new)}
        )
        assert status == 200 and json.loads(body)["token"] == new.value
        status, body = _request(
            f"{url}/kv/greeting", "PUT", b"zombie", **{"Fencing-Token": str(old)}
        )
        assert status == 409
        assert json.loads(body) == {
            "error": "stale token",
            "token": old.value,
            "current": new.value,
        }
        status, body = _request(f"{url}/kv/greeting", "PUT", b"anon")
        assert status == 400
        status, body = _request(f"{url}/kv/greeting", "PUT", b"x", **{"Fencing-Token": "-3"})
        assert status == 400
        assert _request(f"{url}/kv/greeting") == (200, b"hello")
        assert json.loads(_request(f"{url}/fence")[1])["mark"] == new.value

        # Client mode: explicit stale token -> exit 4; under `etcdfence lock` -> 200, exit 0.
        stale = example("http_service.py", "put", "--url", url, "--key", "greeting",
                        "--value", "late", "--token", str(old), env=env)  # fmt: skip
        assert stale.returncode == 4 and stale.stdout.startswith("409")
        locked = subprocess.run(
            [PYTHON, "-m", "etcdfence", "lock", resource, "--",
             PYTHON, str(EXAMPLES / "http_service.py"), "put", "--url", url,
             "--key", "greeting", "--value", "fresh"],
            capture_output=True, text=True, env=env, timeout=30,
        )  # fmt: skip
        assert locked.returncode == 0, locked.stdout + locked.stderr
        assert locked.stdout.startswith("200")
        assert _request(f"{url}/kv/greeting") == (200, b"fresh")
    finally:
        server.send_signal(signal.SIGTERM)
        code, _, err = finish(server, timeout=10)
    assert code == 0, err


def _raw_put(port: int, key: str, fields: bytes, body: bytes = b"v") -> tuple[int, bytes]:
    """A PUT whose header fields are exactly ``fields`` (bytes on the wire; the caller
    adds Content-Length when it wants one): (status, body). The write side is shut so a
    server reading "to the end" sees the end instead of hanging."""
    request = f"PUT /kv/{key} HTTP/1.1\r\nHost: x\r\n".encode() + fields
    request += b"Connection: close\r\n\r\n" + body
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    if not data:  # the handler died without answering
        return 0, b""
    head, _, answer = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), answer


def _cl(body: bytes = b"v") -> bytes:
    return b"Content-Length: %d\r\n" % len(body)


#: (label, header fields, expected status, words the error must contain)
_REFUSED: list[tuple[str, bytes, int, str]] = [
    ("two tokens 5 then 9", b"Fencing-Token: 5\r\nFencing-Token: 9\r\n" + _cl(), 400, "2 times"),
    ("two tokens 9 then 5", b"Fencing-Token: 9\r\nfencing-token: 5\r\n" + _cl(), 400, "2 times"),
    ("valid then junk", b"Fencing-Token: 20\r\nFencing-Token: abc\r\n" + _cl(), 400, "2 times"),
    ("bare CR in another field", b"X-Note: a\rFencing-Token: 30\r\n" + _cl(), 400, "bare CR"),
    ("bare CR in the token", b"Fencing-Token: 40\r99\r\n" + _cl(), 400, "bare CR"),
    ("bare CR, real token too", b"Fencing-Token: 45\r\nX: a\rFencing-Token: 9\r\n" + _cl(),
     400, "bare CR"),
    ("underscore name", b"Fencing_Token: 50\r\n" + _cl(), 400, "missing Fencing-Token"),
    ("token folded", b"Fencing-Token: 55\r\n 9\r\n" + _cl(), 400, "Fencing-Token header"),
    ("Content-Length abc", b"Fencing-Token: 60\r\nContent-Length: abc\r\n", 400, "Content-Length"),
    ("Content-Length -1", b"Fencing-Token: 61\r\nContent-Length: -1\r\n", 400, "Content-Length"),
    ("Content-Length 1_0", b"Fencing-Token: 62\r\nContent-Length: 1_0\r\n", 400, "Content-Length"),
    ("Content-Length twice", b"Fencing-Token: 63\r\n" + _cl() + _cl(), 400, "Content-Length"),
    ("no Content-Length", b"Fencing-Token: 64\r\n", 411, "Content-Length"),
    ("chunked", b"Fencing-Token: 65\r\nTransfer-Encoding: chunked\r\n", 411, "Transfer-Encoding"),
]  # fmt: skip


@pytest.mark.integration
def test_http_service_reads_the_token_by_the_middleware_rule(
    env: dict[str, str], etcd_namespace: str, etcd_client: ef.Client
) -> None:
    """The example's own http.server handler: a repeated Fencing-Token, a bare CR that
    http.server's parser would split into a header no HTTP/1.1 parser sees, or a bad
    Content-Length is a 400 (411) with a JSON error — nothing written, the mark kept, no
    traceback — and a clean request right after still writes."""
    resource = f"{etcd_namespace}/raw"
    server = spawn("http_service.py", "serve", "--port", "0", "--resource", resource, env=env)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        match = re.match(r"listening on http://127\.0\.0\.1:(\d+)", line)
        assert match, line
        port = int(match.group(1))
        wrong: dict[str, object] = {}
        for i, (label, fields, status, words) in enumerate(_REFUSED):
            got, body = _raw_put(port, f"k{i}", fields)
            answer = json.loads(body) if body.startswith(b"{") else {}
            if (got, words in answer.get("error", "")) != (status, True):
                wrong[label] = (got, body[:160])
            if etcd_client.get(f"store/{resource}/k{i}") is not None:
                wrong[label] = ("written", got)
        assert not wrong, wrong
        assert etcd_client.fence(resource).current() == 0
        status, body = _raw_put(port, "ok", b"Fencing-Token: \t70 \r\n" + _cl(b"yes"), b"yes")
        assert (status, json.loads(body)["token"]) == (200, 70)
        kv = etcd_client.get(f"store/{resource}/ok")
        assert kv is not None and kv.value == b"yes"
    finally:
        server.send_signal(signal.SIGTERM)
        code, _, err = finish(server, timeout=10)
    assert code == 0, err
    assert "Traceback" not in err, err


@pytest.mark.integration
def test_async_service_hands_over_between_instances(
    env: dict[str, str], etcd_namespace: str
) -> None:
    name = f"{etcd_namespace}/async"
    common = ["--name", name, "--ttl", "2", "--interval", "0.2"]
    first = spawn("async_service.py", "--id", "api-1", "--duration", "2", *common, env=env)
    wait_for_a_fenced_write(env, name, first)  # "api-1" won; "api-2" queues behind it
    second = spawn("async_service.py", "--id", "api-2", "--iterations", "2", *common, env=env)
    code1, out1, err1 = finish(first)
    code2, out2, err2 = finish(second)
    assert (code1, code2) == (0, 0), err1 + err2
    writes1 = tokens_of(out1, r"\[api-1\] leader write \d+ \(token (\d+)\)")
    writes2 = tokens_of(out2, r"\[api-2\] leader write \d+ \(token (\d+)\)")
    assert len(writes1) >= 2 and len(writes2) == 2
    assert max(writes1) < min(writes2)
    assert "[api-1] not leader any more" in out1


@pytest.mark.integration
@pytest.mark.skipif(not (EXAMPLES / "fenced_sql_writer.py").exists(), reason="not present")
def test_fenced_sql_writer_with_sqlite(
    env: dict[str, str], etcd_namespace: str, tmp_path: Path
) -> None:
    dsn = f"sqlite:///{tmp_path / 'fenced.db'}"
    locked = subprocess.run(
        [PYTHON, "-m", "etcdfence", "lock", f"{etcd_namespace}/db", "--",
         PYTHON, str(EXAMPLES / "fenced_sql_writer.py"), "--dsn", dsn, "--value", "10.0.0.5"],
        capture_output=True, text=True, env=env, timeout=30,
    )  # fmt: skip
    assert locked.returncode == 0, locked.stdout + locked.stderr
    stale = example(
        "fenced_sql_writer.py", "--dsn", dsn, "--value", "10.0.0.9", "--token", "1", env=env
    )
    assert stale.returncode == 3, stale.stdout + stale.stderr
    with sqlite3.connect(tmp_path / "fenced.db") as conn:
        rows = conn.execute("SELECT value FROM fenced_kv").fetchall()
    assert rows == [("10.0.0.5",)]


def test_the_documented_examples_exist() -> None:
    assert set(OURS) <= {p.name for p in EXAMPLES.glob("*.py")}


@pytest.mark.serial  # two beats and a worker hand over within the run
@pytest.mark.integration
@pytest.mark.broker
def test_celery_beat_example_writes_one_report_per_slot_across_a_failover(
    env: dict[str, str], etcd_namespace: str
) -> None:
    """examples/celery_beat.py: a worker and two beats on Redis; the leader resigns
    half-way, the other beat resumes after the last recorded slot: one report per slot,
    contiguous slots, the later term's token after the earlier one's."""
    import os

    from etcdfence.celery._slots import parse_time

    try:
        socket.create_connection(("127.0.0.1", 6379), timeout=2).close()
    except OSError as exc:
        if os.environ.get("ETCDFENCE_REQUIRE_BROKERS") == "1":
            pytest.fail(f"Redis is down: {exc} (ETCDFENCE_REQUIRE_BROKERS=1)")
        pytest.skip(f"Redis is down: {exc}")
    name = "ex_" + etcd_namespace.rsplit("-", 1)[-1]
    run_env = {
        **env,
        "CELERY_BEAT_EXAMPLE": name,
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/14",
        "CELERY_BEAT_TTL": "2",
    }
    try:
        # 14 s: the worker and both beats start as processes; on a loaded machine that
        # took most of an 8 s run once (2 reports)
        result = example("celery_beat.py", "--seconds", "14", env=run_env, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        reports = re.findall(r"report (\S+) written with token (\d+)", result.stdout)
        slots = [slot for slot, _ in reports]
        assert len(slots) >= 4 and len(set(slots)) == len(slots), result.stdout
        times = sorted(parse_time(s.split("@", 1)[1]).timestamp() for s in slots)
        assert all(b - a == 1.0 for a, b in itertools.pairwise(times)), slots
        by_time = [int(t) for _, t in sorted(reports, key=lambda r: parse_time(r[0].split("@")[1]))]
        assert len(set(by_time)) == 2 and by_time == sorted(by_time), by_time
        assert f"{len(slots)} report(s), one per slot" in result.stdout
    finally:
        import redis

        broker = redis.Redis.from_url("redis://127.0.0.1:6379/14")
        # the queue, its own binding keys, and its binding in the exchange's set
        broker.delete(name, f"_kombu.binding.{name}", f"_kombu.binding_permanent.{name}")
        for key in broker.scan_iter(match="_kombu.binding.*"):
            members: set[bytes] = broker.smembers(key)  # type: ignore[assignment]
            for member in members:
                if member.endswith(b"\x06\x16" + name.encode()):
                    broker.srem(key, member)
        with ef.Client(env["ETCDFENCE_ENDPOINTS"]) as client:
            client.delete(f"/etcdfence/celery/{name}/", prefix=True)
            client.delete(f"/etcdfence/fence/celery/{name}", prefix=True)
            client.delete(f"celery/{name}/", prefix=True)
