# loraplane — make targets. `make help` lists them.
SHELL := /bin/bash
PY := .venv/bin/python
LP := .venv/bin/loraplane
STAMP := .venv/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.DEFAULT_GOAL := help
.PHONY: help install system-deps proto proto-check migrate run status stop test test-unit bench bench-policy bench-admission bench-cold bench-gateway bench-registry bench-cache bench-isolation stress stack-up stack-down lint typecheck demo clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*?## "}{printf "  make %-13s %s\n", $$1, $$2}'

install: $(STAMP) ## install everything missing: apt packages (Prometheus, PostgreSQL), the venv in .venv/, the compiled policy (rebuilt after a policy edit)
	@$(PY) -m loraplane.native build --quiet

$(STAMP): pyproject.toml requirements.lock scripts/install.sh
	@bash scripts/install.sh
	@touch $(STAMP)

system-deps: ## install the apt packages the local stack needs (Prometheus, PostgreSQL) when missing
	@bash scripts/install.sh --system-only

proto: install ## regenerate the protobuf / gRPC code in services/v1 from proto/
	$(PY) scripts/gen_proto.py

proto-check: install ## fail when services/v1 is stale
	$(PY) scripts/gen_proto.py --check

migrate: install ## apply database migrations to the running `make run` stack (dbmate)
	$(LP) db migrate

run: install ## start the whole platform on the embedded stack and keep serving (Ctrl-C stops everything)
	$(LP) run

status: install ## exit 0 only when every component of the running stack is healthy
	@$(LP) status

stop: install ## stop a `make run` stack left behind (normally Ctrl-C does it)
	$(LP) stack down

stack-up: install ## start only the embedded stack (Tansu, SeaweedFS, PostgreSQL, Prometheus)
	$(LP) stack up

stack-down: install ## stop the embedded stack
	$(LP) stack down

demo: install ## build the tiny base model and the signed demo adapters (cached in .loraplane/models)
	$(LP) demo build

test: install ## install what is missing, lint, start the test stack once, run the whole suite, stop the stack
	$(PY) -m ruff check services tests scripts benchmarks
	$(PY) scripts/gen_proto.py --check
	@set -o pipefail; rc=0; $(PY) -m pytest -p no:cacheprovider $(PYTEST_ARGS) || rc=$$?; \
	  $(LP) stack down --profile test >/dev/null 2>&1 || true; exit $$rc

test-unit: install ## unit tests only (no stack, no engine)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

bench: install ## every benchmark (each prints ratios measured side by side in one run; JSON in .loraplane/bench/)
	@rc=0; for b in bench-policy bench-admission bench-cold bench-gateway bench-registry bench-cache; do \
	  $(MAKE) --no-print-directory $$b || { echo "$$b: target missed or failed (see above)"; rc=1; }; \
	done; exit $$rc

bench-policy: install ## cache policies on the reference traces (synthetic + GenTD26, libCacheSim HOT baselines): table + .loraplane/bench/policy.json
	$(PY) -m loraplane.sim.bench

bench-admission: install ## admission verification MB/s beside raw sha256 MB/s -> .loraplane/bench/admission.json
	$(PY) -m benchmarks.admission

bench-cold: install ## worker cold path (S3 -> verified -> engine) beside raw GET+sha256, 1-100 MB -> .loraplane/bench/cold.json
	$(PY) -m benchmarks.cold

bench-gateway: install ## direct vs pass-through proxy vs gateway (plaintext, mutual TLS to the worker, TLS at the edge too, two processes on one port) on the null engine -> .loraplane/bench/gateway.json
	$(PY) -m benchmarks.gateway

bench-registry: install ## register -> event published latency on a private stack -> .loraplane/bench/registry.json
	scripts/with_stack.sh $(PY) -m benchmarks.registry

bench-cache: install ## cache-manager round p50/p99 per shard, 4-64 workers x 200-10,000 versions (target p99 <= 50 ms at 64 x 10,000), heat throughput -> .loraplane/bench/cache.json
	scripts/with_stack.sh $(PY) -m benchmarks.cache

bench-isolation: install ## noisy neighbour on one real vLLM worker: quiet tenants' p50/p99 alone vs during floods -> .loraplane/bench/isolation.json
	LORAPLANE_ISOLATION_HOLD_COMPARE=1 $(PY) -m pytest -s -q tests/integration/platform/test_isolation.py

stress: install ## the platform under load and faults (2 vLLM workers, 12 scenarios, invariants checked) -> .loraplane/bench/stress.json
	$(PY) tests/stress/stress.py $(if $(ONLY),--only $(ONLY))

lint: install ## ruff
	$(PY) -m ruff check services tests scripts benchmarks

typecheck: install ## mypy --strict on the pure core (policy), the shared library, every service and the local stack
	@mkdir -p .loraplane/mypy && ln -sfn ../../services .loraplane/mypy/loraplane
	MYPYPATH=.loraplane/mypy $(PY) -m mypy --strict --follow-imports=silent -p loraplane.policy -p loraplane.native \
	  -p loraplane.shared.signing -p loraplane.shared.topics -p loraplane.shared.codec \
	  -p loraplane.shared.consumer -p loraplane.shared.resources -p loraplane.shared.aio \
	  -p loraplane.shared.kafka_client -p loraplane.shared.tls -p loraplane.shared.stderr_tee \
	  -p loraplane.cache_manager -p loraplane.gateway -p loraplane.registry \
	  -p loraplane.admission -p loraplane.worker -p loraplane.stack

clean: ## remove local state (.loraplane/) — stops the stacks first
	-$(LP) stack down --profile run
	-$(LP) stack down --profile test
	rm -rf .loraplane
