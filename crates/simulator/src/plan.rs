//! The plan of a run, drawn from one seed: the events, what each must become, and the
//! deliveries that carry them, in the order they will be sent.

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use receiver::providers::{Provider, Providers};
use serde::{Deserialize, Serialize};

use crate::wire;

/// What the inbox must make of an event, under the simulator's routes ([`crate::ROUTES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fate {
    /// Routed to the demo handler: exactly one business effect (one demo_ledger line), done.
    Effect,
    /// No route matches its type: completed as ignored, no effect, done.
    Ignored,
    /// Fails permanently (`demo.poison`): dead-lettered, no effect.
    Dead,
    /// Only forged deliveries were sent: it must never enter the inbox.
    Rejected,
}

/// How one delivery is signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeliveryKind {
    /// Signed with a configured secret (any of them: rotation) and the current time.
    Genuine,
    /// Signed with a key the receiver does not know: must be answered 401, never stored.
    BadSignature,
    /// Correctly signed, with a timestamp older than the scheme's tolerance (a captured
    /// request replayed): must be answered 401. Only for the timestamped schemes.
    StaleTimestamp,
}

impl DeliveryKind {
    /// Whether the provider itself sent it (and retries it until acknowledged).
    pub fn is_genuine(self) -> bool {
        self == Self::Genuine
    }
}

/// Proportions of the run. Fractions are per event, drawn independently.
#[derive(Debug, Clone, PartialEq, Serialize, clap::Args)]
pub struct Mix {
    /// Fewest genuine copies of each event (a provider's duplicates).
    #[arg(long, default_value_t = Mix::DEFAULT.min_copies, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub min_copies: u32,
    /// Most genuine copies of each event.
    #[arg(long, default_value_t = Mix::DEFAULT.max_copies, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub max_copies: u32,
    /// Events whose copies include a burst of 2 or more sent at the same instant.
    #[arg(long, default_value_t = Mix::DEFAULT.concurrent)]
    pub concurrent: f64,
    /// Events with one copy held back until every other delivery was sent (a late retry).
    #[arg(long, default_value_t = Mix::DEFAULT.late)]
    pub late: f64,
    /// Events that also receive a copy with a bad signature.
    #[arg(long, default_value_t = Mix::DEFAULT.bad_signature)]
    pub bad_signature: f64,
    /// Events that also receive a correctly signed copy with a stale timestamp (timestamped
    /// schemes; a bad signature for the others).
    #[arg(long, default_value_t = Mix::DEFAULT.stale)]
    pub stale: f64,
    /// Events never sent genuinely, only forged (expected fate: rejected).
    #[arg(long, default_value_t = Mix::DEFAULT.forged_only)]
    pub forged_only: f64,
    /// Events of a type no route matches (`unrouted.*`; expected fate: ignored).
    #[arg(long, default_value_t = Mix::DEFAULT.unrouted)]
    pub unrouted: f64,
    /// Events of type `demo.poison`, which the demo handler fails (expected fate: dead).
    #[arg(long, default_value_t = Mix::DEFAULT.poison)]
    pub poison: f64,
    /// Events that are half of a payment.succeeded / payment.refunded pair about one payment.
    #[arg(long, default_value_t = Mix::DEFAULT.payments)]
    pub payments: f64,
}

impl Mix {
    /// The defaults: 2-5 copies, 30 % bursts, 10 % late, 5 % bad signatures, 5 % stale
    /// replays, 1 % forged only, 10 % unrouted, 2 % poison, 10 % payments.
    pub const DEFAULT: Self = Self {
        min_copies: 2,
        max_copies: 5,
        concurrent: 0.3,
        late: 0.1,
        bad_signature: 0.05,
        stale: 0.05,
        forged_only: 0.01,
        unrouted: 0.1,
        poison: 0.02,
        payments: 0.1,
    };

