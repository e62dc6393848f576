.PHONY: setup test run standalone chaos chaos-quick sim sim-whole sim-ledger sim-autorecovery fuzz compose-check proto proto-check bench
setup:
	bash scripts/setup.sh
test:
	bash scripts/test.sh
# the main command: install, start the standalone, produce/consume 1000 messages, serve until Ctrl-C
run:
	bash scripts/run.sh
standalone:
	.venv/bin/pulsarlite standalone --data-dir run/standalone
# longer, time-bounded chaos runs (CHAOS_BUDGET_S, CHAOS_RUN_S, CHAOS_SEED)
chaos:
	bash scripts/chaos.sh
# the publish path's simulation beyond the suite's 10,000 seeds (SIM_SEEDS, default 0-99999; ~15 min)
sim:
	.venv/bin/python -m tests.sim.publish_sim --seeds $${SIM_SEEDS:-0-99999}
# the whole publish path's simulation (topic, managed ledger, ledger client over simulated bookies,
# network and ZooKeeper): make sim-whole SEEDS=A-B (0-9999 by default, ~3.5-4.5 min; the test command
# runs the same 10,000 seeds beside the rest of the suite, tests/sim/background_sweep.py)
sim-whole:
	.venv/bin/python -m tests.sim.whole_path_sim --seeds $(or $(SEEDS),0-9999)
# the ledger write/recovery simulation (tests/sim/simulator.py, recovery changing the ensemble,
# bookies lost for good) beyond the suite's seeds 0-1899: make sim-ledger SEEDS=N runs N seeds of
# every configuration from seed 10000 (default 5000: ~1 min); one line per seed, stops at a failure
sim-ledger:
	for c in $$(.venv/bin/python -c "from tests.sim.simulator import CONFIGS; print(' '.join(CONFIGS))"); do \
	  .venv/bin/python -m tests.sim.simulator --seed 10000 --seeds $(or $(SEEDS),5000) --config $$c || exit 1; done
# the autorecovery simulation (tests/sim/autorecovery_sim.py: auditor, 1-3 workers, losses, crashes,
# rot) beyond the suite's 40 seeds per configuration: make sim-autorecovery SEEDS=N (default 2000:
# ~3 min), from seed 10000
sim-autorecovery:
	for c in $$(.venv/bin/python -c "from tests.sim.autorecovery_sim import CONFIGS; print(' '.join(CONFIGS))"); do \
	  .venv/bin/python -m tests.sim.autorecovery_sim --seed 10000 --seeds $(or $(SEEDS),2000) --config $$c || exit 1; done
# the fuzz suite: malformed input to the broker port, the admin API and the bookie port with a
# canary producer (tests/fuzz), 20 s per target (the README's test command runs it with 5 s);
# longer: PULSARLITE_FUZZ_SECONDS=600 make fuzz
fuzz:
	PULSARLITE_FUZZ=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/fuzz
# only the bounded chaos runs of the test suite
chaos-quick:
	.venv/bin/python -m pytest -q -p no:cacheprovider tests/chaos
compose-check:
	docker-compose -f deploy/docker-compose.yml config -q
	docker-compose -f deploy/docker-compose.secure.yml config -q
	.venv/bin/python -m pytest -q -p no:cacheprovider tests/integration/test_deploy.py
	.venv/bin/python -m pytest -q -p no:cacheprovider tests/integration/test_security_conf.py -k "secure_compose or make_secrets"
	.venv/bin/python -m pytest -q -p no:cacheprovider tests/integration/test_dashboard_metrics.py -k "provisioning or extraction"
proto:
	.venv/bin/python scripts/gen_proto.py
proto-check:
	.venv/bin/python scripts/gen_proto.py --check
# the benchmark suite (<= 15 min): every figure beside the machine's limits and NATS JetStream,
# medians of 3 rounds (components once); rewrites the suite block of BENCHMARKS.md and keeps the
# raw figures in bench/last-suite.json (re-render: bench/suite.py --render bench/last-suite.json)
bench:
	bash scripts/setup.sh
	.venv/bin/python -m pip install -q -e ".[test,bench]"
	.venv/bin/python bench/suite.py --runs 3 --write
