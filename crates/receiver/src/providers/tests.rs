//! Tests of the provider file.

use std::path::Path;
use std::time::Duration;

use super::*;

fn parse(text: &str) -> Result<Providers, ConfigError> {
    Providers::parse(text, Path::new("providers.toml"), &|var| match var {
        "SECRET" => Some("s3cr3t-value".to_owned()),
        "WHSEC" => Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()),
        _ => None,
    })
}

#[test]
fn every_scheme_parses_with_its_defaults() {
    let providers = parse(
        r#"
        [providers.stripe]
        scheme = "stripe"
        secrets = [{ env = "SECRET" }]
        [providers.github]
        scheme = "github"
        secrets = [{ env = "SECRET", name = "current" }, { env = "SECRET" }]
        [providers.svix]
        scheme = "standard-webhooks"
        secrets = [{ env = "WHSEC" }]
        tolerance = "2m"
        [providers.shopify]
        scheme = "shopify"
        secrets = [{ env = "SECRET" }]
        [providers.slack]
        scheme = "slack"
        secrets = [{ env = "SECRET" }]
        [providers.acme]
        scheme = "hmac-sha256"
        signature_header = "X-Acme-Signature"
        event_id = { header = "X-Acme-Id" }
        secrets = [{ env = "SECRET" }]
        "#,
    )
    .expect("valid file");
    let names: Vec<&str> = providers.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["acme", "github", "shopify", "slack", "stripe", "svix"]
    );
    let stripe = providers.get("stripe").expect("stripe");
    assert_eq!(stripe.scheme.tolerance(), Some(Duration::from_secs(300)));
    let svix = providers.get("svix").expect("svix");
    assert_eq!(svix.scheme.tolerance(), Some(Duration::from_secs(120)));
    let github = providers.get("github").expect("github");
    assert_eq!(github.key_names, ["current", "1"]);
    let slack = providers.get("slack").expect("slack");
    assert_eq!(
        slack.identity,
        Identity::Slack {
            form_id_field: "trigger_id".into()
        }
    );
}

#[test]
fn a_standard_webhooks_secret_must_be_whsec_base64_and_is_never_echoed() {
    let err = parse(
        "[providers.svix]\nscheme = \"standard-webhooks\"\nsecrets = [{ env = \"SECRET\" }]\n",
    )
    .expect_err("not base64");
    assert!(err.to_string().contains("svix"), "{err}");
    assert!(!err.to_string().contains("s3cr3t"), "secret leaked: {err}");
}

#[test]
fn a_provider_without_secrets_fails_unless_marked_unsigned() {
    let err = parse("[providers.x]\nscheme = \"github\"\n").expect_err("no secret");
    assert!(err.to_string().contains("no secret configured"), "{err}");
    let providers = parse("[providers.x]\nscheme = \"github\"\nunsigned = true\n")
        .expect("unsigned is allowed");
    assert!(providers.get("x").is_some_and(|p| p.unsigned));
}

#[test]
fn a_missing_environment_variable_is_named_and_the_value_never_shown() {
    let err = parse("[providers.x]\nscheme = \"github\"\nsecrets = [{ env = \"NOPE\" }]\n")
        .expect_err("unset variable");
    assert_eq!(
        err.to_string(),
        "provider \"x\": environment variable NOPE is not set"
    );
}

#[test]
fn fields_of_other_schemes_and_unknown_fields_are_rejected() {
    let err = parse(
        "[providers.x]\nscheme = \"github\"\nsecrets = [{ env = \"SECRET\" }]\nprefix = \"v=\"\n",
    )
    .expect_err("prefix on github");
    assert!(err.to_string().contains("signature_header"), "{err}");
    let err = parse("[providers.x]\nscheme = \"github\"\nsecret = \"inline\"\n")
        .expect_err("unknown field");
    assert!(err.to_string().contains("unknown field"), "{err}");
    assert!(!err.to_string().contains("inline"), "value leaked: {err}");
}

#[test]
fn generic_scheme_requires_header_and_event_id() {
    let err =
        parse("[providers.x]\nscheme = \"hmac-sha256\"\nunsigned = true\n").expect_err("no header");
    assert!(err.to_string().contains("signature_header"), "{err}");
    let err = parse(
        "[providers.x]\nscheme = \"hmac-sha256\"\nunsigned = true\nsignature_header = \"X-Sig\"\n",
    )
    .expect_err("no event id");
    assert!(err.to_string().contains("event_id"), "{err}");
}

