//! The provider file's format, as `receiver serve --help` and `receiver check-config --help`
//! show it.

/// The provider file's format, shown by `receiver serve --help` and `receiver check-config --help`.
pub const PROVIDER_FILE_HELP: &str = r#"PROVIDER FILE (--config, TOML)
One table per provider; its name is the URL path (POST /webhooks/<name>) and the first half of
the dedup key. Names: 1-64 characters of a-z, 0-9, '-' and '_'.

  [providers.<name>]
  scheme = "stripe" | "github" | "standard-webhooks" | "shopify" | "slack" | "twilio" | "square"
         | "paddle" | "mailgun" | "sendgrid" | "discord" | "discord-events" | "zoom" | "linear"
         | "intercom" | "gitlab" | "adyen" | "hubspot" | "typeform" | "calendly" | "twitch"
         | "woocommerce" | "razorpay" | "meta" | "dropbox" | "jira" | "postmark" | "template"
         | "hmac-sha256"
  secrets = [{ env = "VAR", name = "current" }, { file = "path", name = "previous" }]
      Tried in order (rotation). Each secret comes from exactly one environment variable or
      file (relative to the provider file; a trailing newline is ignored). `name` labels it in
      inbox_receiver_signature_verified_total{provider,secret} (default: its position).
      Standard Webhooks secrets are written whsec_<base64>; Stripe's whsec_ string is used whole;
      Adyen's HMAC key is hex; gitlab's is the token; postmark's is user:password.
  public_keys = ["..."]      discord, discord-events (hex), sendgrid (base64 DER),
                             standard-webhooks (whpk_...):
                             public keys, inline; never fetched at request time
  unsigned = true            accept unverified requests (local development only; no secrets)
  tolerance = "5m"           schemes with a signed timestamp: accepted clock distance, both ways
                             (defaults: 5m; paddle 5s, linear 60s, twitch 10m; more than 0s,
                             and check-config warns past a day)
  public_url = "https://..." twilio, square, hubspot: the URL the provider calls (and signs);
                             without it the URL is rebuilt from the request's Host and path
  verify_token = { env = "VAR" }   meta: the token of the GET hub.challenge handshake
  event_id = { json_pointer = "/id" } | { header = "X-Id" } | { form_field = "Sid" }
           | { json_pointers = ["/a", "/b"] }      override where the event id is
  event_type = { ... }       the same, for the event type
  answer = "[accepted]"      the body answered for a stored event (default: JSON status)
  drop_headers = ["x-..."]   headers not to store, beyond Authorization, Cookie and the like
  keep_headers = ["x-..."]   store only these headers
  form_event_id_field = "trigger_id"
                             slack: the form field that keys form-encoded bodies (slash commands)
  suppress_replays = true | false
                             a body already stored under another id (same type, within the
                             dedup window) is a replay: stored apart, answered 200, never
                             processed until `worker release`. Default: on where a seen delivery
                             could be sent again under a fresh id (the id may come from a header
                             the signature does not cover, timestamp or not: github, shopify,
                             woocommerce, linear, ...; mailgun, whose signed token seen again
                             under another id marks the copy); off elsewhere

  [providers.<name>.ordering]      opt-in: one event at a time per key, in sequence order
  key = { json_pointer = "/data/object/id" } | { header = "X-Entity" }
                             the ordering key; an event without one is processed unordered
  sequence = { json_pointer = "/created" }   optional: an integer (version, Unix time) or an
                             RFC 3339 time; within a key, lower first (missing: 0); without
                             it, arrival order
  reorder_window = "2s"      optional: each event waits this long after receipt, so an earlier
                             one still in flight can slot in before it (default 0, at most 1h)
  on_stale = "mark" | "skip" a late arrival (lower sequence than one of its key already done):
                             handed over with Event::stale set, or completed unhandled
  on_dead = "block" | "release"   a dead head keeps its key blocked until `worker replay` or
                             `worker skip`, or frees it for the key's next event

  Scheme "template" (an unlisted HMAC provider, described here; needs event_id):
  signature_header = "X-Signature"
  signed = "{timestamp}.{body}"     parts {method} {url} {timestamp} {id} {body}; default {body}
  algorithm = "sha1" | "sha256" | "sha512"         (default sha256)
  encoding = "hex" | "base64"                      (default hex)
  prefix = "sha256="                               (optional; required in the header when set)
  timestamp_header = "X-Timestamp"                 for {timestamp} (required by it, refused without
                                                   it), with timestamp_format = "unix" | "unix-ms" | "rfc3339"
  id_header = "X-Delivery"                         for {id} (required by it, refused without it)
  hex_key = true                                   the secret is hex; the key its bytes
  Scheme "hmac-sha256" is its simplest case: signature_header, encoding, prefix, event_id.

Event ids by default: each scheme's documented delivery id (see the README's provider table).
A provider without secrets is refused at start-up unless `unsigned = true`.
Example: config/providers.example.toml."#;
