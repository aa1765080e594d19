//! What goes on the wire for each provider: the body and identity headers a provider of that
//! scheme sends, where the receiver will look for the event id and type, the signed request of
//! one delivery (the headers, and the body for the schemes that sign inside it), and the
//! handshakes providers perform before they send events.

use inbox_signature::{Family, Outgoing, SignError, SigningKey};
use receiver::identify::identify;
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
    if let Some(key) = provider.keys.first() {
        let probe = Outgoing::post(b"{}", "probe", 0);
        if provider.scheme.sign(key, &probe) == Err(SignError::PublicKeyOnly) {
            return Err("only public keys are configured: signing needs a private key".into());
        }
    }
    if let Identity::Fields {
        event_id,
        event_type,
    } = &provider.identity
    {
        match event_id.first() {
            Some(FieldSource::EveryDelivery) => {
                return Err("every delivery is its own event: duplicates cannot be planned".into())
            }
            Some(FieldSource::FormField(_)) => {
                return Err("ids in form fields are not simulated".into())
            }
            _ => {}
        }
        for source in event_id.iter().chain(event_type) {
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
        Identity::Fields { event_type, .. } => event_type
            .first()
            .is_some_and(|source| !matches!(source, FieldSource::FormField(_))),
        Identity::Slack { .. } => true,
        Identity::Batch(batch) => batch.event_type.is_some(),
    }
}

/// The prefix the provider's own ids have (`evt_` for Stripe, `msg_` for Standard Webhooks).
pub fn id_prefix(provider: &Provider) -> &'static str {
    match provider.scheme.name() {
        "stripe" => "evt_",
        "standard-webhooks" => "msg_",
        "slack" => "Ev",
        _ => "",
    }
}

/// Where an event stands in its provider's order: the value of its ordering key (its
/// object) and its sequence within that key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventOrder<'a> {
    /// The key's value, before the receiver prefixes it with the provider.
    pub key: &'a str,
    /// The event's sequence within the key.
    pub sequence: i64,
}

/// The body and identity headers of an event: its id and type where `provider`'s receiver
/// configuration reads them, `data` under `"data"`, and for an ordered provider its ordering
/// key and sequence where its `[ordering]` table reads them; and the event id the receiver
/// will read (the planned one, or what the provider's scheme derives from it: joined fields,
/// or the hash of a batch item).
pub fn compose(
    provider: &Provider,
    event_id: &str,
    event_type: Option<&str>,
    data: Value,
    ordering: Option<EventOrder<'_>>,
) -> Result<(Vec<u8>, Headers, String), String> {
    let mut headers = Vec::new();
    let body = match &provider.identity {
        Identity::Fields {
            event_id: id_sources,
            event_type: type_sources,
        } => {
            let mut body = Value::Object(Map::from_iter([("data".to_owned(), data)]));
            if let Some(source) = id_sources.first() {
                place(&mut body, &mut headers, source, event_id)?;
            }
            if let (Some(source), Some(event_type)) = (type_sources.first(), event_type) {
                place(&mut body, &mut headers, source, event_type)?;
            }
            place_ordering(provider, &mut body, &mut headers, ordering)?;
            body
        }
        Identity::Slack { .. } => {
            // An Events API callback: id at the top, type inside the event.
            let mut event = Map::new();
            if let Some(event_type) = event_type {
                event.insert("type".into(), event_type.into());
            }
            let mut body = serde_json::json!({ "type": "event_callback", "event_id": event_id, "event": event, "data": data });
            place_ordering(provider, &mut body, &mut headers, ordering)?;
            body
        }
        Identity::Batch(batch) => {
            let mut item = Value::Object(Map::from_iter([
                ("data".to_owned(), data),
                ("id".to_owned(), event_id.into()),
            ]));
            if let inbox_signature::ItemId::Pointers(pointers) = &batch.id {
                for pointer in pointers {
                    place(
                        &mut item,
                        &mut headers,
                        &FieldSource::JsonPointer(pointer.clone()),
                        event_id,
                    )?;
                }
            }
            if let (Some(pointer), Some(event_type)) = (&batch.event_type, event_type) {
                place(
                    &mut item,
                    &mut headers,
                    &FieldSource::JsonPointer(pointer.clone()),
                    event_type,
                )?;
            }
            // The receiver reads a batch event's key from its own item.
            place_ordering(provider, &mut item, &mut headers, ordering)?;
            wrap_batch(item, &batch.unwrap, &batch.items)?
        }
    };
    let bytes = to_bytes(&body);
    let received = received_id(provider, &headers, &bytes, event_id)?;
    Ok((bytes, headers, received))
}