#[test]
fn the_example_file_parses_as_shipped_and_with_every_provider_uncommented() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/providers.example.toml");
    let text = std::fs::read_to_string(&example).expect("example file");
    let env = |var: &str| match var {
        "SVIX_WEBHOOK_SECRET" => Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()),
        "ADYEN_HMAC_KEY" => {
            Some("DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00".to_owned())
        }
        "POSTMARK_WEBHOOK_CREDENTIALS" => Some("hooks:password".to_owned()),
        _ => Some(format!("value of {var}")),
    };
    let shipped = Providers::parse(&text, &example, &env).expect("shipped example");
    assert_eq!(shipped.iter().count(), 1);

    // The commented providers are documentation: they must stay valid too.
    let is_setting = |line: &str| {
        line.split_once(" = ").is_some_and(|(key, _)| {
            !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        })
    };
    let uncommented: String = text
        .lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(rest) if rest.starts_with("[providers.") || is_setting(rest) => rest,
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let folder = std::env::temp_dir().join(format!("providers-example-{}", std::process::id()));
    std::fs::create_dir_all(folder.join("secrets")).expect("temp folder");
    std::fs::write(folder.join("secrets/stripe-previous"), "whsec_old\n").expect("secret");
    let parsed = Providers::parse(&uncommented, &folder.join("providers.toml"), &env);
    std::fs::remove_dir_all(&folder).expect("cleanup");
    let all = parsed.expect("every example provider");
    let names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "acme",
            "adyen",
            "calendly",
            "demo",
            "discord",
            "discord-events",
            "dropbox",
            "github",
            "gitlab",
            "hubspot",
            "intercom",
            "jira",
            "linear",
            "mailgun",
            "meta",
            "paddle",
            "postmark",
            "razorpay",
            "sendgrid",
            "shopify",
            "slack",
            "square",
            "stripe",
            "svix",
            "svix-ed25519",
            "twilio",
            "twitch",
            "typeform",
            "woocommerce",
            "zoom"
        ]
    );
    assert_eq!(all.iter().count(), 30);
    let stripe = all.get("stripe").expect("stripe");
    assert_eq!(stripe.key_names, ["current", "previous"]);

    // Replays are suppressed by default exactly where a seen delivery could be sent again
    // under a fresh id: the id comes from a header the signature does not cover, timestamped
    // or not (linear, acme), or the signature covers a nonce and not the body (mailgun: a copy
    // reuses the token). Not where the id is in the signed body (demo, typeform, intercom,
    // stripe: a copy is a duplicate) or a signed header (svix, twitch), the URL is signed, a
    // static credential is compared, or there is no id at all (dropbox, whose identical bodies
    // are legitimate).
    let suppressing: Vec<&str> = all
        .iter()
        .filter(|provider| provider.suppress_replays)
        .map(|provider| provider.name.as_str())
        .collect();
    assert_eq!(
        suppressing,
        [
            "acme",
            "github",
            "jira",
            "linear",
            "mailgun",
            "razorpay",
            "shopify",
            "woocommerce"
        ]
    );
}

#[test]
fn the_provider_file_can_turn_replay_suppression_on_or_off() {
    let providers = parse(
        r#"
        [providers.github]
        scheme = "github"
        secrets = [{ env = "SECRET" }]
        suppress_replays = false
        [providers.demo]
        scheme = "hmac-sha256"
        signature_header = "X-Signature"
        event_id = { json_pointer = "/id" }
        secrets = [{ env = "SECRET" }]
        suppress_replays = true
        [providers.acme]
        scheme = "hmac-sha256"
        signature_header = "X-Acme-Signature"
        event_id = { header = "X-Acme-Id" }
        secrets = [{ env = "SECRET" }]
        [providers.signed-id]
        scheme = "template"
        signature_header = "X-Signature"
        signed = "{id}.{body}"
        id_header = "X-Id"
        event_id = { header = "X-Id" }
        secrets = [{ env = "SECRET" }]
        "#,
    )
    .expect("valid file");
    let suppresses = |name: &str| providers.get(name).expect(name).suppress_replays;
    assert!(!suppresses("github"));
    assert!(suppresses("demo"));
    assert!(suppresses("acme"), "an unsigned id header, by default");
    assert!(!suppresses("signed-id"), "the id is signed");
}

