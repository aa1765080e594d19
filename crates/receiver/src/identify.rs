//! Finds a verified request's events: their ids and types, where their provider puts them.
//!
//! The body must be JSON only when the event id comes from it; otherwise it is stored exactly
//! as received, whatever its format (GitHub's form-encoded payloads, Shopify's XML), and a type
//! that would have come from a JSON body is simply absent. A batch (SendGrid, Adyen, HubSpot,
//! Meta) becomes one event per item, each with its own id and the item's exact bytes as body.

use inbox_signature::{Batch, HeaderSource, ItemId};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::json_field::{scalar_at, value_at, RepeatedMember};
use crate::providers::{FieldSource, Identity, MAX_EVENT_ID_CHARS};

/// Most events one request may carry; a larger batch is refused (400) rather than stored.
/// Far above what a provider sends (SendGrid's batches of up to 768 KB hold a few thousand),
/// it bounds what a body of tiny items costs in rows and headers kept for each.
pub const MAX_BATCH_ITEMS: usize = 10_000;

/// One event of a verified request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identified {
    /// The provider's event id (the dedup key).
    pub event_id: String,
    /// The provider's event type, when it gives one.
    pub event_type: Option<String>,
    /// The item's exact bytes for a batch item; `None`: the request body.
    pub body: Option<Vec<u8>>,
}

/// Why a request's events could not be identified (all answered 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentifyError {
    /// The body must be JSON here and is not.
    #[error("body is not valid JSON")]
    InvalidJson,
    /// The body must be form-encoded or JSON here and is neither.
    #[error("body is neither JSON nor form-encoded")]
    InvalidForm,
    /// A batch body without its items, or with too many.
    #[error("batch {0}")]
    InvalidBatch(&'static str),
    /// No event id where the provider puts it.
    #[error("no event id found ({0})")]
    MissingEventId(String),
    /// The event id is empty, too long, or not text.
    #[error("event id {0}")]
    InvalidEventId(&'static str),
    /// The body names a member on the id's (or type's) path more than once: which one a
    /// parser takes differs, so the event is refused rather than keyed on a guess.
    #[error("ambiguous body: {0}")]
    Ambiguous(#[from] RepeatedMember),
}

/// Identifies the events of a request whose signature has been verified: one, or one per item
/// of a batch.
pub fn identify(
    identity: &Identity,
    headers: &dyn HeaderSource,
    body: &[u8],
) -> Result<Vec<Identified>, IdentifyError> {
    match identity {
        Identity::Fields {
            event_id,
            event_type,
        } => identify_fields(event_id, event_type, headers, body).map(|event| vec![event]),
        Identity::Slack { form_id_field } => identify_slack(body, form_id_field).map(|e| vec![e]),
        Identity::Batch(batch) => identify_batch(batch, body),
    }
}

fn identify_fields(
    id_sources: &[FieldSource],
    type_sources: &[FieldSource],
    headers: &dyn HeaderSource,
    body: &[u8],
) -> Result<Identified, IdentifyError> {
    let needs_json = |sources: &[FieldSource]| {
        sources.iter().any(|s| {
            matches!(
                s,
                FieldSource::JsonPointer(_) | FieldSource::JsonPointers(_)
            )
        })
    };
    // Parsed only when a source needs it; a type is informational, so a non-JSON body whose
    // id travels in a header is stored without one.
    let json = if needs_json(id_sources) || needs_json(type_sources) {
        serde_json::from_slice::<&RawValue>(body).ok()
    } else {
        None
    };
    let read = |sources: &[FieldSource]| first_found(sources, headers, json, body);
    let Some(id) = read(id_sources)? else {
        let only_json = id_sources
            .iter()
            .all(|s| needs_json(std::slice::from_ref(s)));
        if only_json && json.is_none() {
            return Err(IdentifyError::InvalidJson);
        }
        return Err(IdentifyError::MissingEventId(
            id_sources.first().map(describe).unwrap_or_default(),
        ));
    };
    event(id, read(type_sources)?, None)
}

/// The value of the first of `sources` that has one.
fn first_found(
    sources: &[FieldSource],
    headers: &dyn HeaderSource,
    json: Option<&RawValue>,
    body: &[u8],
) -> Result<Option<String>, IdentifyError> {
    for source in sources {
        if let Some(value) = read_field(source, headers, json, body)? {
            return Ok(Some(value));
        }
    }
    Ok(None)
}

fn identify_batch(batch: &Batch, body: &[u8]) -> Result<Vec<Identified>, IdentifyError> {
    let items_raw = raw_at(body, &batch.items)?.ok_or(IdentifyError::InvalidJson)?;
    let items: Vec<&RawValue> = serde_json::from_str(items_raw.get())
        .map_err(|_| IdentifyError::InvalidBatch("items are not an array"))?;
    if items.is_empty() {
        return Err(IdentifyError::InvalidBatch("has no items"));
    }
    if items.len() > MAX_BATCH_ITEMS {
        return Err(IdentifyError::InvalidBatch("has more than 10000 items"));
    }
    items
        .into_iter()
        .map(|item| {
            let stored = raw_at(item.get().as_bytes(), &batch.unwrap)?
                .ok_or(IdentifyError::InvalidBatch("an item lacks its object"))?;
            let id = match &batch.id {
                ItemId::Pointers(pointers) => joined(stored, pointers)?.ok_or_else(|| {
                    IdentifyError::MissingEventId(format!("item field {}", pointers.join(" and ")))
                })?,
                ItemId::ContentHash => hex::encode(Sha256::digest(stored.get().as_bytes())),
            };
            let event_type = match batch.event_type.as_deref() {
                Some(pointer) => scalar_at(stored, pointer)?,
                None => None,
            };
            event(id, event_type, Some(stored.get().as_bytes().to_vec()))
        })
        .collect()
}

/// The raw JSON at `pointer` (object keys only: batches never index into arrays), keeping the
/// exact bytes of the value so a stored item is byte for byte what the provider sent.
fn raw_at<'a>(json: &'a [u8], pointer: &str) -> Result<Option<&'a RawValue>, IdentifyError> {
    let Ok(json) = serde_json::from_slice::<&RawValue>(json) else {
        return Ok(None);
    };
    Ok(value_at(json, pointer)?)
}