/// Puts an ordered event's key and sequence where `provider`'s `[ordering]` table reads them.
/// Nothing for an event without `ordering`, which the receiver then processes unordered.
fn place_ordering(
    provider: &Provider,
    body: &mut Value,
    headers: &mut Headers,
    ordering: Option<EventOrder<'_>>,
) -> Result<(), String> {
    let (Some(spec), Some(ordering)) = (&provider.ordering, ordering) else {
        return Ok(());
    };
    place(body, headers, &spec.key, ordering.key)?;
    match &spec.sequence {
        // A number, as providers send versions and timestamps.
        Some(FieldSource::JsonPointer(pointer)) => {
            place_value(body, headers, pointer, Value::from(ordering.sequence))
        }
        Some(source) => place(body, headers, source, &ordering.sequence.to_string()),
        None => Ok(()),
    }
}

/// The one-item batch around `item`: under `unwrap`, inside the array at `items`.
fn wrap_batch(item: Value, unwrap: &str, items: &str) -> Result<Value, String> {
    let mut wrapped = Value::Object(Map::new());
    let item = if unwrap.is_empty() {
        item
    } else {
        let mut headers = Vec::new();
        place_value(&mut wrapped, &mut headers, unwrap, item)?;
        std::mem::take(&mut wrapped)
    };
    if items.is_empty() {
        return Ok(Value::Array(vec![item]));
    }
    let mut body = serde_json::json!({ "object": "simulated" });
    place_value(&mut body, &mut Vec::new(), items, Value::Array(vec![item]))?;
    Ok(body)
}

/// The id the receiver reads from this request, by its own identification code; ids the
/// signature adds (webhook-id, Twitch's message id) are the planned one.
fn received_id(
    provider: &Provider,
    headers: &Headers,
    body: &[u8],
    planned: &str,
) -> Result<String, String> {
    let mut probe = headers.clone();
    for name in provider.scheme.signature_headers() {
        if !probe.iter().any(|(n, _)| n == name) {
            probe.push((name.to_owned(), planned.to_owned()));
        }
    }
    match identify(&provider.identity, &probe, body) {
        Ok(events) if events.len() == 1 => Ok(events[0].event_id.clone()),
        Ok(_) => Err("a composed body must carry one event".into()),
        Err(err) => Err(format!(
            "the receiver cannot identify a composed event: {err}"
        )),
    }
}

fn to_bytes(value: &Value) -> Vec<u8> {
    // Serializing a Value cannot fail: its keys are strings.
    serde_json::to_vec(value).unwrap_or_default()
}

/// Puts `value` where `source` says: a header, or the body at a JSON pointer (objects are
/// created along the way); every pointer of a joined id gets it.
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
            place_value(body, headers, pointer, Value::from(value))
        }
        FieldSource::JsonPointers(pointers) => {
            for pointer in pointers {
                place_value(body, headers, pointer, Value::from(value))?;
            }
            Ok(())
        }
        FieldSource::FormField(_) | FieldSource::EveryDelivery => {
            Err("this id source is not simulated".into())
        }
    }
}

fn place_value(
    body: &mut Value,
    _headers: &mut Headers,
    pointer: &str,
    value: Value,
) -> Result<(), String> {
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
    object.insert(last.clone(), value);
    Ok(())
}

