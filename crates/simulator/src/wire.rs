//! What goes on the wire for each provider: the body and identity headers a provider of that
//! scheme sends, where the receiver will look for the event id and type, and the signature
//! headers of one delivery.

use inbox_signature::{Scheme, SigningKey};
use receiver::providers::{FieldSource, Identity, Provider};
use serde_json::{Map, Value};

use crate::plan::{DeliveryKind, PlannedEvent};

/// How far behind the tolerance a stale replay's timestamp is.
const STALENESS_MARGIN_SECS: i64 = 600;

/// The key forged deliveries are signed with: no configured secret.
const FORGED_KEY: &[u8] = b"inbox-simulator: a key no provider was configured with";

/// Request headers, lowercase names.
pub type Headers = Vec<(String, String)>;

/// Whether the simulator can send for this provider; the reason when not.
pub fn check_supported(provider: &Provider) -> Result<(), String> {
    if !provider.unsigned && provider.keys.is_empty() {
        return Err("no secret to sign with".into());
    }
    if let Identity::Fields {
        event_id,
        event_type,
    } = &provider.identity
    {
        for source in std::iter::once(event_id).chain(event_type) {
            if let FieldSource::JsonPointer(pointer) = source {
                if pointer.is_empty() {
                    return Err("an empty JSON pointer (the whole body) cannot carry an id".into());
                }
            }
        }
    }
    Ok(())
}

/// Whether the provider's requests carry an event type the receiver reads.
pub fn carries_type(provider: &Provider) -> bool {
    match &provider.identity {
        Identity::Fields { event_type, .. } => event_type.is_some(),
        Identity::Shopify | Identity::StandardWebhooks | Identity::Slack { .. } => true,
    }
}

/// The prefix the provider's own ids have (`evt_` for Stripe, `msg_` for Standard Webhooks).
pub fn id_prefix(provider: &Provider) -> &'static str {
    match provider.scheme {
        Scheme::Stripe { .. } => "evt_",
        Scheme::StandardWebhooks { .. } => "msg_",
        Scheme::Slack { .. } => "Ev",
        Scheme::Github | Scheme::Shopify | Scheme::HmacSha256(_) => "",
    }
}

/// The body and identity headers of an event: its id and type where `provider`'s receiver
/// configuration reads them, `data` under `"data"`.
pub fn compose(
    provider: &Provider,
    event_id: &str,
    event_type: Option<&str>,
    data: Value,
) -> Result<(Vec<u8>, Headers), String> {
    let mut body = Map::new();
    let mut headers = Vec::new();
    match &provider.identity {
        Identity::Fields {
            event_id: id_source,
            event_type: type_source,
        } => {
            body.insert("data".into(), data);
            let mut body = Value::Object(body);
            place(&mut body, &mut headers, id_source, event_id)?;
            if let (Some(source), Some(event_type)) = (type_source, event_type) {
                place(&mut body, &mut headers, source, event_type)?;
            }
            return Ok((to_bytes(&body), headers));
        }
        Identity::Shopify => {
            headers.push(("x-shopify-event-id".into(), event_id.into()));
            if let Some(event_type) = event_type {
                headers.push(("x-shopify-topic".into(), event_type.into()));
            }
            body.insert("data".into(), data);
        }
        Identity::StandardWebhooks => {
            // Signing adds webhook-id; an unsigned provider still needs it as the event id.
            if provider.unsigned {
                headers.push(("webhook-id".into(), event_id.into()));
            }
            if let Some(event_type) = event_type {
                body.insert("type".into(), event_type.into());
            }
            body.insert("data".into(), data);
        }
        Identity::Slack { .. } => {
            // An Events API callback: id at the top, type inside the event.
            body.insert("type".into(), "event_callback".into());
            body.insert("event_id".into(), event_id.into());
            let mut event = Map::new();
            if let Some(event_type) = event_type {
                event.insert("type".into(), event_type.into());
            }
            body.insert("event".into(), Value::Object(event));
            body.insert("data".into(), data);
        }
    }
    Ok((to_bytes(&Value::Object(body)), headers))
}

fn to_bytes(value: &Value) -> Vec<u8> {
    // Serializing a Value cannot fail: its keys are strings.
    serde_json::to_vec(value).unwrap_or_default()
}

