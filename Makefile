.PHONY: setup test run proto proto-check bench
setup:
	bash scripts/setup.sh
test:
	bash scripts/test.sh
run:
	bash scripts/run.sh
proto:
	.venv/bin/python scripts/gen_proto.py
proto-check:
	.venv/bin/python scripts/gen_proto.py --check
bench:
	.venv/bin/python bench/bench_ledger.py
