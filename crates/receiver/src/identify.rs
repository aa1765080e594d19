//! Finds a verified request's event id and type, where its provider puts them.
//!
//! The body must be JSON only when the event id comes from it; otherwise it is stored exactly
//! as received, whatever its format (GitHub's form-encoded payloads, Shopify's XML), and a type
//! that would have come from a JSON body is simply absent.

use inbox_signature::{header_names, HeaderSource};
use serde_json::Value;

use crate::providers::{FieldSource, Identity, MAX_EVENT_ID_CHARS};

/// What a verified request turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identified {
    /// An event to store.
    Event {
        /// The provider's event id (the dedup key).
        event_id: String,
        /// The provider's event type, when it gives one.
        event_type: Option<String>,
    },
    /// Slack's `url_verification` handshake: answer with the challenge, store nothing.
    SlackChallenge(String),
}

/// Why a request's event could not be identified (all answered 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentifyError {
    /// The body must be JSON here and is not.
    #[error("body is not valid JSON")]
    InvalidJson,
    /// The body must be form-encoded or JSON here and is neither.
    #[error("body is neither JSON nor form-encoded")]
    InvalidForm,
    /// No event id where the provider puts it.
    #[error("no event id found ({0})")]
    MissingEventId(String),
    /// The event id is empty, too long, or not text.
    #[error("event id {0}")]
    InvalidEventId(&'static str),
}

/// Identifies the event of a request whose signature has been verified.
pub fn identify(
    identity: &Identity,
    headers: &dyn HeaderSource,
    body: &[u8],
) -> Result<Identified, IdentifyError> {
    match identity {
        Identity::Fields {
            event_id,
            event_type,
        } => {
            // The body must be JSON only when the dedup key is in it; a type is informational,
            // so a non-JSON body whose id travels in a header is stored without one.
            let id_in_body = matches!(event_id, FieldSource::JsonPointer(_));
            let type_in_body = matches!(event_type, Some(FieldSource::JsonPointer(_)));
            let json = if id_in_body {
                Some(
                    serde_json::from_slice::<Value>(body)
                        .map_err(|_| IdentifyError::InvalidJson)?,
                )
            } else if type_in_body {
                serde_json::from_slice::<Value>(body).ok()
            } else {
                None
            };
            let id = read_field(event_id, headers, json.as_ref())
                .ok_or_else(|| IdentifyError::MissingEventId(describe(event_id)))?;
            let event_type = event_type
                .as_ref()
                .and_then(|source| read_field(source, headers, json.as_ref()));
            event(id, event_type)
        }
        Identity::Shopify => {
            let id = headers
                .header("x-shopify-event-id")
                .or_else(|| headers.header("x-shopify-webhook-id"))
                .ok_or_else(|| IdentifyError::MissingEventId("header X-Shopify-Event-Id".into()))?;
            let topic = headers.header("x-shopify-topic").map(str::to_owned);
            event(id.to_owned(), topic)
        }
        Identity::StandardWebhooks => {
            // The same preference as the verifier's: the `webhook-*` spelling when present, so
            // the id stored is the id that was signed.
            let id = headers
                .header(header_names::WEBHOOK_ID)
                .or_else(|| headers.header(header_names::SVIX_ID))
                .ok_or_else(|| IdentifyError::MissingEventId("header webhook-id".into()))?;
            let event_type = serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|json| json.get("type").and_then(scalar_text));
            event(id.to_owned(), event_type)
        }
        Identity::Slack { form_id_field } => identify_slack(body, form_id_field),
    }
}

fn identify_slack(body: &[u8], form_id_field: &str) -> Result<Identified, IdentifyError> {
    if let Ok(json) = serde_json::from_slice::<Value>(body) {
        if json.get("type").and_then(Value::as_str) == Some("url_verification") {
            let challenge = json.get("challenge").and_then(Value::as_str).ok_or(
                IdentifyError::MissingEventId("url_verification without challenge".into()),
            )?;
            return Ok(Identified::SlackChallenge(challenge.to_owned()));
        }
        let id = json
            .get("event_id")
            .and_then(scalar_text)
            .ok_or_else(|| IdentifyError::MissingEventId("body field event_id".into()))?;
        let event_type = json
            .pointer("/event/type")
            .or_else(|| json.get("type"))
            .and_then(scalar_text);
        return event(id, event_type);
    }
    // Slash commands and interactivity send application/x-www-form-urlencoded bodies.
    let text = std::str::from_utf8(body).map_err(|_| IdentifyError::InvalidForm)?;
    if text.trim_start().starts_with(['{', '[']) {
        return Err(IdentifyError::InvalidJson);
    }
    let mut id = None;
    let mut command = None;
    let mut payload = None;
    for (key, value) in form_urlencoded::parse(text.as_bytes()) {
        if key == form_id_field {
            id = Some(value.into_owned());
        } else if key == "command" {
            command = Some(value.into_owned());
        } else if key == "payload" {
            payload = Some(value.into_owned());
        }
    }
    if let Some(id) = id {
        return event(id, command);
    }
    // Interactivity (buttons, shortcuts, modals) sends one form field, `payload`, holding JSON
    // that carries the id field and the interaction's type.
    let payload = payload.and_then(|payload| serde_json::from_str::<Value>(&payload).ok());
    let from_payload = payload.as_ref().and_then(|payload| {
        let id = payload.get(form_id_field).and_then(scalar_text)?;
        Some((id, payload.get("type").and_then(scalar_text)))
    });
    match from_payload {
        Some((id, interaction)) => event(id, interaction),
        None => Err(IdentifyError::MissingEventId(format!(
            "form field {form_id_field}"
        ))),
    }
}