    fn validate(&self) -> Result<(), PlanError> {
        let invalid = |message: String| Err(PlanError::InvalidMix(message));
        if self.min_copies == 0 || self.max_copies < self.min_copies {
            return invalid(format!(
                "copies must satisfy 1 <= min ({}) <= max ({})",
                self.min_copies, self.max_copies
            ));
        }
        for (name, value) in [
            ("concurrent", self.concurrent),
            ("late", self.late),
            ("bad-signature", self.bad_signature),
            ("stale", self.stale),
            ("forged-only", self.forged_only),
            ("unrouted", self.unrouted),
            ("poison", self.poison),
            ("payments", self.payments),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return invalid(format!("--{name} {value} is not a fraction in [0, 1]"));
            }
        }
        let typed = self.unrouted + self.poison + self.payments;
        if typed > 1.0 {
            return invalid(format!("unrouted + poison + payments = {typed} exceeds 1"));
        }
        Ok(())
    }
}

impl Default for Mix {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Why a plan could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// No provider to send for.
    #[error("no provider to send for: the provider file is empty or --provider matched none")]
    NoProvider,
    /// `--provider` names a provider the file does not have.
    #[error("provider {0:?} is not in the provider file")]
    UnknownProvider(String),
    /// The provider's configuration cannot be simulated.
    #[error("provider {provider:?} cannot be simulated: {reason}")]
    Unsupported {
        /// The provider.
        provider: String,
        /// Why.
        reason: String,
    },
    /// The mix is inconsistent.
    #[error("invalid mix: {0}")]
    InvalidMix(String),
}

/// One event of the plan, with the exact request body and identity headers every copy carries.
#[derive(Debug, Clone)]
pub struct PlannedEvent {
    /// Provider name (the URL path and first half of the dedup key).
    pub provider: String,
    /// Event id, unique per run.
    pub event_id: String,
    /// Event type as the receiver will read it (`None` when the provider carries none).
    pub event_type: Option<String>,
    /// The business object it is about (order or payment id), shared by several events.
    pub object: Option<String>,
    /// Payment amount, for payment events.
    pub amount: Option<i64>,
    /// Its sequence within its object, for an ordered provider's event: the object is then
    /// its ordering key, and the key's events have sequences 1, 2, ... in plan order.
    pub sequence: Option<i64>,
    /// What the inbox must make of it.
    pub fate: Fate,
    /// Genuine copies planned.
    pub copies: u32,
    /// Forged copies planned.
    pub forged: u32,
    /// The body, identical in every copy (providers resend the same payload).
    pub body: Vec<u8>,
    /// Headers that carry its identity (not its signature), e.g. `X-GitHub-Delivery`.
    pub headers: Vec<(String, String)>,
    /// For providers that send batches: other events (indices into the plan) whose items ride
    /// along in every request of this one, as extra copies of them.
    pub batch_with: Vec<usize>,
}

/// One HTTP delivery of one event (retries of it are attempts, not deliveries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// Index of the event in [`Plan::events`].
    pub event: usize,
    /// How it is signed.
    pub kind: DeliveryKind,
}

/// Deliveries started at the same instant: one, or a concurrent burst of copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// The deliveries.
    pub deliveries: Vec<Delivery>,
}

/// A run's events and its deliveries, in sending order.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Part of every event id.
    pub run_id: String,
    /// The seed it was drawn from.
    pub seed: u64,
    /// The events.
    pub events: Vec<PlannedEvent>,
    /// Deliveries sent first, shuffled across events.
    pub main: Vec<Job>,
    /// Late copies, sent after every main delivery was started (and a pause).
    pub late: Vec<Job>,
}

/// Event types routed to the demo handler, besides payments.
const ROUTED_TYPES: [&str; 3] = ["order.created", "order.updated", "customer.updated"];
/// Event types no route matches.
const UNROUTED_TYPES: [&str; 2] = ["unrouted.audit_log", "unrouted.ping"];
/// The demo handler's poison type.
pub const POISON_TYPE: &str = "demo.poison";

/// Most events of one ordering key in a plan.
const MAX_EVENTS_PER_KEY: usize = 5;

/// What an event is about, before it is dressed for its provider.
struct Draft {
    event_type: Option<&'static str>,
    object: Option<String>,
    amount: Option<i64>,
    /// Its sequence within `object`, its ordering key (ordered providers only).
    sequence: Option<i64>,
    fate: Fate,
}

impl Draft {
    /// An event about nothing in particular (an ordered provider processes it unordered).
    fn plain(event_type: Option<&'static str>, fate: Fate) -> Self {
        Self {
            event_type,
            object: None,
            amount: None,
            sequence: None,
            fate,
        }
    }
}

