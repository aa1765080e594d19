# webhook-inbox: `make run` for a local demo, `make test` for the whole suite.
# Without DATABASE_URL both start a throwaway PostgreSQL of their own (scripts/local-postgres).

SHELL := /bin/bash
CARGO ?= cargo
PG := scripts/local-postgres

.PHONY: all build run test lint unit-test deploy-check bench fmt clean

all: build

build:
	$(CARGO) build --workspace --bins

## Local demo: database, migrations, receiver and worker, and a signed webhook to paste.
run: build
	$(PG) with run-$$$$ dev -- scripts/run-demo

## The whole suite: formatting, lints, then every test against a real PostgreSQL.
test: lint deploy-check unit-test

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## deploy/: manifests, compose, Prometheus rules and tests, dashboard, and a live Prometheus.
deploy-check:
	CARGO=$(CARGO) deploy/check

## Throughput and latency beside pgbench ceilings, on a tuned throwaway PostgreSQL:
## writes bench/report.md and bench/chart.svg (about 10 minutes).
bench:
	bench/run

unit-test:
	$(CARGO) build --workspace --bins
	$(PG) with test-$$$$ test -- scripts/run-tests

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
