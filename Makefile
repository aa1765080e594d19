# webhook-inbox: `make run` for a local demo, `make test` for the whole suite.
# Without DATABASE_URL both start a throwaway PostgreSQL of their own (scripts/local-postgres).

SHELL := /bin/bash
CARGO ?= cargo
PG := scripts/local-postgres

.PHONY: all build run test lint unit-test deploy-check bench soak chaos fmt clean

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

## The steady state: half an hour at half the measured steady capacity on the `production`
## PostgreSQL profile, sampled every minute; writes bench/soak-results/report.md and chart.svg.
## SOAK_MINUTES (30), SOAK_SHARE (50 %), SOAK_RATE, SOAK_PROFILE: see bench/soak.
soak:
	bench/soak

## Proof under fire, long version (minutes): two receivers and three workers under the provider
## simulator, workers and receivers killed with SIGKILL, PostgreSQL stopped abruptly, then a
## summary table; then the primary killed with SIGKILL and its standby promoted, synchronous
## (nothing acknowledged may be lost) and asynchronous (the loss is reported), one scenario at a
## time; then every fuzz target of inbox-signature for FUZZ_SECONDS (default 25).
## Sized by CHAOS_EVENTS (50000), CHAOS_DURATION (240s of sending), CHAOS_WORKER_KILLS (24),
## CHAOS_RECEIVER_KILLS (4), CHAOS_DATABASE_RESTARTS (2), CHAOS_FAILOVER_EVENTS (10000),
## CHAOS_FAILOVER_DURATION (60s), CHAOS_SEED.
chaos: build
	$(CARGO) test -p inbox-tests --test chaos_long -- --ignored --nocapture --test-threads 1
	crates/inbox-signature/fuzz/run

unit-test:
	$(CARGO) build --workspace --bins
	$(PG) with test-$$$$ test -- scripts/run-tests

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
