//! Proof under fire, long version: `make chaos`. Two receivers and three workers under the
//! provider simulator for minutes, with workers and receivers killed with SIGKILL and
//! PostgreSQL stopped abruptly, sized by CHAOS_EVENTS, CHAOS_DURATION, CHAOS_WORKER_KILLS,
//! CHAOS_RECEIVER_KILLS, CHAOS_DATABASE_RESTARTS and CHAOS_SEED; prints the summary table.

use inbox_tests::chaos::{self, Scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: run by `make chaos`"]
async fn long_run_with_every_component_killed_keeps_every_invariant() {
    let outcome = chaos::run(Scenario::long_from_env()).await;
    println!("{}", outcome.table());
    outcome.assert_clean();
}