/// A key no provider was configured with, of the kind the provider's scheme uses.
fn forged_key(provider: &Provider) -> Option<SigningKey> {
    let configured_ed25519 = matches!(provider.scheme.name(), "discord" | "discord-events")
        || (provider.scheme.name() == "standard-webhooks"
            && provider
                .scheme
                .sign(provider.keys.first()?, &Outgoing::post(b"", "p", 0))
                .ok()?
                .headers
                .iter()
                .any(|(_, v)| v.starts_with("v1a,")));
    match provider.scheme.family() {
        Family::Credential => SigningKey::credential(b"user:forged-credential").ok(),
        Family::Asymmetric if provider.scheme.name() == "sendgrid" => {
            SigningKey::p256_private(&[7; 32]).ok()
        }
        _ if configured_ed25519 => Some(SigningKey::ed25519_private(&[7; 32])),
        _ => SigningKey::from_bytes(FORGED_KEY).ok(),
    }
}

/// One attempt at a delivery of `event` to `url`, signed at `now` (unix seconds) with
/// configured key number `key_pick` (modulo their number), or forged as `kind` says: the
/// headers and the body to send.
pub fn request(
    provider: &Provider,
    event: &PlannedEvent,
    companions: &[&PlannedEvent],
    kind: DeliveryKind,
    key_pick: usize,
    now: i64,
    url: &str,
) -> (Headers, Vec<u8>) {
    let mut headers = event.headers.clone();
    headers.push(("content-type".into(), "application/json".into()));
    let body = batch_body(provider, event, companions);
    if provider.unsigned || provider.keys.is_empty() {
        return (headers, body);
    }
    let configured = &provider.keys[key_pick % provider.keys.len()];
    let forged;
    let (key, timestamp) = match kind {
        DeliveryKind::Genuine => (configured, now),
        DeliveryKind::BadSignature => {
            forged = forged_key(provider);
            (forged.as_ref().unwrap_or(configured), now)
        }
        DeliveryKind::StaleTimestamp => {
            let tolerance = provider
                .scheme
                .tolerance()
                .map_or(0, |t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX / 2));
            (configured, now - tolerance - STALENESS_MARGIN_SECS)
        }
    };
    let signed_url = signed_url(provider, url);
    let message = Outgoing {
        method: "POST",
        url: &signed_url,
        body: &body,
        id: &event.event_id,
        timestamp,
    };
    match provider.scheme.sign(key, &message) {
        Ok(signed) => {
            headers.retain(|(name, _)| !signed.headers.iter().any(|(n, _)| n == name));
            headers.extend(signed.headers);
            (headers, signed.body)
        }
        Err(_) => (headers, body),
    }
}

/// The body of `event`, with the items of `companions` appended to its batch. Every item is
/// serialized exactly as in its own body, so its stored bytes (and Meta's content key) do not
/// depend on the batch it came in.
fn batch_body(provider: &Provider, event: &PlannedEvent, companions: &[&PlannedEvent]) -> Vec<u8> {
    let Identity::Batch(batch) = &provider.identity else {
        return event.body.clone();
    };
    if companions.is_empty() {
        return event.body.clone();
    }
    let items_of = |body: &[u8]| -> Option<Vec<Value>> {
        let json: Value = serde_json::from_slice(body).ok()?;
        json.pointer(&batch.items)?.as_array().cloned()
    };
    let Ok(mut json) = serde_json::from_slice::<Value>(&event.body) else {
        return event.body.clone();
    };
    let extra: Vec<Value> = companions
        .iter()
        .filter_map(|companion| items_of(&companion.body))
        .flatten()
        .collect();
    match json.pointer_mut(&batch.items).and_then(Value::as_array_mut) {
        Some(items) => items.extend(extra),
        None => return event.body.clone(),
    }
    to_bytes(&json)
}

/// The URL the receiver will check the signature against: its `public_url` when configured.
fn signed_url(provider: &Provider, url: &str) -> String {
    provider
        .public_url
        .clone()
        .unwrap_or_else(|| url.to_owned())
}