#[test]
fn replays_are_suppressed_where_the_id_is_unsigned_whatever_the_tolerance() {
    let providers = parse(
        r#"
        [providers.linear]
        scheme = "linear"
        secrets = [{ env = "SECRET" }]
        [providers.timestamped]
        scheme = "template"
        signature_header = "X-Signature"
        signed = "{timestamp}.{body}"
        timestamp_header = "X-Timestamp"
        event_id = { header = "X-Delivery" }
        secrets = [{ env = "SECRET" }]
        [providers.signed-id]
        scheme = "template"
        signature_header = "X-Signature"
        signed = "{timestamp}.{id}.{body}"
        timestamp_header = "X-Timestamp"
        id_header = "X-Delivery"
        event_id = { header = "x-delivery" }
        secrets = [{ env = "SECRET" }]
        [providers.other-header]
        scheme = "template"
        signature_header = "X-Signature"
        signed = "{id}.{body}"
        id_header = "X-Delivery"
        event_id = { header = "X-Other" }
        secrets = [{ env = "SECRET" }]
        [providers.stripe]
        scheme = "stripe"
        secrets = [{ env = "SECRET" }]
        [providers.svix]
        scheme = "standard-webhooks"
        secrets = [{ env = "WHSEC" }]
        [providers.twitch]
        scheme = "twitch"
        secrets = [{ env = "SECRET" }]
        "#,
    )
    .expect("valid file");
    let suppresses = |name: &str| providers.get(name).expect(name).suppress_replays;
    assert!(suppresses("linear"), "Linear-Delivery is not signed");
    assert!(
        suppresses("timestamped"),
        "a signed timestamp, an unsigned id"
    );
    assert!(!suppresses("signed-id"), "the id header is signed");
    assert!(
        suppresses("other-header"),
        "the id is read from another header"
    );
    assert!(!suppresses("stripe"), "the id is in the signed body");
    assert!(!suppresses("svix"), "webhook-id is signed");
    assert!(!suppresses("twitch"), "the message id is signed");
}

#[test]
fn provider_names_are_restricted_to_url_safe_lowercase() {
    let err = parse("[providers.\"Bad Name\"]\nscheme = \"github\"\nunsigned = true\n")
        .expect_err("bad name");
    assert!(err.to_string().contains("provider names"), "{err}");
}

#[test]
fn providers_sharing_a_secret_are_named_in_pairs() {
    let providers = parse(
        r#"
        [providers.github]
        scheme = "github"
        secrets = [{ env = "SECRET" }]
        [providers.shopify]
        scheme = "shopify"
        secrets = [{ env = "SECRET" }]
        [providers.svix]
        scheme = "standard-webhooks"
        secrets = [{ env = "WHSEC" }]
        "#,
    )
    .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(providers.sharing_a_key(), vec![("github", "shopify")]);
}

#[test]
fn a_template_timestamp_or_id_header_that_is_not_signed_is_refused_naming_the_provider() {
    let err = parse(
        r#"
        [providers.acme]
        scheme = "template"
        signature_header = "X-Acme-Signature"
        signed = "{body}"
        timestamp_header = "X-Acme-Timestamp"
        event_id = { json_pointer = "/id" }
        secrets = [{ env = "SECRET" }]
        "#,
    )
    .expect_err("an unsigned timestamp");
    let message = err.to_string();
    assert!(message.starts_with("provider \"acme\": "), "{message}");
    assert!(message.contains("{timestamp}"), "{message}");
    let err = parse(
        r#"
        [providers.acme]
        scheme = "template"
        signature_header = "X-Acme-Signature"
        signed = "{timestamp}.{body}"
        timestamp_header = "X-Acme-Timestamp"
        id_header = "X-Acme-Id"
        event_id = { header = "X-Acme-Id" }
        secrets = [{ env = "SECRET" }]
        "#,
    )
    .expect_err("an unsigned id header");
    let message = err.to_string();
    assert!(message.starts_with("provider \"acme\": "), "{message}");
    assert!(message.contains("{id}"), "{message}");
}