/// Where the deliveries of a plan go as they are drawn.
struct Schedule {
    main: Vec<Job>,
    late: Vec<Job>,
    /// While the events of one key are drawn, possibly: one genuine copy of each, to be sent
    /// together (a provider flushing its backlog of an object), so that they reach the inbox
    /// at once and contend for their key.
    key_burst: Option<Vec<Delivery>>,
}

impl Plan {
    /// Draws `count` events over `providers` (or only those named in `only`).
    pub fn new(
        providers: &Providers,
        only: &[String],
        mix: &Mix,
        count: usize,
        seed: u64,
        run_id: &str,
    ) -> Result<Self, PlanError> {
        mix.validate()?;
        let selected: Vec<&Provider> = if only.is_empty() {
            providers.iter().collect()
        } else {
            only.iter()
                .map(|name| {
                    providers
                        .get(name)
                        .ok_or_else(|| PlanError::UnknownProvider(name.clone()))
                })
                .collect::<Result<_, _>>()?
        };
        if selected.is_empty() {
            return Err(PlanError::NoProvider);
        }
        for provider in &selected {
            wire::check_supported(provider).map_err(|reason| PlanError::Unsupported {
                provider: provider.name.clone(),
                reason,
            })?;
        }

        let mut rng = StdRng::seed_from_u64(seed);
        let objects = (count / 3).max(1);
        let mut events: Vec<PlannedEvent> = Vec::with_capacity(count);
        let mut schedule = Schedule {
            main: Vec::new(),
            late: Vec::new(),
            key_burst: None,
        };
        while events.len() < count {
            let provider = *selected.choose(&mut rng).ok_or(PlanError::NoProvider)?;
            let typed = wire::carries_type(provider);
            let roll: f64 = rng.random();
            // Poison and unrouted events carry no object, so an ordered provider's are
            // unordered: a dead head would block its key, and an event done without a handler
            // would leave no trace of its place in the key's order.
            let drafts = if !typed {
                vec![Draft::plain(None, Fate::Ignored)]
            } else if roll < mix.poison {
                vec![Draft::plain(Some(POISON_TYPE), Fate::Dead)]
            } else if roll < mix.poison + mix.unrouted {
                let event_type = *UNROUTED_TYPES.choose(&mut rng).unwrap_or(&"unrouted.ping");
                vec![Draft::plain(Some(event_type), Fate::Ignored)]
            } else if provider.ordering.is_some() {
                // Versions of one object, its key: their copies are shuffled like all others,
                // so a later version often arrives first and an earlier one comes stale.
                let object = format!("order_{run_id}_{}", events.len());
                let size = rng
                    .random_range(2..=MAX_EVENTS_PER_KEY)
                    .min(count - events.len());
                (1..=size as i64)
                    .map(|sequence| Draft {
                        event_type: Some(if sequence == 1 {
                            "order.created"
                        } else {
                            "order.updated"
                        }),
                        object: Some(object.clone()),
                        amount: None,
                        sequence: Some(sequence),
                        fate: Fate::Effect,
                    })
                    .collect()
            } else if roll < mix.poison + mix.unrouted + mix.payments && events.len() + 2 <= count {
                // Two events about one payment; their copies are shuffled like all others, so
                // the refund often arrives before the success it refunds.
                let payment = format!("pay_{run_id}_{}", events.len());
                let amount = rng.random_range(100..100_000);
                ["payment.succeeded", "payment.refunded"]
                    .into_iter()
                    .map(|event_type| Draft {
                        event_type: Some(event_type),
                        object: Some(payment.clone()),
                        amount: Some(amount),
                        sequence: None,
                        fate: Fate::Effect,
                    })
                    .collect()
            } else {
                // Several events about the same order: each is its own event (invariant 5).
                vec![Draft {
                    event_type: Some(*ROUTED_TYPES.choose(&mut rng).unwrap_or(&"order.created")),
                    object: Some(format!("order_{run_id}_{}", rng.random_range(0..objects))),
                    amount: None,
                    sequence: None,
                    fate: Fate::Effect,
                }]
            };
            let one_key = drafts.len() >= 2 && drafts.iter().all(|d| d.sequence.is_some());
            if one_key && rng.random_bool(mix.concurrent) {
                schedule.key_burst = Some(Vec::new());
            }
            for draft in drafts {
                let index = events.len();
                let event =
                    draw_deliveries(provider, draft, index, run_id, mix, &mut rng, &mut schedule)
                        .map_err(|reason| PlanError::Unsupported {
                        provider: provider.name.clone(),
                        reason,
                    })?;
                events.push(event);
            }
            if let Some(mut burst) = schedule.key_burst.take().filter(|b| !b.is_empty()) {
                burst.shuffle(&mut rng);
                schedule.main.push(Job { deliveries: burst });
            }
        }
        add_batch_companions(&mut events, &selected, &mut rng);
        let Schedule {
            mut main, mut late, ..
        } = schedule;
        main.shuffle(&mut rng);
        late.shuffle(&mut rng);
        Ok(Self {
            run_id: run_id.to_owned(),
            seed,
            events,
            main,
            late,
        })
    }