fn identify_slack(body: &[u8], form_id_field: &str) -> Result<Identified, IdentifyError> {
    if let Ok(json) = serde_json::from_slice::<&RawValue>(body) {
        let id = scalar_at(json, "/event_id")?
            .ok_or_else(|| IdentifyError::MissingEventId("body field event_id".into()))?;
        let event_type = match scalar_at(json, "/event/type")? {
            Some(inner) => Some(inner),
            None => scalar_at(json, "/type")?,
        };
        return event(id, event_type, None);
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
        return event(id, command, None);
    }
    // Interactivity (buttons, shortcuts, modals) sends one form field, `payload`, holding JSON
    // that carries the id field and the interaction's type.
    let payload = payload.and_then(|payload| serde_json::from_str::<Box<RawValue>>(&payload).ok());
    let from_payload = match payload.as_deref() {
        Some(payload) => {
            let pointer = format!("/{}", form_id_field.replace('~', "~0").replace('/', "~1"));
            scalar_at(payload, &pointer)?
                .map(|id| Ok::<_, RepeatedMember>((id, scalar_at(payload, "/type")?)))
                .transpose()?
        }
        None => None,
    };
    match from_payload {
        Some((id, interaction)) => event(id, interaction, None),
        None => Err(IdentifyError::MissingEventId(format!(
            "form field {form_id_field}"
        ))),
    }
}

fn describe(source: &FieldSource) -> String {
    match source {
        FieldSource::JsonPointer(pointer) => format!("body at JSON pointer {pointer}"),
        FieldSource::JsonPointers(pointers) => {
            format!("body at JSON pointers {}", pointers.join(", "))
        }
        FieldSource::Header(name) => format!("header {name}"),
        FieldSource::FormField(name) => format!("form field {name}"),
        FieldSource::EveryDelivery => "a generated id".into(),
    }
}