/// A handshake the simulator performs before sending events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    /// `GET` or `POST`.
    pub method: &'static str,
    /// The query string to add to the provider's URL (without `?`).
    pub query: String,
    /// Headers to send.
    pub headers: Headers,
    /// Body to send.
    pub body: Vec<u8>,
    /// What the answer's body must contain.
    pub expect: String,
}

/// The handshake of `provider`'s scheme, signed with its first key at `now`, or `None` when
/// it performs none the simulator can make (Meta's needs its verify token).
pub fn handshake(provider: &Provider, now: i64, url: &str) -> Option<Handshake> {
    let challenge = format!("sim-challenge-{now}");
    let (headers, body, expect): (Headers, Value, String) = match provider.scheme.name() {
        "slack" => (
            Vec::new(),
            serde_json::json!({ "type": "url_verification", "challenge": challenge }),
            challenge.clone(),
        ),
        "zoom" => (
            Vec::new(),
            serde_json::json!({ "event": "endpoint.url_validation", "payload": { "plainToken": challenge }, "event_ts": now }),
            "encryptedToken".into(),
        ),
        "twitch" => (
            vec![(
                "twitch-eventsub-message-type".into(),
                "webhook_callback_verification".into(),
            )],
            serde_json::json!({ "challenge": challenge, "subscription": { "type": "channel.follow" } }),
            challenge.clone(),
        ),
        "discord" => (
            Vec::new(),
            serde_json::json!({ "type": 1, "id": challenge }),
            r#"{"type":1}"#.into(),
        ),
        // Answered 204, no body.
        "discord-events" => (
            Vec::new(),
            serde_json::json!({ "version": 1, "application_id": challenge, "type": 0 }),
            String::new(),
        ),
        "dropbox" => {
            return Some(Handshake {
                method: "GET",
                query: format!("challenge={challenge}"),
                headers: Vec::new(),
                body: Vec::new(),
                expect: challenge,
            })
        }
        _ => return None,
    };
    let body = to_bytes(&body);
    let mut headers = headers;
    headers.push(("content-type".into(), "application/json".into()));
    if let Some(key) = provider.keys.first() {
        let signed_url = signed_url(provider, url);
        let message = Outgoing {
            method: "POST",
            url: &signed_url,
            body: &body,
            id: &challenge,
            timestamp: now,
        };
        headers.extend(provider.scheme.sign(key, &message).ok()?.headers);
    }
    Some(Handshake {
        method: "POST",
        query: String::new(),
        headers,
        body,
        expect,
    })
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
        const URL: &str = "http://127.0.0.1:9/webhooks/p";
        if !provider.unsigned {
            let request = inbox_signature::Request::post(&headers, body).at(URL);
            provider
                .scheme
                .verify(&request, &provider.keys, now)
                .map_err(|err| err.to_string())?;
        }
        let mut events =
            identify(&provider.identity, &headers, body).map_err(|err| err.to_string())?;
        events.pop().ok_or_else(|| "no event".to_owned())
    }

    #[test]
    fn the_receiver_verifies_genuine_copies_and_reads_the_planned_id_and_type() {
        let providers = providers();
        let plan = Plan::new(&providers, &[], &Mix::default(), 600, 11, "wire").expect("plan");
        let now = 1_700_000_000;
        for (index, event) in plan.events.iter().enumerate() {
            let provider = providers.get(&event.provider).expect("provider");
            let (headers, body) = request(
                provider,
                event,
                &[],
                DeliveryKind::Genuine,
                index,
                now,
                "http://127.0.0.1:9/webhooks/p",
            );
            let identified = as_received(provider, &headers, &body, now)
                .unwrap_or_else(|err| panic!("{}: {err}", event.provider));
            assert_eq!(identified.event_id, event.event_id, "{}", event.provider);
            assert_eq!(
                identified.event_type, event.event_type,
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
    fn the_receiver_reads_an_ordered_events_key_and_sequence_where_its_provider_says() {
        for ordering in [
            "key = { json_pointer = \"/data/order_id\" }\nsequence = { json_pointer = \"/data/version\" }",
            "key = { header = \"X-Entity\" }\nsequence = { header = \"X-Version\" }",
        ] {
            let providers = Providers::parse(
                &format!(
                    "[providers.ordered]\nscheme = \"hmac-sha256\"\n\
                     signature_header = \"X-Signature\"\n\
                     event_id = {{ json_pointer = \"/id\" }}\n\
                     event_type = {{ json_pointer = \"/type\" }}\n\
                     secrets = [{{ env = \"S\" }}]\n[providers.ordered.ordering]\n{ordering}\n"
                ),
                Path::new("providers.toml"),
                &|_| Some("ordered-secret".to_owned()),
            )
            .expect("valid providers");
            let provider = providers.get("ordered").expect("provider");
            let spec = provider.ordering.as_ref().expect("ordered");
            let plan = Plan::new(&providers, &[], &Mix::default(), 300, 4, "o").expect("plan");
            let mut keyed = 0;
            for event in &plan.events {
                let (headers, body) = request(
                    provider,
                    event,
                    &[],
                    DeliveryKind::Genuine,
                    0,
                    1_700_000_000,
                    "http://127.0.0.1:9/webhooks/ordered",
                );
                let read = spec
                    .of_event("ordered", &headers, &body)
                    .expect("no member named twice");
                match (&event.object, event.sequence) {
                    (Some(object), Some(sequence)) => {
                        let read = read.expect("an ordering");
                        assert_eq!(read.key, format!("ordered:{object}"));
                        assert_eq!(read.sequence, sequence);
                        keyed += 1;
                    }
                    _ => assert_eq!(read, None, "{event:?}"),
                }
            }
            assert!(keyed > 100, "{keyed}");
        }
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
                let url = "http://127.0.0.1:9/webhooks/p";
                let (headers, body) = request(provider, event, &[], kind, 0, now, url);
                let signed = inbox_signature::Request::post(&headers, &body).at(url);
                assert!(
                    provider
                        .scheme
                        .verify(&signed, &provider.keys, now)
                        .is_err(),
                    "{} {kind:?} verified",
                    event.provider
                );
            }
        }
    }

    #[test]
    fn batch_requests_carry_their_companions_items_as_their_own_events() {
        let providers = Providers::parse(
            "[providers.hubspot]\nscheme = \"hubspot\"\nsecrets = [{ env = \"X\" }]\n\
             [providers.meta]\nscheme = \"meta\"\nsecrets = [{ env = \"X\" }]\n",
            Path::new("providers.toml"),
            &|_| Some("batch-secret".to_owned()),
        )
        .expect("valid providers");
        let plan = Plan::new(&providers, &[], &Mix::default(), 200, 5, "batch").expect("plan");
        let url = "http://127.0.0.1:9/webhooks/p";
        let now = 1_700_000_000;
        let mut seen = 0;
        for event in plan.events.iter().filter(|e| !e.batch_with.is_empty()) {
            let provider = providers.get(&event.provider).expect("provider");
            let companions: Vec<&PlannedEvent> =
                event.batch_with.iter().map(|&i| &plan.events[i]).collect();
            let (headers, body) = request(
                provider,
                event,
                &companions,
                DeliveryKind::Genuine,
                0,
                now,
                url,
            );
            let signed = inbox_signature::Request::post(&headers, &body).at(url);
            provider
                .scheme
                .verify(&signed, &provider.keys, now)
                .expect("verifies");
            let ids: Vec<String> = identify(&provider.identity, &headers, &body)
                .expect("identified")
                .into_iter()
                .map(|e| e.event_id)
                .collect();
            let expected: Vec<String> = std::iter::once(event)
                .chain(companions.iter().copied())
                .map(|e| e.event_id.clone())
                .collect();
            assert_eq!(ids, expected, "{}", event.provider);
            seen += 1;
        }
        assert!(seen > 10, "only {seen} batches with companions");
    }
}