    /// Deliveries planned (each sent at least once; retries are extra attempts).
    pub fn deliveries(&self) -> usize {
        self.main
            .iter()
            .chain(&self.late)
            .map(|job| job.deliveries.len())
            .sum()
    }
}

/// Dresses `draft` as event number `index` of `provider` and plans its deliveries.
fn draw_deliveries(
    provider: &Provider,
    draft: Draft,
    index: usize,
    run_id: &str,
    mix: &Mix,
    rng: &mut StdRng,
    schedule: &mut Schedule,
) -> Result<PlannedEvent, String> {
    let planned_id = format!("{}{run_id}-{index:07}", wire::id_prefix(provider));
    let mut data = serde_json::json!({ "sequence": index });
    if let Some(object) = &draft.object {
        let key = if draft.amount.is_some() {
            "payment_id"
        } else {
            "order_id"
        };
        data[key] = serde_json::Value::from(object.clone());
    }
    if let Some(amount) = draft.amount {
        data["amount"] = serde_json::Value::from(amount);
    }
    let ordering = draft
        .object
        .as_deref()
        .zip(draft.sequence)
        .map(|(key, sequence)| wire::EventOrder { key, sequence });
    let (body, headers, event_id) =
        wire::compose(provider, &planned_id, draft.event_type, data, ordering)?;
    let Schedule {
        main,
        late,
        key_burst,
    } = schedule;

    let forgeable = !provider.unsigned;
    let stale_kind = if provider.scheme.tolerance().is_some() {
        DeliveryKind::StaleTimestamp
    } else {
        DeliveryKind::BadSignature
    };
    let single = |kind| Job {
        deliveries: vec![Delivery { event: index, kind }],
    };

    let mut fate = draft.fate;
    let mut copies = 0;
    let mut forged = 0;
    if forgeable && rng.random_bool(mix.forged_only) {
        fate = Fate::Rejected;
        for _ in 0..rng.random_range(1..=2) {
            let kind = if rng.random_bool(0.5) {
                DeliveryKind::BadSignature
            } else {
                stale_kind
            };
            main.push(single(kind));
            forged += 1;
        }
    } else {
        copies = rng.random_range(mix.min_copies..=mix.max_copies);
        let mut remaining = copies;
        if let Some(burst) = key_burst.as_mut() {
            burst.push(Delivery {
                event: index,
                kind: DeliveryKind::Genuine,
            });
            remaining -= 1;
        }
        if remaining >= 2 && rng.random_bool(mix.late) {
            late.push(single(DeliveryKind::Genuine));
            remaining -= 1;
        }
        if remaining >= 2 && rng.random_bool(mix.concurrent) {
            let burst = rng.random_range(2..=remaining);
            main.push(Job {
                deliveries: vec![
                    Delivery {
                        event: index,
                        kind: DeliveryKind::Genuine,
                    };
                    burst as usize
                ],
            });
            remaining -= burst;
        }
        for _ in 0..remaining {
            main.push(single(DeliveryKind::Genuine));
        }
        if forgeable && rng.random_bool(mix.bad_signature) {
            main.push(single(DeliveryKind::BadSignature));
            forged += 1;
        }
        if forgeable && rng.random_bool(mix.stale) {
            main.push(single(stale_kind));
            forged += 1;
        }
    }
    Ok(PlannedEvent {
        provider: provider.name.clone(),
        event_id,
        event_type: draft.event_type.map(str::to_owned),
        object: draft.object,
        amount: draft.amount,
        sequence: draft.sequence,
        fate,
        copies,
        forged,
        body,
        headers,
        batch_with: Vec::new(),
    })
}

