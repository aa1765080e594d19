//! A provider simulator: sends signed webhooks to receivers the way real providers do, and
//! records what it sent and what was acknowledged, so that a test (or an operator) can check
//! the inbox's promises against the database afterwards.
//!
//! It reads the receiver's own provider file ([`receiver::providers::Providers`]) and signs
//! with the configured schemes and secrets. From one seed it draws a [`Plan`]:
//!
//! - every event is delivered 2 to 5 times ([`Mix::min_copies`], [`Mix::max_copies`]), some
//!   copies at the same instant (bursts), all deliveries shuffled across the run, some copies
//!   held back until the end (late retries);
//! - some deliveries are forged: a bad signature, or a correctly signed request replayed with a
//!   stale timestamp; a few events are only ever forged and must never enter the inbox;
//! - event types decide the expected [`Fate`] under [`ROUTES`]: `order.*`, `customer.*` and
//!   `payment.*` reach the demo handler (one business effect each; payments come in
//!   succeeded/refunded pairs about one object, delivered in any order), `unrouted.*` match no
//!   route (completed as ignored), `demo.poison` fails permanently (dead letter);
//! - a provider with an `[ordering]` table gets its routed events as versions of one order,
//!   its ordering key: 2 to 5 events with sequences 1, 2, ... placed where the table reads
//!   them, their copies shuffled like all others (later versions often arrive first), and for
//!   some keys one copy of each sent at the same instant. Its poison and unrouted events carry
//!   no key, so they are processed unordered.
//!
//! Every genuine delivery that does not get a 2xx is retried like a provider retries:
//! exponential backoff with full jitter, bounded in attempts and in time. The run ends with a
//! [`Report`]: per event its id, type, expected fate, and whether it was acknowledged.
//!
//! ```no_run
//! # async fn demo(providers: receiver::providers::Providers) -> anyhow::Result<()> {
//! let config = inbox_simulator::Config::new(vec!["http://127.0.0.1:8080".parse()?], 1_000);
//! let report = inbox_simulator::run(std::sync::Arc::new(providers), &config).await?;
//! assert_eq!(report.totals.unacked_events, 0);
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod plan;
pub mod report;
pub mod send;
pub mod wire;

use std::sync::Arc;

use receiver::providers::Providers;

pub use plan::{Delivery, DeliveryKind, Fate, Job, Mix, Plan, PlanError, PlannedEvent};
pub use report::{EventRecord, Report, Totals};
pub use send::{Progress, RetryPolicy, SendSettings};

/// The worker routes under which the expected fates of a [`Report`] hold
/// (`worker run --routes FILE`; `inbox-simulator routes` prints it). With `--demo-handler`
/// instead, `unrouted.*` events would get an effect too.
pub const ROUTES: &str = r#"# Routes for the provider simulator's events (worker run --routes FILE).
# order.*, customer.* and payment.*: the demo handler, one demo_ledger line per event.
# demo.poison: the demo handler, which fails it permanently (dead letter).
# unrouted.*: no route, so the worker completes them as ignored.
[[routes]]
event_type = "order.*"
handler = "demo"

[[routes]]
event_type = "customer.*"
handler = "demo"

[[routes]]
event_type = "payment.*"
handler = "demo"

[[routes]]
event_type = "demo.poison"
handler = "demo"
"#;

/// Everything a run needs besides the providers.
#[derive(Debug, Clone)]
pub struct Config {
    /// How many events to plan (payment pairs count as two).
    pub events: usize,
    /// Seed of the plan: the mix, the types, the order of deliveries.
    pub seed: u64,
    /// Part of every event id, so that ids are unique per run (random when `None`).
    pub run_id: Option<String>,
    /// Providers to send for (all configured providers when empty).
    pub only_providers: Vec<String>,
    /// Proportions of duplicates, forgeries and event types.
    pub mix: Mix,
    /// Where and how to send.
    pub send: SendSettings,
}

impl Config {
    /// Defaults for `events` events sent to `targets` (receiver base URLs).
    pub fn new(targets: Vec<reqwest::Url>, events: usize) -> Self {
        Self {
            events,
            seed: 1,
            run_id: None,
            only_providers: Vec::new(),
            mix: Mix::default(),
            send: SendSettings::new(targets),
        }
    }
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The plan could not be drawn.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The HTTP client could not be built, or no target was given.
    #[error("sender: {0}")]
    Send(String),
}

/// Draws the plan and sends it; returns the report once every delivery was acknowledged,
/// rejected as expected, or given up on.
pub async fn run(providers: Arc<Providers>, config: &Config) -> Result<Report, SimError> {
    run_with_progress(providers, config, Arc::new(Progress::default())).await
}

/// [`run`], updating `progress` as it goes (for progress lines or a test's chaos loop).
pub async fn run_with_progress(
    providers: Arc<Providers>,
    config: &Config,
    progress: Arc<Progress>,
) -> Result<Report, SimError> {
    let run_id = config.run_id.clone().unwrap_or_else(random_run_id);
    let plan = Plan::new(
        &providers,
        &config.only_providers,
        &config.mix,
        config.events,
        config.seed,
        &run_id,
    )?;
    send::send(providers, Arc::new(plan), &config.send, progress).await
}

/// Eight random hex digits.
pub fn random_run_id() -> String {
    format!("{:08x}", rand::random::<u32>())
}
