# Two commands set everything up on a fresh machine: `make run` and `make test`.
VENV := .venv

.PHONY: run test stop setup unit

setup:
	bash cluster/bootstrap.sh

run: setup
	$(VENV)/bin/tandem run

stop:
	$(VENV)/bin/tandem stop

test: setup
	$(VENV)/bin/python -m pytest -ra

unit: setup
	$(VENV)/bin/python -m pytest -ra tests/unit