fn describe(source: &FieldSource) -> String {
    match source {
        FieldSource::JsonPointer(pointer) => format!("body at JSON pointer {pointer}"),
        FieldSource::Header(name) => format!("header {name}"),
    }
}

fn read_field(
    source: &FieldSource,
    headers: &dyn HeaderSource,
    json: Option<&Value>,
) -> Option<String> {
    match source {
        FieldSource::Header(name) => headers.header(name).map(str::to_owned),
        FieldSource::JsonPointer(pointer) => json?.pointer(pointer).and_then(scalar_text),
    }
}

/// Strings as they are, numbers in their JSON spelling (some providers use numeric ids).
fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

fn event(event_id: String, event_type: Option<String>) -> Result<Identified, IdentifyError> {
    if event_id.trim().is_empty() {
        return Err(IdentifyError::InvalidEventId("is empty"));
    }
    if event_id.chars().count() > MAX_EVENT_ID_CHARS {
        return Err(IdentifyError::InvalidEventId(
            "is longer than 255 characters",
        ));
    }
    if event_id.chars().any(char::is_control) {
        return Err(IdentifyError::InvalidEventId("contains control characters"));
    }
    // Types are informational: keep a sane prefix rather than reject the event.
    let event_type = event_type
        .filter(|t| !t.is_empty())
        .map(|t| t.chars().filter(|c| !c.is_control()).take(255).collect());
    Ok(Identified::Event {
        event_id,
        event_type,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(id: FieldSource, ty: Option<FieldSource>) -> Identity {
        Identity::Fields {
            event_id: id,
            event_type: ty,
        }
    }

    fn ev(id: &str, ty: Option<&str>) -> Result<Identified, IdentifyError> {
        Ok(Identified::Event {
            event_id: id.into(),
            event_type: ty.map(Into::into),
        })
    }

    #[test]
    fn ids_come_from_json_pointers_or_headers() {
        let headers: Vec<(String, String)> = vec![("x-id".into(), "hdr-1".into())];
        let identity = fields(
            FieldSource::JsonPointer("/data/id".into()),
            Some(FieldSource::JsonPointer("/type".into())),
        );
        assert_eq!(
            identify(&identity, &headers, br#"{"type":"a.b","data":{"id":42}}"#),
            ev("42", Some("a.b"))
        );
        let identity = fields(FieldSource::Header("x-id".into()), None);
        assert_eq!(
            identify(&identity, &headers, b"not json at all"),
            ev("hdr-1", None)
        );
    }

    #[test]
    fn json_is_required_only_when_read() {
        let headers: Vec<(String, String)> = vec![];
        let identity = fields(FieldSource::JsonPointer("/id".into()), None);
        assert_eq!(
            identify(&identity, &headers, b"{\"id\":"),
            Err(IdentifyError::InvalidJson)
        );
        assert_eq!(
            identify(&identity, &headers, b"{\"other\":1}"),
            Err(IdentifyError::MissingEventId(
                "body at JSON pointer /id".into()
            ))
        );
        assert_eq!(
            identify(&identity, &headers, b"{\"id\":{\"nested\":1}}"),
            Err(IdentifyError::MissingEventId(
                "body at JSON pointer /id".into()
            ))
        );
    }

    #[test]
    fn a_type_read_from_the_body_does_not_make_json_required() {
        let headers: Vec<(String, String)> = vec![("x-id".into(), "hdr-1".into())];
        let identity = fields(
            FieldSource::Header("x-id".into()),
            Some(FieldSource::JsonPointer("/type".into())),
        );
        assert_eq!(
            identify(&identity, &headers, b"<xml>not json</xml>"),
            ev("hdr-1", None)
        );
        assert_eq!(
            identify(&identity, &headers, br#"{"type":"a.b"}"#),
            ev("hdr-1", Some("a.b"))
        );
    }

    #[test]
    fn standard_webhooks_ids_come_from_webhook_id_or_else_svix_id() {
        let webhook: Vec<(String, String)> = vec![
            ("svix-id".into(), "msg_svix".into()),
            ("webhook-id".into(), "msg_std".into()),
        ];
        assert_eq!(
            identify(
                &Identity::StandardWebhooks,
                &webhook,
                br#"{"type":"invoice.paid"}"#
            ),
            ev("msg_std", Some("invoice.paid"))
        );
        let svix: Vec<(String, String)> = vec![("svix-id".into(), "msg_svix".into())];
        assert_eq!(
            identify(&Identity::StandardWebhooks, &svix, b"plain text"),
            ev("msg_svix", None)
        );
        let neither: Vec<(String, String)> = vec![];
        assert_eq!(
            identify(&Identity::StandardWebhooks, &neither, b"{}"),
            Err(IdentifyError::MissingEventId("header webhook-id".into()))
        );
    }

    #[test]
    fn event_ids_are_bounded_and_non_empty() {
        let headers: Vec<(String, String)> = vec![];
        let identity = fields(FieldSource::JsonPointer("/id".into()), None);
        let long = format!("{{\"id\":\"{}\"}}", "x".repeat(256));
        assert_eq!(
            identify(&identity, &headers, long.as_bytes()),
            Err(IdentifyError::InvalidEventId(
                "is longer than 255 characters"
            ))
        );
        let max = format!("{{\"id\":\"{}\"}}", "é".repeat(255));
        assert!(identify(&identity, &headers, max.as_bytes()).is_ok());
        assert_eq!(
            identify(&identity, &headers, b"{\"id\":\"  \"}"),
            Err(IdentifyError::InvalidEventId("is empty"))
        );
        assert_eq!(
            identify(&identity, &headers, b"{\"id\":\"a\\u0000b\"}"),
            Err(IdentifyError::InvalidEventId("contains control characters"))
        );
    }

    #[test]
    fn shopify_prefers_the_event_id_and_falls_back_to_the_webhook_id() {
        let both: Vec<(String, String)> = vec![
            ("x-shopify-webhook-id".into(), "wh-1".into()),
            ("x-shopify-event-id".into(), "ev-1".into()),
            ("x-shopify-topic".into(), "orders/create".into()),
        ];
        assert_eq!(
            identify(&Identity::Shopify, &both, b"{}"),
            ev("ev-1", Some("orders/create"))
        );
        let fallback: Vec<(String, String)> = vec![("x-shopify-webhook-id".into(), "wh-1".into())];
        assert_eq!(
            identify(&Identity::Shopify, &fallback, b"<xml/>"),
            ev("wh-1", None)
        );
    }

    #[test]
    fn slack_events_challenges_and_slash_commands() {
        let headers: Vec<(String, String)> = vec![];
        let slack = Identity::Slack {
            form_id_field: "trigger_id".into(),
        };
        assert_eq!(
            identify(
                &slack,
                &headers,
                br#"{"type":"url_verification","challenge":"c-123"}"#
            ),
            Ok(Identified::SlackChallenge("c-123".into()))
        );
        assert_eq!(
            identify(
                &slack,
                &headers,
                br#"{"type":"event_callback","event_id":"Ev1","event":{"type":"app_mention"}}"#
            ),
            ev("Ev1", Some("app_mention"))
        );
        assert_eq!(
            identify(
                &slack,
                &headers,
                b"command=%2Fdeploy&trigger_id=398.47.803a&text="
            ),
            ev("398.47.803a", Some("/deploy"))
        );
        assert_eq!(
            identify(
                &slack,
                &headers,
                b"payload=%7B%22type%22%3A%22block_actions%22%2C%22trigger_id%22%3A%2213.42.7%22%7D"
            ),
            ev("13.42.7", Some("block_actions")),
            "interactivity keeps its fields in a JSON payload"
        );
        assert_eq!(
            identify(&slack, &headers, b"payload=%7Bnot%20json"),
            Err(IdentifyError::MissingEventId(
                "form field trigger_id".into()
            ))
        );
        assert_eq!(
            identify(&slack, &headers, b"command=%2Fdeploy"),
            Err(IdentifyError::MissingEventId(
                "form field trigger_id".into()
            ))
        );
        assert_eq!(
            identify(&slack, &headers, b"{\"truncated"),
            Err(IdentifyError::InvalidJson)
        );
    }
}
