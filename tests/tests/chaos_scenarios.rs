//! Proof under fire, short versions (part of `make test`): the real binaries as processes on
//! a PostgreSQL server of each scenario's own, the provider simulator sending signed webhooks
//! with duplicates, bursts, reordering, late copies and forgeries, and components killed with
//! SIGKILL along the way. Each scenario ends with the invariants of DESIGN.md checked against
//! the database (`inbox_tests::chaos`), the per-key order of the ordered provider's events
//! among them. `make chaos` runs the long version.

use std::time::Duration;

use inbox_tests::chaos::{self, Scenario, Standby};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_killed_at_random_moments_lose_nothing_and_apply_nothing_twice() {
    let outcome = chaos::run(Scenario {
        workers: 3,
        worker_kills: 8,
        send_for: Duration::from_secs(10),
        ..Scenario::new("workers", 1_500)
    })
    .await;
    println!("{}", outcome.table());
    outcome.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_killed_and_restarted_while_the_simulator_sends_loses_no_acknowledged_event() {
    let outcome = chaos::run(Scenario {
        receiver_kills: 3,
        send_for: Duration::from_secs(10),
        ..Scenario::new("receiver", 1_500)
    })
    .await;
    println!("{}", outcome.table());
    outcome.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_for_seconds_under_load_loses_and_duplicates_nothing() {
    let outcome = chaos::run(Scenario {
        database_restarts: 1,
        database_downtime: (Duration::from_secs(2), Duration::from_secs(4)),
        send_for: Duration::from_secs(10),
        ..Scenario::new("database", 1_500)
    })
    .await;
    println!("{}", outcome.table());
    outcome.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_receivers_and_three_workers_share_the_inbox_without_duplicates() {
    let outcome = chaos::run(Scenario {
        receivers: 2,
        workers: 3,
        send_for: Duration::from_secs(8),
        ..Scenario::new("replicas", 2_000)
    })
    .await;
    println!("{}", outcome.table());
    outcome.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_killed_and_its_synchronous_standby_promoted_loses_no_acknowledged_event() {
    let outcome = chaos::run(Scenario {
        failover: Some(Standby::Synchronous),
        send_for: Duration::from_secs(10),
        ..Scenario::new("failover", 1_500)
    })
    .await;
    println!("{}", outcome.table());
    outcome.assert_clean();
    assert_eq!(outcome.check.acked_lost, 0);
}
