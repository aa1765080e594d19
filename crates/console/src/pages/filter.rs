//! The event list's filter as the browser sends it (query string or hidden form fields) and
//! its translation into an [`EventQuery`], with a refusal naming the field that is wrong.

use chrono::{DateTime, Datelike as _, NaiveDateTime, Utc};
use inbox_core::operations::browse::EventQuery;
use inbox_core::InboxStatus;
use maud::{html, Markup};
use serde::Deserialize;

use crate::error::ConsoleError;

/// The filter fields; empty fields mean no condition.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FilterParams {
    /// Provider name.
    #[serde(default)]
    pub provider: String,
    /// Event type.
    #[serde(default, rename = "type")]
    pub event_type: String,
    /// ready, processing, done or dead.
    #[serde(default)]
    pub state: String,
    /// Received at or after (RFC 3339, or `YYYY-MM-DDTHH:MM` in UTC).
    #[serde(default)]
    pub since: String,
    /// Received before.
    #[serde(default)]
    pub until: String,
    /// The provider's event id.
    #[serde(default)]
    pub event_id: String,
    /// A JSON value the body must contain (`@>`).
    #[serde(default)]
    pub body: String,
}

fn non_empty(value: &str) -> Option<String> {
    let value = value.trim();
    (!value.is_empty()).then(|| value.to_owned())
}

fn parse_time(field: &str, value: &str) -> Result<Option<DateTime<Utc>>, ConsoleError> {
    let Some(value) = non_empty(value) else {
        return Ok(None);
    };
    let parsed = DateTime::parse_from_rfc3339(&value)
        .map(|time| time.with_timezone(&Utc))
        .ok()
        .or_else(|| {
            // What a datetime-local input sends, read as UTC.
            ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"]
                .iter()
                .find_map(|format| NaiveDateTime::parse_from_str(&value, format).ok())
                .map(|time| time.and_utc())
        });
    match parsed {
        // Signed and five-digit years parse, but PostgreSQL's timestamps stop at 4713 BC.
        Some(time) if (1..=9999).contains(&time.year()) => Ok(Some(time)),
        Some(_) => Err(ConsoleError::BadRequest(format!(
            "{field}: the year must be between 1 and 9999"
        ))),
        None => Err(ConsoleError::BadRequest(format!(
            "{field}: not a time (use 2026-12-01T10:00 for UTC, or RFC 3339)"
        ))),
    }
}

impl FilterParams {
    /// The query these fields describe.
    pub fn to_query(&self) -> Result<EventQuery, ConsoleError> {
        let status = match non_empty(&self.state) {
            None => None,
            Some(state) => Some(state.parse::<InboxStatus>().map_err(|_| {
                ConsoleError::BadRequest("state: use ready, processing, done or dead".to_owned())
            })?),
        };
        let body_contains = match non_empty(&self.body) {
            None => None,
            Some(body) => Some(
                serde_json::from_str(&body)
                    .map_err(|err| ConsoleError::BadRequest(format!("body: not JSON ({err})")))?,
            ),
        };
        Ok(EventQuery {
            provider: non_empty(&self.provider),
            event_type: non_empty(&self.event_type),
            status,
            received_since: parse_time("since", &self.since)?,
            received_until: parse_time("until", &self.until)?,
            event_id: non_empty(&self.event_id),
            body_contains,
        })
    }

    /// The fields as a query string (for links to the next page or the replay estimate).
    pub fn query_string(&self) -> String {
        let mut serializer = form_urlencoded::Serializer::new(String::new());
        for (name, value) in self.fields() {
            if !value.trim().is_empty() {
                serializer.append_pair(name, value);
            }
        }
        serializer.finish()
    }

    /// The fields as hidden inputs (to carry the filter through a confirmation form).
    pub fn hidden_fields(&self) -> Markup {
        html! {
            @for (name, value) in self.fields() {
                input type="hidden" name=(name) value=(value);
            }
        }
    }

    /// The filter as JSON, for the audit (only the fields set).
    pub fn to_audit_json(&self) -> serde_json::Value {
        let fields: serde_json::Map<String, serde_json::Value> = self
            .fields()
            .into_iter()
            .filter(|(_, value)| !value.trim().is_empty())
            .map(|(name, value)| (name.to_owned(), serde_json::Value::from(value.trim())))
            .collect();
        serde_json::Value::Object(fields)
    }

    fn fields(&self) -> [(&'static str, &str); 7] {
        [
            ("provider", &self.provider),
            ("type", &self.event_type),
            ("state", &self.state),
            ("since", &self.since),
            ("until", &self.until),
            ("event_id", &self.event_id),
            ("body", &self.body),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filled_fields_become_conditions_and_bad_ones_name_their_field() {
        let params = FilterParams {
            provider: " stripe ".into(),
            state: "dead".into(),
            since: "2026-12-01T10:00".into(),
            body: r#"{"data": {"amount": 5}}"#.into(),
            ..FilterParams::default()
        };
        let query = params.to_query().expect("valid");
        assert_eq!(query.provider.as_deref(), Some("stripe"));
        assert_eq!(query.status, Some(InboxStatus::Dead));
        assert_eq!(
            query.received_since.map(|t| t.to_rfc3339()),
            Some("2026-12-01T10:00:00+00:00".to_owned())
        );
        assert_eq!(
            query.body_contains,
            Some(serde_json::json!({"data": {"amount": 5}}))
        );
        assert_eq!(query.event_type, None);
        assert_eq!(params.query_string(), "provider=+stripe+&state=dead&since=2026-12-01T10%3A00&body=%7B%22data%22%3A+%7B%22amount%22%3A+5%7D%7D");

        for (params, field) in [
            (
                FilterParams {
                    state: "lost".into(),
                    ..FilterParams::default()
                },
                "state",
            ),
            (
                FilterParams {
                    body: "{nope".into(),
                    ..FilterParams::default()
                },
                "body",
            ),
            (
                FilterParams {
                    until: "yesterday".into(),
                    ..FilterParams::default()
                },
                "until",
            ),
            // A year PostgreSQL's timestamps cannot hold: refused here, not by the database.
            (
                FilterParams {
                    since: "-10000-01-01T00:00".into(),
                    ..FilterParams::default()
                },
                "since",
            ),
            (
                FilterParams {
                    until: "+20000-01-01T00:00:00Z".into(),
                    ..FilterParams::default()
                },
                "until",
            ),
        ] {
            let err = params.to_query().expect_err("invalid");
            assert!(err.to_string().starts_with(field), "{err}");
        }
    }
}