fn read_field(
    source: &FieldSource,
    headers: &dyn HeaderSource,
    json: Option<&RawValue>,
    body: &[u8],
) -> Result<Option<String>, IdentifyError> {
    Ok(match source {
        FieldSource::Header(name) => headers.header(name).map(str::to_owned),
        FieldSource::JsonPointer(pointer) => match json {
            Some(json) => scalar_at(json, pointer)?,
            None => None,
        },
        FieldSource::JsonPointers(pointers) => match json {
            Some(json) => joined(json, pointers)?,
            None => None,
        },
        FieldSource::FormField(name) => form_urlencoded::parse(body)
            .find(|(key, _)| key == name.as_str())
            .map(|(_, value)| value.into_owned()),
        // Each delivery its own event: a fresh id, so identical bodies are all kept.
        FieldSource::EveryDelivery => Some(uuid::Uuid::new_v4().to_string()),
    })
}

/// The values at `pointers`, joined with `:`; `None` unless every one is present.
fn joined(json: &RawValue, pointers: &[String]) -> Result<Option<String>, RepeatedMember> {
    let mut parts = Vec::with_capacity(pointers.len());
    for pointer in pointers {
        match scalar_at(json, pointer)? {
            Some(part) => parts.push(part),
            None => return Ok(None),
        }
    }
    Ok(Some(parts.join(":")))
}

