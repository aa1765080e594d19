//! Ordered providers: where an event's ordering key and sequence are found, how long its
//! reorder window holds it, and what its worker does with late arrivals and dead heads.
//!
//! ```toml
//! [providers.stripe.ordering]
//! key = { json_pointer = "/data/object/id" }   # or { header = "..." }
//! sequence = { json_pointer = "/created" }     # optional: an integer or an RFC 3339 time
//! reorder_window = "2s"                        # optional: hold each event this long
//! on_stale = "mark"                            # or "skip": complete late arrivals unhandled
//! on_dead = "block"                            # or "release": a dead head frees its key
//! ```

use std::time::Duration;

use diesel::sql_types::{Array, Bool, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_core::inbox::{ordering_key, EventOrdering};
use inbox_signature::HeaderSource;
use serde::Deserialize;
use serde_json::Value;

use crate::providers::{FieldSource, Providers};

/// Longest ordering value kept; a longer one is cut (keys are compared, not displayed).
pub const MAX_KEY_CHARS: usize = 255;

/// What a late arrival (lower sequence than an event of its key already done) becomes.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnStale {
    /// Handed to its handler with `Event::stale` set.
    #[default]
    Mark,
    /// Completed without its handler (counted as skipped).
    Skip,
}

/// What a dead head does to its key.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnDead {
    /// The key stays blocked until an operator replays or skips the dead event.
    #[default]
    Block,
    /// The key's next event runs.
    Release,
}

/// A provider's `[ordering]` table.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct OrderingSpec {
    /// Where the key is.
    pub key: FieldSource,
    /// Where the sequence is; without it, arrival order decides.
    pub sequence: Option<FieldSource>,
    /// How long each event waits after receipt before it may be claimed.
    #[serde(default, with = "humantime_serde")]
    pub reorder_window: Duration,
    /// Late arrivals: marked or skipped.
    #[serde(default)]
    pub on_stale: OnStale,
    /// Dead heads: block or release their key.
    #[serde(default)]
    pub on_dead: OnDead,
}

mod humantime_serde {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

impl OrderingSpec {
    /// Checks the sources: JSON pointers or headers only.
    pub fn validate(&self) -> Result<(), String> {
        for source in std::iter::once(&self.key).chain(&self.sequence) {
            match source {
                FieldSource::JsonPointer(pointer) if pointer.starts_with('/') => {}
                FieldSource::Header(name) if !name.is_empty() => {}
                _ => {
                    return Err(
                        "ordering `key` and `sequence` are { json_pointer = \"/...\" } or { header = \"...\" }"
                            .into(),
                    )
                }
            }
        }
        if self.reorder_window > Duration::from_secs(3600) {
            return Err("ordering `reorder_window` is at most 1h".into());
        }
        Ok(())
    }

    /// The ordering of one event of `provider` (its body `body`), or `None` when the event
    /// has no key: it is then processed unordered.
    pub fn of_event(
        &self,
        provider: &str,
        headers: &dyn HeaderSource,
        body: &[u8],
    ) -> Option<EventOrdering> {
        let json: Option<Value> = serde_json::from_slice(body).ok();
        let key = read(&self.key, headers, json.as_ref())?;
        let key = key.as_text()?;
        if key.is_empty() {
            return None;
        }
        let key: String = key.chars().take(MAX_KEY_CHARS).collect();
        let sequence = self
            .sequence
            .as_ref()
            .and_then(|source| read(source, headers, json.as_ref()))
            .and_then(|value| value.as_sequence())
            .unwrap_or(0);
        Some(EventOrdering {
            key: ordering_key(provider, &key),
            sequence,
            hold: self.reorder_window,
        })
    }
}

/// A value read from a header or the body.
enum Read {
    Header(String),
    Json(Value),
}

fn read(source: &FieldSource, headers: &dyn HeaderSource, json: Option<&Value>) -> Option<Read> {
    match source {
        FieldSource::Header(name) => headers.header(name).map(|v| Read::Header(v.to_owned())),
        FieldSource::JsonPointer(pointer) => json?.pointer(pointer).cloned().map(Read::Json),
        _ => None,
    }
}

impl Read {
    fn as_text(&self) -> Option<String> {
        match self {
            Self::Header(text) | Self::Json(Value::String(text)) => Some(text.clone()),
            Self::Json(Value::Number(number)) => Some(number.to_string()),
            Self::Json(_) => None,
        }
    }

