//! The provider catalog: one module per provider, each with its scheme, its profile and the
//! vectors that pin it, and one table ([`CATALOG`]) that names them.
//!
//! Adding a provider is one file here and one line in [`CATALOG`]: a module with a `build`
//! function turning the provider file's [`Options`] into its [`Scheme`].

use std::sync::Arc;
use std::time::Duration;

use crate::family::template::{parse_signed, KeyEncoding, Template, TimestampSpec};
use crate::time::TimestampFormat;
use crate::{Algorithm, DigestEncoding, Field, Profile, Scheme};

pub mod adyen;
pub mod calendly;
pub mod discord;
pub mod dropbox;
pub mod github;
pub mod gitlab;
pub mod hubspot;
pub mod intercom;
pub mod jira;
pub mod linear;
pub mod mailgun;
pub mod meta;
pub mod paddle;
pub mod postmark;
pub mod razorpay;
pub mod sendgrid;
pub mod shopify;
pub mod slack;
pub mod square;
pub mod standard_webhooks;
pub mod stripe;
pub mod twilio;
pub mod twitch;
pub mod typeform;
pub mod woocommerce;
pub mod zoom;

#[cfg(test)]
pub(crate) mod testing;

/// What the provider file may say about a scheme beyond its secrets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// Accepted clock distance of the signed timestamp, both ways (timestamped schemes only).
    pub tolerance: Option<Duration>,
    /// The description of a `template` (or `hmac-sha256`) provider.
    pub template: Option<TemplateOptions>,
    /// Meta's verify token, compared (in constant time) with `hub.verify_token` of the
    /// subscription handshake.
    pub verify_token: Option<String>,
}

/// A user-described HMAC provider (scheme `template`, and `hmac-sha256` as its simplest case).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateOptions {
    /// The header carrying the digest.
    pub signature_header: String,
    /// The signed string, such as `{timestamp}.{body}`; `{body}` when absent.
    pub signed: Option<String>,
    /// The hash under the HMAC (`hmac-sha256`: always SHA-256).
    pub algorithm: Algorithm,
    /// How the digest is written.
    pub encoding: DigestEncoding,
    /// Text in front of the digest, required when set.
    pub prefix: Option<String>,
    /// The header carrying the timestamp, when `signed` has `{timestamp}`.
    pub timestamp_header: Option<String>,
    /// How the timestamp is written.
    pub timestamp_format: TimestampFormat,
    /// The header carrying the message id, when `signed` has `{id}`.
    pub id_header: Option<String>,
    /// Whether the secret is hexadecimal (the key is then its decoded bytes).
    pub hex_key: bool,
}

/// A catalog entry: a scheme name and how to build it.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// The name used in the provider file's `scheme = "..."`.
    pub name: &'static str,
    /// Builds the scheme from the provider file's options.
    pub build: fn(&Options) -> Result<Box<dyn Scheme>, String>,
}

/// Every scheme, by configuration name.
pub const CATALOG: &[Entry] = &[
    Entry {
        name: "adyen",
        build: adyen::build,
    },
    Entry {
        name: "calendly",
        build: calendly::build,
    },
    Entry {
        name: "discord",
        build: discord::build,
    },
    Entry {
        name: "discord-events",
        build: discord::build_events,
    },
    Entry {
        name: "dropbox",
        build: dropbox::build,
    },
    Entry {
        name: "github",
        build: github::build,
    },
    Entry {
        name: "gitlab",
        build: gitlab::build,
    },
    Entry {
        name: "hmac-sha256",
        build: build_hmac_sha256,
    },
    Entry {
        name: "hubspot",
        build: hubspot::build,
    },
    Entry {
        name: "intercom",
        build: intercom::build,
    },
    Entry {
        name: "jira",
        build: jira::build,
    },
    Entry {
        name: "linear",
        build: linear::build,
    },
    Entry {
        name: "mailgun",
        build: mailgun::build,
    },
    Entry {
        name: "meta",
        build: meta::build,
    },
    Entry {
        name: "paddle",
        build: paddle::build,
    },
    Entry {
        name: "postmark",
        build: postmark::build,
    },
    Entry {
        name: "razorpay",
        build: razorpay::build,
    },
    Entry {
        name: "sendgrid",
        build: sendgrid::build,
    },
    Entry {
        name: "shopify",
        build: shopify::build,
    },
    Entry {
        name: "slack",
        build: slack::build,
    },
    Entry {
        name: "square",
        build: square::build,
    },
    Entry {
        name: "standard-webhooks",
        build: standard_webhooks::build,
    },
    Entry {
        name: "stripe",
        build: stripe::build,
    },
    Entry {
        name: "template",
        build: build_template,
    },
    Entry {
        name: "twilio",
        build: twilio::build,
    },
    Entry {
        name: "twitch",
        build: twitch::build,
    },
    Entry {
        name: "typeform",
        build: typeform::build,
    },
    Entry {
        name: "woocommerce",
        build: woocommerce::build,
    },
    Entry {
        name: "zoom",
        build: zoom::build,
    },
];

/// The scheme called `name`, built from `options`.
///
/// # Errors
/// A message for an unknown name, or options the scheme does not take.
pub fn build(name: &str, options: &Options) -> Result<Arc<dyn Scheme>, String> {
    let entry = CATALOG
        .iter()
        .find(|entry| entry.name == name)
        .ok_or_else(|| format!("unknown scheme {name:?}"))?;
    let is_template = matches!(name, "template" | "hmac-sha256");
    if options.template.is_some() && !is_template {
        return Err("`signature_header` and the template settings apply only to schemes template and hmac-sha256".into());
    }
    if options.verify_token.is_some() && name != "meta" {
        return Err("`verify_token` applies only to scheme meta".into());
    }
    let scheme = (entry.build)(options)?;
    if options.tolerance.is_some() && scheme.tolerance().is_none() {
        return Err(format!(
            "`tolerance` applies only to schemes that sign a timestamp, not {name}"
        ));
    }
    Ok(Arc::from(scheme))
}