/// Puts `value` where `source` says: a header, or the body at a JSON pointer (objects are
/// created along the way).
fn place(
    body: &mut Value,
    headers: &mut Headers,
    source: &FieldSource,
    value: &str,
) -> Result<(), String> {
    match source {
        FieldSource::Header(name) => {
            headers.push((name.to_ascii_lowercase(), value.to_owned()));
            Ok(())
        }
        FieldSource::JsonPointer(pointer) => {
            let mut target = body;
            let tokens: Vec<String> = pointer
                .split('/')
                .skip(1)
                .map(|token| token.replace("~1", "/").replace("~0", "~"))
                .collect();
            let Some((last, parents)) = tokens.split_last() else {
                return Err(format!("JSON pointer {pointer:?} has no field"));
            };
            for token in parents {
                let object = target
                    .as_object_mut()
                    .ok_or_else(|| format!("JSON pointer {pointer:?} crosses a non-object"))?;
                target = object
                    .entry(token.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
            }
            let object = target
                .as_object_mut()
                .ok_or_else(|| format!("JSON pointer {pointer:?} crosses a non-object"))?;
            object.insert(last.clone(), Value::from(value));
            Ok(())
        }
    }
}

/// The complete headers of one attempt at a delivery of `event`, signed at `now` (unix
/// seconds) with configured key number `key_pick` (modulo their number), or forged as `kind`
/// says.
pub fn request_headers(
    provider: &Provider,
    event: &PlannedEvent,
    kind: DeliveryKind,
    key_pick: usize,
    now: i64,
) -> Headers {
    let mut headers = event.headers.clone();
    headers.push(("content-type".into(), "application/json".into()));
    if provider.unsigned {
        return headers;
    }
    let configured = &provider.keys[key_pick % provider.keys.len()];
    let forged;
    let (key, timestamp) = match kind {
        DeliveryKind::Genuine => (configured, now),
        DeliveryKind::BadSignature => {
            forged = SigningKey::from_bytes(FORGED_KEY).ok();
            match &forged {
                Some(key) => (key, now),
                None => (configured, now),
            }
        }
        DeliveryKind::StaleTimestamp => {
            let tolerance = provider
                .scheme
                .tolerance()
                .map_or(0, |t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX / 2));
            (configured, now - tolerance - STALENESS_MARGIN_SECS)
        }
    };
    headers.extend(
        provider
            .scheme
            .sign(key, &event.body, &event.event_id, timestamp),
    );
    headers
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Fate, Mix, Plan};
    use receiver::identify::{identify, Identified};
    use receiver::providers::Providers;
    use std::path::Path;

    fn providers() -> Providers {
        Providers::parse(
            r#"
            [providers.stripe]
            scheme = "stripe"
            secrets = [{ env = "WHSEC" }, { env = "OTHER" }]
            [providers.github]
            scheme = "github"
            secrets = [{ env = "OTHER" }]
            [providers.svix]
            scheme = "standard-webhooks"
            secrets = [{ env = "WHSEC" }]
            [providers.shopify]
            scheme = "shopify"
            secrets = [{ env = "OTHER" }]
            [providers.slack]
            scheme = "slack"
            secrets = [{ env = "OTHER" }]
            [providers.acme]
            scheme = "hmac-sha256"
            signature_header = "X-Acme-Signature"
            encoding = "base64"
            event_id = { json_pointer = "/meta/id" }
            event_type = { header = "X-Acme-Type" }
            secrets = [{ env = "OTHER" }]
            [providers.demo]
            scheme = "hmac-sha256"
            signature_header = "X-Signature"
            prefix = "sha256="
            event_id = { header = "X-Demo-Id" }
            secrets = [{ env = "OTHER" }]
            [providers.local]
            scheme = "standard-webhooks"
            unsigned = true
            "#,
            Path::new("providers.toml"),
            &|var| match var {
                "WHSEC" => Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()),
                _ => Some("another-secret".to_owned()),
            },
        )
        .expect("valid providers")
    }

    /// What the receiver concludes from a request, with its own verification and
    /// identification code.
    fn as_received(
        provider: &Provider,
        headers: &[(String, String)],
        body: &[u8],
        now: i64,
    ) -> Result<Identified, String> {
        if !provider.unsigned {
            provider
                .scheme
                .verify(&headers, body, &provider.keys, now)
                .map_err(|err| err.to_string())?;
        }
        identify(&provider.identity, &headers, body).map_err(|err| err.to_string())
    }

    #[test]
    fn the_receiver_verifies_genuine_copies_and_reads_the_planned_id_and_type() {
        let providers = providers();
        let plan = Plan::new(&providers, &[], &Mix::default(), 600, 11, "wire").expect("plan");
        let now = 1_700_000_000;
        for (index, event) in plan.events.iter().enumerate() {
            let provider = providers.get(&event.provider).expect("provider");
            let headers = request_headers(provider, event, DeliveryKind::Genuine, index, now);
            let identified = as_received(provider, &headers, &event.body, now)
                .unwrap_or_else(|err| panic!("{}: {err}", event.provider));
            assert_eq!(
                identified,
                Identified::Event {
                    event_id: event.event_id.clone(),
                    event_type: event.event_type.clone(),
                },
                "{}",
                event.provider
            );
        }
        let demo = plan
            .events
            .iter()
            .find(|e| e.provider == "demo")
            .expect("a demo event");
        assert_eq!(demo.event_type, None, "demo carries no type here");
        assert_eq!(demo.fate, Fate::Ignored);
    }

    #[test]
    fn forged_copies_fail_verification() {
        let providers = providers();
        let plan = Plan::new(&providers, &[], &Mix::default(), 300, 12, "forged").expect("plan");
        let now = 1_700_000_000;
        for event in &plan.events {
            let provider = providers.get(&event.provider).expect("provider");
            if provider.unsigned {
                continue;
            }
            for kind in [DeliveryKind::BadSignature, DeliveryKind::StaleTimestamp] {
                if kind == DeliveryKind::StaleTimestamp && provider.scheme.tolerance().is_none() {
                    continue;
                }
                let headers = request_headers(provider, event, kind, 0, now);
                assert!(
                    provider
                        .scheme
                        .verify(&headers, &event.body, &provider.keys, now)
                        .is_err(),
                    "{} {kind:?} verified",
                    event.provider
                );
            }
        }
    }
}