    /// An integer (a version, a Unix time), as a number or a decimal string, or an RFC 3339
    /// time (as microseconds since the epoch).
    fn as_sequence(&self) -> Option<i64> {
        match self {
            Self::Json(Value::Number(number)) => number.as_i64(),
            Self::Header(text) | Self::Json(Value::String(text)) => {
                text.trim().parse::<i64>().ok().or_else(|| {
                    chrono::DateTime::parse_from_rfc3339(text.trim())
                        .ok()
                        .map(|time| time.timestamp_micros())
                })
            }
            Self::Json(_) => None,
        }
    }
}

/// Records each ordered provider's policies (late arrivals, dead heads) where the workers
/// read them: `inbox_ordering_providers`, one upsert for all. Providers without ordering are
/// left alone (a row there only matters for events stored with a key).
pub async fn record_policies(
    conn: &mut AsyncPgConnection,
    providers: &Providers,
) -> diesel::QueryResult<()> {
    let ordered: Vec<(&str, &OrderingSpec)> = providers
        .iter()
        .filter_map(|p| p.ordering.as_ref().map(|o| (p.name.as_str(), o)))
        .collect();
    if ordered.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = ordered.iter().map(|(name, _)| *name).collect();
    let release: Vec<bool> = ordered
        .iter()
        .map(|(_, o)| o.on_dead == OnDead::Release)
        .collect();
    let skip: Vec<bool> = ordered
        .iter()
        .map(|(_, o)| o.on_stale == OnStale::Skip)
        .collect();
    diesel::sql_query(
        "INSERT INTO inbox_ordering_providers (provider, release_dead, skip_stale) \
         SELECT * FROM unnest($1::text[], $2::bool[], $3::bool[]) \
         ON CONFLICT (provider) DO UPDATE \
         SET release_dead = excluded.release_dead, skip_stale = excluded.skip_stale, \
             updated_at = now()",
    )
    .bind::<Array<Text>, _>(&names)
    .bind::<Array<Bool>, _>(&release)
    .bind::<Array<Bool>, _>(&skip)
    .execute(conn)
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Headers(HashMap<&'static str, &'static str>);

    impl HeaderSource for Headers {
        fn header(&self, name: &str) -> Option<&str> {
            self.0.get(name).copied()
        }
    }

    fn spec(toml_text: &str) -> OrderingSpec {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn key_and_sequence_from_the_body_or_a_header() {
        let from_body = spec(
            "key = { json_pointer = \"/data/object/id\" }\nsequence = { json_pointer = \"/created\" }\nreorder_window = \"2s\"",
        );
        let none = Headers(HashMap::new());
        let ordering = from_body
            .of_event(
                "stripe",
                &none,
                br#"{"created": 1700000000, "data": {"object": {"id": "pi_1"}}}"#,
            )
            .unwrap();
        assert_eq!(ordering.key, "stripe:pi_1");
        assert_eq!(ordering.sequence, 1_700_000_000);
        assert_eq!(ordering.hold, Duration::from_secs(2));
        assert_eq!(
            from_body.of_event("stripe", &none, br#"{"created": 1}"#),
            None
        );

        let from_header =
            spec("key = { header = \"x-entity\" }\nsequence = { header = \"x-version\" }");
        let headers = Headers(HashMap::from([
            ("x-entity", "order-9"),
            ("x-version", "2024-01-01T00:00:01Z"),
        ]));
        let ordering = from_header.of_event("shop", &headers, b"not json").unwrap();
        assert_eq!(ordering.key, "shop:order-9");
        assert_eq!(ordering.sequence, 1_704_067_201_000_000);
        assert_eq!(ordering.hold, Duration::ZERO);
    }

    #[test]
    fn a_missing_or_unreadable_sequence_is_zero_and_policies_default_to_mark_and_block() {
        let ordering =
            spec("key = { json_pointer = \"/id\" }\nsequence = { json_pointer = \"/v\" }");
        let none = Headers(HashMap::new());
        assert_eq!(
            ordering
                .of_event("p", &none, br#"{"id": 7, "v": "soon"}"#)
                .unwrap()
                .sequence,
            0
        );
        assert_eq!(
            ordering
                .of_event("p", &none, br#"{"id": 7, "v": "12"}"#)
                .unwrap()
                .sequence,
            12
        );
        assert_eq!(
            (ordering.on_stale, ordering.on_dead),
            (OnStale::Mark, OnDead::Block)
        );
        assert!(spec("key = { form_field = \"id\" }").validate().is_err());
        assert!(spec("key = { json_pointer = \"id\" }").validate().is_err());
    }
}
