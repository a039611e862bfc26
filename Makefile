# Two commands for a newcomer: `make demo` and `make test`. Both build .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint unit integration netns faults swarm swarm-mutants swarm-long bench bench-quick bench-flood bench-scale bench-order bench-leader bench-lossy stress soak clean

$(STAMP): pyproject.toml setup.cfg constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check torch_mingle tests benchmarks examples
	$(BIN)/ruff format --check torch_mingle tests benchmarks examples
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest tests

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

integration: $(STAMP)
	$(BIN)/python -m pytest tests/integration

netns: $(STAMP)
	$(BIN)/python -m pytest tests/netns

faults: $(STAMP)
	$(BIN)/python -m pytest tests/faults

# The fault swarm (tests/swarm): SEEDS seeds from START, or run for DURATION seconds with swarm-long.
SEEDS ?= 10000
START ?= 0
DURATION ?= 7200
swarm: $(STAMP)
	$(BIN)/python -m tests.swarm --seeds $(SEEDS) --start $(START) --json bench-results/swarm.json

# Each named safety rule broken on purpose: the first seed that catches it (docs/faults.md).
swarm-mutants: $(STAMP)
	$(BIN)/python -m tests.swarm.mutants --seeds 2000 --json bench-results/swarm-mutants.json --record

swarm-long: $(STAMP)
	$(BIN)/python -m tests.swarm --duration $(DURATION) --start $(START) --json bench-results/swarm-long.json

bench: $(STAMP)
	$(BIN)/python benchmarks/rendezvous_latency.py

bench-quick: $(STAMP)
	$(BIN)/python benchmarks/rendezvous_latency.py --quick

bench-scale: $(STAMP)
	$(BIN)/python benchmarks/scale_rendezvous.py

# One real leader and up to 16,384 members from one load generator (about 10 minutes).
bench-leader: $(STAMP)
	$(BIN)/python benchmarks/leader_capacity.py

bench-order: $(STAMP)
	$(BIN)/python benchmarks/rank_order.py

bench-lossy: $(STAMP)
	$(BIN)/python benchmarks/lossy_heartbeats.py --seconds 300 --json benchmarks/results/lossy_heartbeats.json

bench-flood: $(STAMP)
	$(BIN)/python benchmarks/flood_latency.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

soak: $(STAMP)
	$(BIN)/python -m tests.stress.loaded_soak --minutes 30

stress: $(STAMP)
	$(BIN)/python -m tests.stress.mixed_faults --trials 20
	$(BIN)/python -m tests.stress.mixed_faults --trials 20 --faults partition
	$(BIN)/python -m tests.stress.mixed_faults --trials 20 --faults mcast-off
	$(BIN)/python -m tests.stress.mixed_faults --trials 20 --faults reset-partition
	$(BIN)/python -m tests.stress.mixed_faults --trials 100 --faults cold-start
