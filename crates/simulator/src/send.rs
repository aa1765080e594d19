//! The sender: sends a [`Plan`]'s deliveries with bounded concurrency (and an optional rate),
//! retries like a provider, and tallies every answer into a [`Report`].
//!
//! Each delivery is its own little provider: it is re-signed at every attempt (fresh
//! timestamp, any configured secret), sent to the next target in turn (a load balancer in
//! front of several receivers), and retried after any non-2xx answer or none at all, with
//! exponential backoff and full jitter, until its attempts or its time run out. A waiting
//! retry holds no concurrency slot. Forged deliveries are only retried until they get an
//! answer: the receiver's verdict on them is what is recorded.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use inbox_core::backoff::RetryDecision;
use inbox_core::BackoffPolicy;
use receiver::providers::Providers;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::plan::{Delivery, Job, Plan};
use crate::report::{EventRecord, Report, Totals};
use crate::{wire, SimError};

/// How a provider retries a delivery that was not acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Delays and the attempt budget (the worker's backoff type: full jitter, capped).
    pub backoff: BackoffPolicy,
    /// No retry starts later than this after the delivery's first attempt.
    pub give_up_after: Duration,
}

impl RetryPolicy {
    /// Default: 100 ms doubling up to 5 s, at most 50 attempts within 5 minutes.
    pub const DEFAULT: Self = Self {
        backoff: BackoffPolicy {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(5),
            max_attempts: 50,
        },
        give_up_after: Duration::from_secs(300),
    };
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Where and how deliveries are sent.
#[derive(Debug, Clone)]
pub struct SendSettings {
    /// Receiver base URLs (`http://host:port`), used in turn.
    pub targets: Vec<reqwest::Url>,
    /// Most requests in flight at once.
    pub concurrency: usize,
    /// Most new deliveries started per second (retries not counted); unlimited when `None`.
    pub rate: Option<f64>,
    /// Pause between the last main delivery and the first late copy.
    pub late_delay: Duration,
    /// Retries of unacknowledged deliveries.
    pub retry: RetryPolicy,
    /// Longest wait for one answer.
    pub request_timeout: Duration,
}

impl SendSettings {
    /// Defaults: 32 requests in flight, no rate limit, late copies 1 s after the rest,
    /// [`RetryPolicy::DEFAULT`], 10 s per request.
    pub fn new(targets: Vec<reqwest::Url>) -> Self {
        Self {
            targets,
            concurrency: 32,
            rate: None,
            late_delay: Duration::from_secs(1),
            retry: RetryPolicy::DEFAULT,
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// Live counters of a run, readable while it goes.
#[derive(Debug, Default)]
pub struct Progress {
    /// Deliveries started (first attempts).
    pub started: AtomicU64,
    /// HTTP requests made, retries included.
    pub requests: AtomicU64,
    /// Genuine events acknowledged so far.
    pub acked_events: AtomicU64,
    /// Deliveries waiting for their next retry right now.
    pub retrying: AtomicU64,
}

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Accepted,
    Duplicate,
    /// A 2xx without the inbox's status body.
    OtherSuccess(u16),
    /// A non-2xx status.
    Status(u16),
    /// No answer: refused, reset, timed out.
    Silence,
}

impl Answer {
    fn is_success(self) -> bool {
        matches!(
            self,
            Self::Accepted | Self::Duplicate | Self::OtherSuccess(_)
        )
    }

    fn status(self) -> u16 {
        match self {
            Self::Accepted | Self::Duplicate => 200,
            Self::OtherSuccess(status) | Self::Status(status) => status,
            Self::Silence => 0,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct EventTally {
    acked: bool,
    requests: u32,
    accepted: u32,
    duplicates: u32,
}

#[derive(Debug, Default)]
struct Tally {
    events: Vec<EventTally>,
    totals: Totals,
}

#[derive(Debug)]
struct Sender {
    providers: Arc<Providers>,
    plan: Arc<Plan>,
    client: reqwest::Client,
    targets: Vec<String>,
    next_target: AtomicUsize,
    permits: Arc<Semaphore>,
    retry: RetryPolicy,
    tally: Mutex<Tally>,
    progress: Arc<Progress>,
}

/// Sends every delivery of `plan` and returns the report.
pub async fn send(
    providers: Arc<Providers>,
    plan: Arc<Plan>,
    settings: &SendSettings,
    progress: Arc<Progress>,
) -> Result<Report, SimError> {
    if settings.targets.is_empty() {
        return Err(SimError::Send("no target URL".into()));
    }
    for event in &plan.events {
        if providers.get(&event.provider).is_none() {
            return Err(SimError::Send(format!(
                "provider {:?} of the plan is not configured",
                event.provider
            )));
        }
    }
    let concurrency = settings.concurrency.max(1);
    let client = reqwest::Client::builder()
        .timeout(settings.request_timeout)
        .connect_timeout(settings.request_timeout.min(Duration::from_secs(2)))
        .pool_max_idle_per_host(concurrency)
        .build()
        .map_err(|err| SimError::Send(format!("HTTP client: {err}")))?;
    let sender = Arc::new(Sender {
        providers,
        targets: settings
            .targets
            .iter()
            .map(|url| url.as_str().trim_end_matches('/').to_owned())
            .collect(),
        next_target: AtomicUsize::new(0),
        permits: Arc::new(Semaphore::new(concurrency)),
        retry: settings.retry,
        tally: Mutex::new(Tally {
            events: vec![EventTally::default(); plan.events.len()],
            totals: Totals::default(),
        }),
        progress,
        client,
        plan: Arc::clone(&plan),
    });

    let started = Instant::now();
    sender.handshakes().await;
    let mut running = JoinSet::new();
    dispatch(&sender, &plan.main, settings.rate, &mut running).await;
    if !plan.late.is_empty() {
        tokio::time::sleep(settings.late_delay).await;
        dispatch(&sender, &plan.late, settings.rate, &mut running).await;
    }
    while let Some(finished) = running.join_next().await {
        propagate_panic(finished);
    }
    Ok(sender.report(started.elapsed(), settings))
}

/// Starts `jobs` in order, at most `rate` deliveries per second, each as soon as a
/// concurrency slot is free.
async fn dispatch(
    sender: &Arc<Sender>,
    jobs: &[Job],
    rate: Option<f64>,
    running: &mut JoinSet<()>,
) {
    let start = tokio::time::Instant::now();
    let mut started: u64 = 0;
    for job in jobs {
        if let Some(rate) = rate.filter(|rate| *rate > 0.0) {
            let due = start + Duration::from_secs_f64(started as f64 / rate);
            tokio::time::sleep_until(due).await;
        }
        // A burst's copies each take a slot and start together, as soon as they have one.
        for delivery in &job.deliveries {
            let Ok(permit) = Arc::clone(&sender.permits).acquire_owned().await else {
                return;
            };
            let this = Arc::clone(sender);
            let delivery = *delivery;
            running.spawn(async move { this.deliver(delivery, permit).await });
            started += 1;
            sender.progress.started.fetch_add(1, Ordering::Relaxed);
        }
        while let Some(finished) = running.try_join_next() {
            propagate_panic(finished);
        }
    }
}

fn propagate_panic(finished: Result<(), tokio::task::JoinError>) {
    if let Err(err) = finished {
        if err.is_panic() {
            std::panic::resume_unwind(err.into_panic());
        }
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |now| i64::try_from(now.as_secs()).unwrap_or(i64::MAX))
}

impl Sender {
    /// One delivery, from its first attempt until it is settled or given up.
    async fn deliver(&self, delivery: Delivery, first_permit: tokio::sync::OwnedSemaphorePermit) {
        let first_attempt = Instant::now();
        let mut permit = Some(first_permit);
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let answer = self.attempt(delivery).await;
            drop(permit.take());
            self.record(delivery, answer);
            let settled = if delivery.kind.is_genuine() {
                answer.is_success()
            } else {
                // A forged delivery is settled by any verdict; only silence or a 5xx is retried.
                matches!(answer, Answer::Status(status) if status < 500) || answer.is_success()
            };
            if settled {
                return;
            }
            let delay = match self.retry.backoff.decide(attempt) {
                RetryDecision::RetryAfter(delay)
                    if first_attempt.elapsed() + delay <= self.retry.give_up_after =>
                {
                    delay
                }
                _ => {
                    self.lock().totals.gave_up += 1;
                    return;
                }
            };
            self.progress.retrying.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(delay).await;
            self.progress.retrying.fetch_sub(1, Ordering::Relaxed);
            match Arc::clone(&self.permits).acquire_owned().await {
                Ok(next) => permit = Some(next),
                Err(_) => return,
            }
        }
    }

    /// Performs the handshake of every provider of the plan that has one, as providers do when
    /// an endpoint is registered, and counts whether each was answered as expected. A few
    /// attempts each: a receiver may be restarting.
    async fn handshakes(&self) {
        let mut names: Vec<&str> = self
            .plan
            .events
            .iter()
            .map(|e| e.provider.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            let Some(provider) = self.providers.get(name) else {
                continue;
            };
            let url = format!("{}/webhooks/{name}", self.targets[0]);
            let Some(handshake) = wire::handshake(provider, unix_now(), &url) else {
                continue;
            };
            let mut answered = false;
            for attempt in 0..5_u32 {
                if attempt > 0 {
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
                if self.handshake_once(&url, &handshake).await {
                    answered = true;
                    break;
                }
            }
            let mut tally = self.lock();
            if answered {
                tally.totals.handshakes += 1;
            } else {
                tally.totals.handshakes_failed += 1;
            }
        }
    }

    async fn handshake_once(&self, url: &str, handshake: &wire::Handshake) -> bool {
        let url = if handshake.query.is_empty() {
            url.to_owned()
        } else {
            format!("{url}?{}", handshake.query)
        };
        let mut request = if handshake.method == "GET" {
            self.client.get(url)
        } else {
            self.client.post(url).body(handshake.body.clone())
        };
        for (name, value) in &handshake.headers {
            request = request.header(name, value);
        }
        let Ok(response) = request.send().await else {
            return false;
        };
        let ok = response.status().is_success();
        let body = response.bytes().await.unwrap_or_default();
        ok && String::from_utf8_lossy(&body).contains(&handshake.expect)
    }

    /// One HTTP request for `delivery`, signed now, to the next target.
    async fn attempt(&self, delivery: Delivery) -> Answer {
        let event = &self.plan.events[delivery.event];
        let Some(provider) = self.providers.get(&event.provider) else {
            return Answer::Silence;
        };
        let target =
            &self.targets[self.next_target.fetch_add(1, Ordering::Relaxed) % self.targets.len()];
        let url = format!("{target}/webhooks/{}", event.provider);
        let key_pick = rand::random::<u32>() as usize;
        let companions: Vec<&crate::plan::PlannedEvent> = event
            .batch_with
            .iter()
            .filter_map(|&index| self.plan.events.get(index))
            .collect();
        let (headers, body) = wire::request(
            provider,
            event,
            &companions,
            delivery.kind,
            key_pick,
            unix_now(),
            &url,
        );
        let mut request = self.client.post(url).body(body);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        self.progress.requests.fetch_add(1, Ordering::Relaxed);
        let Ok(response) = request.send().await else {
            return Answer::Silence;
        };
        let status = response.status();
        if !status.is_success() {
            return Answer::Status(status.as_u16());
        }
        // The status line is the acknowledgement; the body says which kind.
        let body = response.bytes().await.unwrap_or_default();
        let said = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|json| {
                json.get("status")
                    .and_then(|s| s.as_str())
                    .map(str::to_owned)
            });
        // A batch's status speaks for all its items together, not for this event alone.
        match said.as_deref() {
            Some("accepted") if companions.is_empty() => Answer::Accepted,
            Some("duplicate") if companions.is_empty() => Answer::Duplicate,
            _ => Answer::OtherSuccess(status.as_u16()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, delivery: Delivery, answer: Answer) {
        let mut guard = self.lock();
        let tally = &mut *guard;
        let totals = &mut tally.totals;
        let event = &mut tally.events[delivery.event];
        totals.requests += 1;
        *totals.by_status.entry(answer.status()).or_default() += 1;
        event.requests += 1;
        match answer {
            Answer::Accepted => event.accepted += 1,
            Answer::Duplicate => event.duplicates += 1,
            _ => {}
        }
        if delivery.kind.is_genuine() {
            match answer {
                Answer::Accepted => totals.accepted += 1,
                Answer::Duplicate => totals.duplicates += 1,
                Answer::OtherSuccess(_) => {}
                Answer::Status(_) => totals.refused += 1,
                Answer::Silence => totals.transport_errors += 1,
            }
            if answer.is_success() && !event.acked {
                event.acked = true;
                self.progress.acked_events.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            match answer {
                Answer::Status(401) => totals.forged_rejected += 1,
                Answer::Silence => totals.transport_errors += 1,
                answer if answer.is_success() => totals.forged_accepted += 1,
                _ => {}
            }
        }
    }

    fn report(&self, elapsed: Duration, settings: &SendSettings) -> Report {
        let tally = self.lock();
        let mut totals = tally.totals.clone();
        let events: Vec<EventRecord> = self
            .plan
            .events
            .iter()
            .zip(&tally.events)
            .map(|(planned, seen)| EventRecord {
                provider: planned.provider.clone(),
                event_id: planned.event_id.clone(),
                event_type: planned.event_type.clone(),
                object: planned.object.clone(),
                amount: planned.amount,
                sequence: planned.sequence,
                expected: planned.fate,
                copies: planned.copies,
                forged: planned.forged,
                acked: seen.acked,
                requests: seen.requests,
                accepted: seen.accepted,
                duplicates: seen.duplicates,
            })
            .collect();
        totals.events = events.len() as u64;
        totals.genuine_events = events.iter().filter(|e| e.copies > 0).count() as u64;
        totals.deliveries = self.plan.deliveries() as u64;
        totals.genuine_deliveries = events.iter().map(|e| u64::from(e.copies)).sum();
        totals.forged_deliveries = events.iter().map(|e| u64::from(e.forged)).sum();
        totals.acked_events = events.iter().filter(|e| e.acked).count() as u64;
        totals.unacked_events = totals.genuine_events - totals.acked_events;
        Report {
            run_id: self.plan.run_id.clone(),
            seed: self.plan.seed,
            targets: settings.targets.iter().map(ToString::to_string).collect(),
            elapsed_ms: u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
            totals,
            events,
        }
    }
}