/// Gives each genuine event of a batch provider up to two companions of the same provider,
/// so that requests carry several events. Forged-only events are never companions: they must
/// never enter the inbox.
fn add_batch_companions(events: &mut [PlannedEvent], selected: &[&Provider], rng: &mut StdRng) {
    for provider in selected {
        if !matches!(provider.identity, receiver::providers::Identity::Batch(_)) {
            continue;
        }
        let genuine: Vec<usize> = events
            .iter()
            .enumerate()
            .filter(|(_, e)| e.provider == provider.name && e.fate != Fate::Rejected)
            .map(|(index, _)| index)
            .collect();
        if genuine.len() < 2 {
            continue;
        }
        for &index in &genuine {
            let companions: Vec<usize> = (0..rng.random_range(0..=2))
                .map(|_| genuine[rng.random_range(0..genuine.len())])
                .filter(|&other| other != index)
                .collect();
            events[index].batch_with = companions;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::path::Path;

    const PROVIDERS: &str = r#"
        [providers.stripe]
        scheme = "stripe"
        secrets = [{ env = "WHSEC" }]
        [providers.github]
        scheme = "github"
        secrets = [{ env = "SECRET" }]
        [providers.svix]
        scheme = "standard-webhooks"
        secrets = [{ env = "WHSEC" }]
        [providers.shopify]
        scheme = "shopify"
        secrets = [{ env = "SECRET" }]
        [providers.slack]
        scheme = "slack"
        secrets = [{ env = "SECRET" }]
        [providers.acme]
        scheme = "hmac-sha256"
        signature_header = "X-Acme-Signature"
        event_id = { json_pointer = "/meta/id" }
        event_type = { header = "X-Acme-Type" }
        secrets = [{ env = "SECRET" }]
    "#;

    fn providers() -> Providers {
        Providers::parse(PROVIDERS, Path::new("providers.toml"), &|var| match var {
            "WHSEC" => Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()),
            _ => Some("plain-secret".to_owned()),
        })
        .expect("valid providers")
    }

    fn plan(seed: u64, run_id: &str, count: usize) -> Plan {
        Plan::new(&providers(), &[], &Mix::default(), count, seed, run_id).expect("plan")
    }

    #[test]
    fn the_same_seed_draws_the_same_plan_and_another_seed_another() {
        let a = plan(7, "run", 500);
        let b = plan(7, "run", 500);
        let c = plan(8, "run", 500);
        let ids = |p: &Plan| {
            p.events
                .iter()
                .map(|e| (e.provider.clone(), e.event_type.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&a), ids(&b));
        assert_eq!(a.main, b.main);
        assert_ne!(ids(&a), ids(&c));
    }

    #[test]
    fn event_ids_are_unique_and_carry_the_run_id() {
        let plan = plan(1, "abc123", 2_000);
        assert_eq!(plan.events.len(), 2_000);
        let ids: HashSet<&str> = plan.events.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids.len(), 2_000);
        assert!(plan.events.iter().all(|e| e.event_id.contains("abc123")));
    }

    #[test]
    fn every_kind_of_trouble_is_in_the_default_mix() {
        let plan = plan(3, "r", 3_000);
        let fates: HashSet<Fate> = plan.events.iter().map(|e| e.fate).collect();
        for fate in [Fate::Effect, Fate::Ignored, Fate::Dead, Fate::Rejected] {
            assert!(fates.contains(&fate), "no {fate:?} event");
        }
        let kinds: HashSet<DeliveryKind> = plan
            .main
            .iter()
            .flat_map(|job| job.deliveries.iter().map(|d| d.kind))
            .collect();
        assert_eq!(kinds.len(), 3, "{kinds:?}");
        assert!(
            plan.main.iter().any(|job| job.deliveries.len() >= 2),
            "no burst"
        );
        assert!(!plan.late.is_empty(), "no late copies");
        for event in &plan.events {
            let genuine = plan
                .main
                .iter()
                .chain(&plan.late)
                .flat_map(|job| &job.deliveries)
                .filter(|d| plan.events[d.event].event_id == event.event_id && d.kind.is_genuine())
                .count();
            assert_eq!(genuine, event.copies as usize);
            if event.fate == Fate::Rejected {
                assert_eq!(event.copies, 0);
                assert!(event.forged >= 1);
            } else {
                assert!((2..=5).contains(&event.copies), "{event:?}");
            }
        }
    }

    #[test]
    fn payments_come_in_pairs_about_one_payment() {
        let plan = plan(5, "r", 1_000);
        let succeeded: Vec<&PlannedEvent> = plan
            .events
            .iter()
            .filter(|e| e.event_type.as_deref() == Some("payment.succeeded"))
            .collect();
        assert!(!succeeded.is_empty());
        for event in succeeded {
            let refund = plan.events.iter().find(|other| {
                other.object == event.object
                    && other.event_type.as_deref() == Some("payment.refunded")
            });
            assert_eq!(refund.and_then(|r| r.amount), event.amount);
        }
    }

    #[test]
    fn an_ordered_providers_events_come_as_versions_of_one_key_some_sent_together() {
        let providers = Providers::parse(
            "[providers.ordered]\nscheme = \"hmac-sha256\"\nsignature_header = \"X-Signature\"\n\
             event_id = { json_pointer = \"/id\" }\nevent_type = { json_pointer = \"/type\" }\n\
             secrets = [{ env = \"SECRET\" }]\n\
             [providers.ordered.ordering]\nkey = { json_pointer = \"/data/order_id\" }\n\
             sequence = { json_pointer = \"/data/version\" }\n\
             [providers.github]\nscheme = \"github\"\nsecrets = [{ env = \"SECRET\" }]\n",
            Path::new("providers.toml"),
            &|_| Some("plain-secret".to_owned()),
        )
        .expect("valid providers");
        let plan = Plan::new(&providers, &[], &Mix::default(), 2_000, 9, "r").expect("plan");
        let mut keys: std::collections::BTreeMap<&str, Vec<(usize, i64)>> = Default::default();
        for (index, event) in plan.events.iter().enumerate() {
            match (event.provider.as_str(), event.sequence) {
                ("ordered", Some(sequence)) => {
                    let object = event.object.as_deref().expect("a key");
                    keys.entry(object).or_default().push((index, sequence));
                    assert!(
                        matches!(event.fate, Fate::Effect | Fate::Rejected),
                        "{event:?}"
                    );
                }
                // Poison and unrouted events carry no key: a dead head would block it.
                ("ordered", None) => assert_ne!(event.fate, Fate::Effect, "{event:?}"),
                (_, sequence) => assert_eq!(sequence, None, "{event:?}"),
            }
        }
        assert!(keys.len() > 100, "only {} keys", keys.len());
        for (key, events) in &keys {
            let sequences: Vec<i64> = events.iter().map(|(_, sequence)| *sequence).collect();
            let expected: Vec<i64> = (1..=events.len() as i64).collect();
            assert_eq!(
                sequences, expected,
                "key {key}: versions 1, 2, ... in plan order"
            );
            assert!((1..=MAX_EVENTS_PER_KEY).contains(&events.len()));
        }
        assert!(keys.values().filter(|events| events.len() >= 2).count() > 100);
        // Some keys' versions are sent at one instant, in any order.
        let together = plan
            .main
            .iter()
            .filter(|job| {
                let events: HashSet<usize> = job.deliveries.iter().map(|d| d.event).collect();
                events.len() >= 2
            })
            .count();
        assert!(
            together > 10,
            "only {together} bursts across one key's events"
        );
        assert!(plan
            .late
            .iter()
            .any(|job| plan.events[job.deliveries[0].event].sequence.is_some()));
    }

    #[test]
    fn inconsistent_mixes_and_unknown_providers_are_refused() {
        let mix = Mix {
            min_copies: 3,
            max_copies: 2,
            ..Mix::default()
        };
        let err = Plan::new(&providers(), &[], &mix, 10, 1, "r").expect_err("bad copies");
        assert!(err.to_string().contains("copies"), "{err}");
        let mix = Mix {
            unrouted: 0.6,
            poison: 0.6,
            ..Mix::default()
        };
        assert!(Plan::new(&providers(), &[], &mix, 10, 1, "r").is_err());
        let err = Plan::new(&providers(), &["nope".into()], &Mix::default(), 10, 1, "r")
            .expect_err("unknown provider");
        assert!(err.to_string().contains("nope"), "{err}");
    }
}
