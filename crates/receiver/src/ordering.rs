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
use serde_json::value::RawValue;

use crate::json_field::{scalar_at, RepeatedMember};
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
    /// has no key: it is then processed unordered. Values are read from the body's raw text
    /// as its id is ([`scalar_at`]): a numeric key keeps every digit, and a member the body
    /// names twice on the key's or the sequence's path is an error, not one of its values.
    pub fn of_event(
        &self,
        provider: &str,
        headers: &dyn HeaderSource,
        body: &[u8],
    ) -> Result<Option<EventOrdering>, RepeatedMember> {
        let json = serde_json::from_slice::<&RawValue>(body).ok();
        let Some(key) = read(&self.key, headers, json)? else {
            return Ok(None);
        };
        if key.is_empty() {
            return Ok(None);
        }
        let key: String = key.chars().take(MAX_KEY_CHARS).collect();
        let sequence = match &self.sequence {
            Some(source) => read(source, headers, json)?.and_then(|text| as_sequence(&text)),
            None => None,
        };
        Ok(Some(EventOrdering {
            key: ordering_key(provider, &key),
            sequence: sequence.unwrap_or(0),
            hold: self.reorder_window,
        }))
    }
}

/// The text of a header, or of a scalar of the body (a string's text, a number's spelling).
fn read(
    source: &FieldSource,
    headers: &dyn HeaderSource,
    json: Option<&RawValue>,
) -> Result<Option<String>, RepeatedMember> {
    match (source, json) {
        (FieldSource::Header(name), _) => Ok(headers.header(name).map(str::to_owned)),
        (FieldSource::JsonPointer(pointer), Some(json)) => scalar_at(json, pointer),
        _ => Ok(None),
    }
}

/// An integer (a version, a Unix time), as a number or a decimal string, or an RFC 3339 time
/// (as microseconds since the epoch).
fn as_sequence(text: &str) -> Option<i64> {
    let text = text.trim();
    text.parse::<i64>().ok().or_else(|| {
        chrono::DateTime::parse_from_rfc3339(text)
            .ok()
            .map(|time| time.timestamp_micros())
    })
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
            .unwrap()
            .unwrap();
        assert_eq!(ordering.key, "stripe:pi_1");
        assert_eq!(ordering.sequence, 1_700_000_000);
        assert_eq!(ordering.hold, Duration::from_secs(2));
        assert_eq!(
            from_body.of_event("stripe", &none, br#"{"created": 1}"#),
            Ok(None)
        );

        let from_header =
            spec("key = { header = \"x-entity\" }\nsequence = { header = \"x-version\" }");
        let headers = Headers(HashMap::from([
            ("x-entity", "order-9"),
            ("x-version", "2024-01-01T00:00:01Z"),
        ]));
        let ordering = from_header
            .of_event("shop", &headers, b"not json")
            .unwrap()
            .unwrap();
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
                .unwrap()
                .sequence,
            0
        );
        assert_eq!(
            ordering
                .of_event("p", &none, br#"{"id": 7, "v": "12"}"#)
                .unwrap()
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

    #[test]
    fn a_numeric_key_keeps_every_digit_and_a_repeated_member_is_refused() {
        let ordering =
            spec("key = { json_pointer = \"/id\" }\nsequence = { json_pointer = \"/v\" }");
        let none = Headers(HashMap::new());
        let key_of = |body: &[u8]| ordering.of_event("p", &none, body).unwrap().unwrap().key;
        assert_eq!(
            key_of(br#"{"id": 8262010272424615981079}"#),
            "p:8262010272424615981079"
        );
        assert_ne!(
            key_of(br#"{"id": 8262010272424615981079}"#),
            key_of(br#"{"id": 8262010272424615981080}"#)
        );
        assert_eq!(key_of(br#"{"id": "o\u0031"}"#), "p:o1");
        assert_eq!(
            ordering.of_event("p", &none, br#"{"id": 1, "id": 2}"#),
            Err(RepeatedMember("id".into()))
        );
        assert_eq!(
            ordering.of_event("p", &none, br#"{"id": 1, "v": 1, "v": 2}"#),
            Err(RepeatedMember("v".into()))
        );
    }
}
