//! Proof under fire, long version: `make chaos`. Two receivers and three workers under the
//! provider simulator for minutes, with workers and receivers killed with SIGKILL and
//! PostgreSQL stopped abruptly, sized by CHAOS_EVENTS, CHAOS_DURATION, CHAOS_WORKER_KILLS,
//! CHAOS_RECEIVER_KILLS, CHAOS_DATABASE_RESTARTS and CHAOS_SEED; then the failover of a
//! primary to its synchronous standby, and to an asynchronous one (CHAOS_FAILOVER_EVENTS,
//! CHAOS_FAILOVER_DURATION). Prints the summary tables.

use inbox_tests::chaos::{self, Scenario, Standby};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: run by `make chaos`"]
async fn long_run_with_every_component_killed_keeps_every_invariant() {
    let outcome = chaos::run(Scenario::long_from_env()).await;
    println!("{}", outcome.table());
    outcome.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: run by `make chaos`"]
async fn failover_to_a_synchronous_standby_loses_no_acknowledged_event() {
    let outcome = chaos::run(Scenario::long_failover(
        "failover-sync",
        Standby::Synchronous,
    ))
    .await;
    println!("{}", outcome.table());
    outcome.assert_clean();
    assert_eq!(outcome.check.acked_lost, 0);
}

/// Loss is allowed here, and reported: an asynchronous standby acknowledges nothing, so the
/// commits it had not received when the primary died are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: run by `make chaos`"]
async fn failover_to_an_asynchronous_standby_reports_the_acknowledged_events_lost() {
    let outcome = chaos::run(Scenario::long_failover(
        "failover-async",
        Standby::Asynchronous,
    ))
    .await;
    println!("{}", outcome.table());
    outcome.assert_clean();
}