fn event(
    event_id: String,
    event_type: Option<String>,
    body: Option<Vec<u8>>,
) -> Result<Identified, IdentifyError> {
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
    Ok(Identified {
        event_id,
        event_type,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(id: FieldSource, ty: Option<FieldSource>) -> Identity {
        Identity::Fields {
            event_id: vec![id],
            event_type: ty.into_iter().collect(),
        }
    }

    fn ev(id: &str, ty: Option<&str>) -> Result<Vec<Identified>, IdentifyError> {
        Ok(vec![Identified {
            event_id: id.into(),
            event_type: ty.map(Into::into),
            body: None,
        }])
    }

    fn standard_webhooks() -> Identity {
        Identity::Fields {
            event_id: vec![
                FieldSource::Header("webhook-id".into()),
                FieldSource::Header("svix-id".into()),
            ],
            event_type: vec![FieldSource::JsonPointer("/type".into())],
        }
    }

    fn shopify() -> Identity {
        Identity::Fields {
            event_id: vec![
                FieldSource::Header("x-shopify-event-id".into()),
                FieldSource::Header("x-shopify-webhook-id".into()),
            ],
            event_type: vec![FieldSource::Header("x-shopify-topic".into())],
        }
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
                &standard_webhooks(),
                &webhook,
                br#"{"type":"invoice.paid"}"#
            ),
            ev("msg_std", Some("invoice.paid"))
        );
        let svix: Vec<(String, String)> = vec![("svix-id".into(), "msg_svix".into())];
        assert_eq!(
            identify(&standard_webhooks(), &svix, b"plain text"),
            ev("msg_svix", None)
        );
        let neither: Vec<(String, String)> = vec![];
        assert_eq!(
            identify(&standard_webhooks(), &neither, b"{}"),
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
            identify(&shopify(), &both, b"{}"),
            ev("ev-1", Some("orders/create"))
        );
        let fallback: Vec<(String, String)> = vec![("x-shopify-webhook-id".into(), "wh-1".into())];
        assert_eq!(identify(&shopify(), &fallback, b"<xml/>"), ev("wh-1", None));
    }

    #[test]
    fn slack_events_and_slash_commands() {
        let headers: Vec<(String, String)> = vec![];
        let slack = Identity::Slack {
            form_id_field: "trigger_id".into(),
        };
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

    fn batch(items: &str, unwrap: &str, id: ItemId, event_type: Option<&str>) -> Identity {
        Identity::Batch(Batch {
            items: items.into(),
            unwrap: unwrap.into(),
            id,
            event_type: event_type.map(Into::into),
        })
    }

    #[test]
    fn a_batch_becomes_one_event_per_item_with_the_items_exact_bytes() {
        let headers: Vec<(String, String)> = vec![];
        let sendgrid = batch(
            "",
            "",
            ItemId::Pointers(vec!["/sg_event_id".into()]),
            Some("/event"),
        );
        let body =
            br#"[{"sg_event_id":"a1","event":"delivered"},  {"event":"open", "sg_event_id":"b2"}]"#;
        let events = identify(&sendgrid, &headers, body).expect("two items");
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].event_id, "a1");
        assert_eq!(events[1].event_type.as_deref(), Some("open"));
        assert_eq!(
            events[1].body.as_deref(),
            Some(br#"{"event":"open", "sg_event_id":"b2"}"#.as_slice())
        );
        assert_eq!(
            identify(&sendgrid, &headers, b"[]"),
            Err(IdentifyError::InvalidBatch("has no items"))
        );
        assert_eq!(
            identify(&sendgrid, &headers, b"{}"),
            Err(IdentifyError::InvalidBatch("items are not an array"))
        );
        assert_eq!(
            identify(&sendgrid, &headers, br#"[{"event":"x"}]"#),
            Err(IdentifyError::MissingEventId(
                "item field /sg_event_id".into()
            ))
        );
    }

    #[test]
    fn adyen_items_are_unwrapped_and_keyed_on_three_fields() {
        let headers: Vec<(String, String)> = vec![];
        let adyen = batch(
            "/notificationItems",
            "/NotificationRequestItem",
            ItemId::Pointers(vec![
                "/pspReference".into(),
                "/eventCode".into(),
                "/success".into(),
            ]),
            Some("/eventCode"),
        );
        let body = br#"{"live":"false","notificationItems":[{"NotificationRequestItem":{"pspReference":"79","eventCode":"CAPTURE","success":"true"}}]}"#;
        let events = identify(&adyen, &headers, body).expect("one item");
        assert_eq!(events[0].event_id, "79:CAPTURE:true");
        assert_eq!(
            events[0].body.as_deref(),
            Some(br#"{"pspReference":"79","eventCode":"CAPTURE","success":"true"}"#.as_slice())
        );
    }

    #[test]
    fn items_without_ids_are_keyed_by_their_bytes() {
        let headers: Vec<(String, String)> = vec![];
        let meta = batch("/entry", "", ItemId::ContentHash, Some("/changes/0/field"));
        let body = br#"{"object":"page","entry":[{"id":"1","time":5},{"id":"1","time":6}]}"#;
        let events = identify(&meta, &headers, body).expect("two entries");
        assert_ne!(events[0].event_id, events[1].event_id);
        assert_eq!(
            events[0].event_id,
            hex::encode(Sha256::digest(br#"{"id":"1","time":5}"#))
        );
    }

    #[test]
    fn form_fields_joined_pointers_and_generated_ids() {
        let headers: Vec<(String, String)> = vec![];
        let form = fields(FieldSource::FormField("MessageSid".into()), None);
        assert_eq!(
            identify(&form, &headers, b"To=1&MessageSid=SM9"),
            ev("SM9", None)
        );
        let joined = fields(
            FieldSource::JsonPointers(vec!["/event".into(), "/ts".into()]),
            None,
        );
        assert_eq!(
            identify(&joined, &headers, br#"{"event":"e","ts":5}"#),
            ev("e:5", None)
        );
        assert_eq!(
            identify(&joined, &headers, b"nope"),
            Err(IdentifyError::InvalidJson)
        );
        let every = fields(FieldSource::EveryDelivery, None);
        let first = identify(&every, &headers, b"{}").expect("an id");
        let second = identify(&every, &headers, b"{}").expect("an id");
        assert_ne!(first[0].event_id, second[0].event_id);
    }
}