/// The configured tolerance, or `default`.
pub(crate) fn tolerance_or(options: &Options, default: Duration) -> Duration {
    options.tolerance.unwrap_or(default)
}

fn build_template(options: &Options) -> Result<Box<dyn Scheme>, String> {
    Ok(Box::new(user_template("template", options)?))
}

/// The original generic scheme: HMAC-SHA256 of the body alone in one header.
fn build_hmac_sha256(options: &Options) -> Result<Box<dyn Scheme>, String> {
    let described = options
        .template
        .as_ref()
        .ok_or("scheme hmac-sha256 needs `signature_header`")?;
    if described
        .signed
        .as_deref()
        .is_some_and(|signed| signed != "{body}")
        || described.algorithm != Algorithm::Sha256
        || described.timestamp_header.is_some()
        || described.id_header.is_some()
    {
        return Err(
            "scheme hmac-sha256 signs the body alone with SHA-256: use scheme template for more"
                .into(),
        );
    }
    Ok(Box::new(user_template("hmac-sha256", options)?))
}

/// A template described in the provider file. Its event id and type come from the provider
/// file too (`event_id`, `event_type`), so the profile here is empty.
fn user_template(name: &'static str, options: &Options) -> Result<Template, String> {
    let described = options
        .template
        .as_ref()
        .ok_or_else(|| format!("scheme {name} needs `signature_header`"))?;
    let signed = parse_signed(described.signed.as_deref().unwrap_or("{body}"))?;
    let timestamp = described
        .timestamp_header
        .as_ref()
        .map(|header| TimestampSpec {
            header: header.to_ascii_lowercase(),
            format: described.timestamp_format,
            tolerance: tolerance_or(options, crate::DEFAULT_TOLERANCE),
        });
    let template = Template {
        name,
        header: described.signature_header.to_ascii_lowercase(),
        prefix: described.prefix.clone(),
        encoding: described.encoding,
        algorithm: described.algorithm,
        signed,
        timestamp,
        id_header: described.id_header.as_ref().map(|h| h.to_ascii_lowercase()),
        key_encoding: if described.hex_key {
            KeyEncoding::Hex
        } else {
            KeyEncoding::Text
        },
        profile: Profile::fields(Vec::new(), Vec::new()),
    };
    template.check()?;
    Ok(template)
}

/// Shorthand for the profiles of the modules: id and type from these fields.
pub(crate) fn fields(event_id: &[Field], event_type: &[Field]) -> Profile {
    Profile::fields(event_id.to_vec(), event_type.to_vec())
}

/// Implements [`Scheme`] for a newtype around a [`Template`] by delegating everything but the
/// methods given in the block (typically `handshake`).
macro_rules! template_scheme {
    ($type:ty { $($extra:item)* }) => {
        impl $crate::Scheme for $type {
            fn name(&self) -> &'static str {
                self.0.name
            }

            fn tolerance(&self) -> Option<std::time::Duration> {
                $crate::Scheme::tolerance(&self.0)
            }

            fn signature_headers(&self) -> Vec<&str> {
                self.0.headers()
            }

            fn signed_headers(&self) -> Vec<&str> {
                self.0.signed_headers()
            }

            fn key_from_secret(&self, secret: &str) -> Result<$crate::SigningKey, $crate::KeyError> {
                self.0.key(secret)
            }

            fn verify(
                &self,
                request: &$crate::Request<'_>,
                keys: &[$crate::SigningKey],
                now_unix: i64,
            ) -> Result<$crate::Verified, $crate::VerifyError> {
                self.0.verify_request(request, keys, now_unix)
            }

            fn sign(
                &self,
                key: &$crate::SigningKey,
                message: &$crate::Outgoing<'_>,
            ) -> Result<$crate::Signed, $crate::SignError> {
                self.0.sign_message(key, message)
            }

            fn profile(&self) -> $crate::Profile {
                self.0.profile.clone()
            }

            $($extra)*
        }
    };
}
pub(crate) use template_scheme;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_is_sorted_unique_and_every_entry_builds_by_its_own_name() {
        let names: Vec<&str> = CATALOG.iter().map(|entry| entry.name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted);
        let template = Options {
            template: Some(TemplateOptions {
                signature_header: "X-Signature".into(),
                signed: None,
                algorithm: Algorithm::Sha256,
                encoding: DigestEncoding::Hex,
                prefix: None,
                timestamp_header: None,
                timestamp_format: TimestampFormat::UnixSeconds,
                id_header: None,
                hex_key: false,
            }),
            ..Options::default()
        };
        for entry in CATALOG {
            let options = if matches!(entry.name, "template" | "hmac-sha256") {
                template.clone()
            } else {
                Options::default()
            };
            let scheme = build(entry.name, &options).expect("builds with defaults");
            assert_eq!(scheme.name(), entry.name);
        }
        assert!(CATALOG.len() >= 28);
    }

    #[test]
    fn options_of_other_schemes_are_refused() {
        let tolerance = Options {
            tolerance: Some(Duration::from_secs(1)),
            ..Options::default()
        };
        assert!(build("github", &tolerance).is_err_and(|e| e.contains("tolerance")));
        assert!(build("stripe", &tolerance).is_ok());
        let token = Options {
            verify_token: Some("t".into()),
            ..Options::default()
        };
        assert!(build("github", &token).is_err_and(|e| e.contains("verify_token")));
        assert!(build("nope", &Options::default()).is_err_and(|e| e.contains("unknown")));
    }
}