#[test]
fn sources_no_request_could_satisfy_are_refused_at_load() {
    let with = |setting: &str| {
        parse(&format!(
            "[providers.x]\nscheme = \"hmac-sha256\"\nsignature_header = \"X-Sig\"\n\
             secrets = [{{ env = \"SECRET\" }}]\n{setting}\n"
        ))
    };
    for (setting, named) in [
        (r#"event_id = { json_pointers = ["id", "type"] }"#, "\"id\""),
        (
            r#"event_id = { json_pointers = ["/id", "type"] }"#,
            "\"type\"",
        ),
        (r#"event_id = { json_pointers = [] }"#, "at least one"),
        (r#"event_id = { json_pointer = "id" }"#, "\"id\""),
        (r#"event_id = { header = "X Bad Name" }"#, "\"X Bad Name\""),
        (
            "event_id = { json_pointer = \"/id\" }\nevent_type = { header = \"X-Type:\" }",
            "\"X-Type:\"",
        ),
    ] {
        let err = with(setting).expect_err(setting);
        let message = err.to_string();
        assert!(message.starts_with("provider \"x\": "), "{message}");
        assert!(message.contains(named), "{setting}: {message}");
    }
    assert!(with(r#"event_id = { header = "X-Acme-Id" }"#).is_ok());
    assert!(with(r#"event_id = { json_pointers = ["/a", "/b"] }"#).is_ok());
    let err = parse(
        "[providers.x]\nscheme = \"template\"\nsignature_header = \"X Sig\"\n\
         event_id = { json_pointer = \"/id\" }\nsecrets = [{ env = \"SECRET\" }]\n",
    )
    .expect_err("a bad signature header");
    assert!(err.to_string().contains("\"X Sig\""), "{err}");
}

#[test]
fn a_zero_tolerance_is_refused_and_one_over_a_day_is_named() {
    let err = parse("[providers.x]\nscheme = \"stripe\"\ntolerance = \"0s\"\nsecrets = [{ env = \"SECRET\" }]\n")
        .expect_err("zero");
    assert!(
        err.to_string().contains("`tolerance` must be more than 0s"),
        "{err}"
    );
    let providers = parse(
        r#"
        [providers.wide]
        scheme = "stripe"
        tolerance = "100years"
        secrets = [{ env = "SECRET" }]
        [providers.day]
        scheme = "stripe"
        tolerance = "1day"
        secrets = [{ env = "SECRET" }]
        "#,
    )
    .expect("wide tolerances load");
    let wide: Vec<&str> = providers
        .wide_tolerances()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(wide, ["wide"]);
}

#[test]
fn a_provider_signing_its_url_without_public_url_is_named() {
    let providers = parse(
        r#"
        [providers.twilio]
        scheme = "twilio"
        secrets = [{ env = "SECRET" }]
        [providers.twilio-pinned]
        scheme = "twilio"
        public_url = "https://hooks.example.com/webhooks/twilio-pinned"
        secrets = [{ env = "SECRET" }]
        [providers.stripe]
        scheme = "stripe"
        secrets = [{ env = "SECRET" }]
        "#,
    )
    .expect("valid file");
    assert_eq!(providers.signing_urls_without_public_url(), ["twilio"]);
}

/// The event ids `provider` (a catalog scheme, unsigned here) gives each of `bodies`.
fn catalog_ids(scheme: &str, bodies: &[serde_json::Value]) -> Vec<String> {
    let providers = parse(&format!(
        "[providers.p]\nscheme = \"{scheme}\"\nunsigned = true\n"
    ))
    .expect("valid file");
    let provider = providers.get("p").expect("provider");
    let headers: Vec<(String, String)> = Vec::new();
    bodies
        .iter()
        .map(|body| {
            let events = crate::identify::identify(
                &provider.identity,
                &headers,
                body.to_string().as_bytes(),
            )
            .unwrap_or_else(|err| panic!("{body}: {err}"));
            events[0].event_id.clone()
        })
        .collect()
}

#[test]
fn postmark_records_of_one_message_are_events_of_their_own() {
    use serde_json::json;
    // Fields as Postmark's webhook models name them (postmark.js models/webhooks/payload).
    let open = |recipient: &str, at: &str| {
        json!({"RecordType": "Open", "MessageID": "m-1", "Recipient": recipient,
               "ReceivedAt": at, "FirstOpen": false})
    };
    let ids = catalog_ids(
        "postmark",
        &[
            open("a@example.com", "2026-12-01T10:00:00.1Z"),
            open("a@example.com", "2026-12-01T10:00:00.1Z"),
            open("b@example.com", "2026-12-01T10:00:00.1Z"),
            open("a@example.com", "2026-12-01T11:00:00.2Z"),
            json!({"RecordType": "Click", "MessageID": "m-1", "Recipient": "a@example.com",
                   "ReceivedAt": "2026-12-01T10:00:00.1Z", "OriginalLink": "https://x"}),
            json!({"RecordType": "Delivery", "MessageID": "m-1", "Recipient": "a@example.com",
                   "DeliveredAt": "2026-12-01T09:59:00Z"}),
            json!({"RecordType": "Delivery", "MessageID": "m-1", "Recipient": "b@example.com",
                   "DeliveredAt": "2026-12-01T09:59:00Z"}),
            json!({"RecordType": "Bounce", "ID": 4323372036854775807_u64, "MessageID": "m-1",
                   "Email": "c@example.com"}),
            json!({"RecordType": "SubscriptionChange", "MessageID": null,
                   "MessageStream": "outbound", "Recipient": "a@example.com",
                   "ChangedAt": "2026-12-01T12:00:00Z"}),
            json!({"MessageID": "inbound-1", "From": "d@example.com"}),
        ],
    );
    assert_eq!(ids[0], ids[1], "a redelivery is the same event");
    let distinct: std::collections::HashSet<&String> = ids[1..].iter().collect();
    assert_eq!(distinct.len(), ids.len() - 1, "{ids:?}");
    assert_eq!(ids[7], "Bounce:4323372036854775807");
    assert_eq!(ids[9], "inbound-1");
}

#[test]
fn zoom_events_of_one_millisecond_are_told_apart_by_their_object() {
    use serde_json::json;
    let joined = |user: &str| {
        json!({"event": "meeting.participant_joined", "event_ts": 1_765_000_000_123_u64,
               "payload": {"object": {"uuid": "mtg==", "id": 851,
                                      "participant": {"user_id": user}}}})
    };
    let ids = catalog_ids(
        "zoom",
        &[
            joined("16778240"),
            joined("16778240"),
            joined("16779264"),
            json!({"event": "meeting.started", "event_ts": 1_765_000_000_123_u64,
                   "payload": {"object": {"uuid": "mtg==", "id": 851}}}),
            json!({"event": "user.updated", "event_ts": 1_765_000_000_123_u64,
                   "payload": {"object": {"id": "u-1"}}}),
            json!({"event": "user.updated", "event_ts": 1_765_000_000_123_u64,
                   "payload": {"object": {"id": "u-2"}}}),
        ],
    );
    assert_eq!(ids[0], ids[1], "a retry is the same event");
    assert_ne!(
        ids[1], ids[2],
        "two participants joining in one millisecond"
    );
    assert_eq!(ids[3], "meeting.started:1765000000123:mtg==");
    assert_ne!(ids[4], ids[5]);
}

#[test]
fn discord_webhook_events_are_told_apart_by_type_time_and_object() {
    use serde_json::json;
    // Shapes of discord-api-docs' Webhook Events (developers/events/webhook-events.mdx).
    let event = |kind: &str, at: &str, data: serde_json::Value| {
        json!({"version": 1, "application_id": "1234", "type": 1,
               "event": {"type": kind, "timestamp": at, "data": data}})
    };
    let ids = catalog_ids(
        "discord-events",
        &[
            event(
                "ENTITLEMENT_CREATE",
                "2026-12-01T10:00:00.123456",
                json!({"id": "e-1"}),
            ),
            event(
                "ENTITLEMENT_CREATE",
                "2026-12-01T10:00:00.123456",
                json!({"id": "e-1"}),
            ),
            event(
                "ENTITLEMENT_CREATE",
                "2026-12-01T10:00:00.123456",
                json!({"id": "e-2"}),
            ),
            event(
                "APPLICATION_AUTHORIZED",
                "2026-12-01T10:00:00.123456",
                json!({"user": {"id": "u-1"}, "guild": {"id": "g-1"}, "scopes": ["bot"]}),
            ),
            event(
                "APPLICATION_AUTHORIZED",
                "2026-12-01T10:00:00.123456",
                json!({"user": {"id": "u-1"}, "scopes": ["applications.commands"]}),
            ),
        ],
    );
    assert_eq!(ids[0], ids[1], "a retry is the same event");
    assert_eq!(ids[0], "ENTITLEMENT_CREATE:2026-12-01T10:00:00.123456:e-1");
    let distinct: std::collections::HashSet<&String> = ids[1..].iter().collect();
    assert_eq!(distinct.len(), ids.len() - 1, "{ids:?}");
}
