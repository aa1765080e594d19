//! Twilio: `X-Twilio-Signature: <base64 HMAC-SHA1(auth token, data)>`, where data is the full
//! URL Twilio called followed, for form POSTs, by every parameter sorted by name as
//! `name + value` (no separators). JSON bodies are signed through the URL instead: it carries
//! `bodySHA256=<hex SHA-256 of the body>` and no parameters are appended. Requests with
//! `X-Twilio-Webhooks-Signature-Settings: ...algorithm=HMAC_SHA256` use HMAC-SHA256.
//!
//! Behind a load balancer the receiver cannot see the URL Twilio called: configure
//! `public_url`. As twilio-node 6 does, the URL is tried as received with and without its
//! default port (`:443`, `:80`), then normalised (WHATWG: `'` becomes `%27` in the query) and
//! with its query re-encoded the way Node's legacy `querystring` does. No timestamp.
//! Event id `I-Twilio-Idempotency-Token`.

use sha2::Digest as _;
use subtle::ConstantTimeEq;

use crate::family::first_match;
use crate::parse::DIGEST_BASE64;
use crate::providers::{fields, Options};
use crate::{
    Algorithm, Field, KeyError, Outgoing, Profile, Request, Scheme, SignError, Signed, SigningKey,
    Verified, VerifyError,
};
use base64::Engine as _;

/// The signature header.
pub const HEADER: &str = "x-twilio-signature";
/// The header naming the algorithm of SharedKey webhooks.
pub const SETTINGS: &str = "x-twilio-webhooks-signature-settings";

/// The Twilio scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Twilio;

/// Builds the scheme (no options).
///
/// # Errors
/// Never; the signature is the catalog's.
pub fn build(_: &Options) -> Result<Box<dyn Scheme>, String> {
    Ok(Box::new(Twilio))
}

/// The URL split as twilio-node's `splitUrl` does, without normalising anything.
struct UrlParts<'a> {
    scheme: &'a str,
    user_info: &'a str,
    host: &'a str,
    port: &'a str,
    rest: &'a str,
}

fn split_url(url: &str) -> Option<UrlParts<'_>> {
    let separator = url.find("://")?;
    let scheme = &url[..separator + 3];
    let name = &scheme[..separator];
    let valid_scheme = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c));
    if !valid_scheme {
        return None;
    }
    let after = &url[separator + 3..];
    let authority_end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let authority = &after[..authority_end];
    let user_info_end = authority.rfind('@').map_or(0, |at| at + 1);
    let host_and_port = &authority[user_info_end..];
    let bracket = host_and_port.rfind(']').map_or(0, |b| b + 1);
    let port_start = host_and_port[bracket..].find(':').map(|p| p + bracket);
    let (host, port) = match port_start {
        Some(start) => host_and_port.split_at(start),
        None => (host_and_port, ""),
    };
    Some(UrlParts {
        scheme,
        user_info: &authority[..user_info_end],
        host,
        port,
        rest: &after[authority_end..],
    })
}

fn with_port(url: &str) -> String {
    match split_url(url) {
        Some(parts) if parts.port.is_empty() => {
            let port = if parts.scheme.eq_ignore_ascii_case("https://") {
                ":443"
            } else {
                ":80"
            };
            format!(
                "{}{}{}{port}{}",
                parts.scheme, parts.user_info, parts.host, parts.rest
            )
        }
        _ => url.to_owned(),
    }
}

fn without_port(url: &str) -> String {
    match split_url(url) {
        Some(parts) => format!(
            "{}{}{}{}",
            parts.scheme, parts.user_info, parts.host, parts.rest
        ),
        None => url.to_owned(),
    }
}

/// Characters Node's `querystring.escape` leaves alone.
const LEGACY_UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'!')
    .remove(b'~')
    .remove(b'*')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')');

/// The URL with its query parsed and written again as Node's legacy `querystring` does.
fn with_legacy_query(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    if query.is_empty() {
        return url.to_owned();
    }
    let mut keys: Vec<String> = Vec::new();
    let mut values: std::collections::HashMap<String, Vec<String>> =
        std::collections::HashMap::new();
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let key = key.into_owned();
        if !values.contains_key(&key) {
            keys.push(key.clone());
        }
        values.entry(key).or_default().push(value.into_owned());
    }
    let escape =
        |text: &str| percent_encoding::utf8_percent_encode(text, LEGACY_UNRESERVED).to_string();
    let pairs: Vec<String> = keys
        .iter()
        .flat_map(|key| {
            values
                .get(key)
                .into_iter()
                .flatten()
                .map(move |value| format!("{}={}", escape(key), escape(value)))
        })
        .collect();
    format!("{base}?{}", pairs.join("&"))
}

/// Every spelling of `url` twilio-node accepts, in its order.
#[must_use]
pub fn candidate_urls(url: &str) -> Vec<String> {
    let mut candidates = vec![without_port(url), with_port(url)];
    if let Ok(parsed) = url::Url::parse(url) {
        let normalized = parsed.to_string();
        let bare = without_port(&normalized);
        let ported = with_port(&normalized);
        candidates.extend([
            with_legacy_query(&bare),
            with_legacy_query(&ported),
            bare,
            ported,
        ]);
    }
    let mut unique = Vec::with_capacity(candidates.len());
    for candidate in candidates {
        if !unique.contains(&candidate) {
            unique.push(candidate);
        }
    }
    unique
}

/// The most form parameters a signed body may carry.
pub const MAX_FORM_PARAMS: usize = 1_000;

/// The signed parameters: each name once, sorted, followed by its distinct values, sorted.
/// Sorted as one flat list of pairs: the body is not verified yet, and a map of sets would
/// cost a few hundred bytes for each of a megabyte's worth of distinct names.
#[must_use]
pub fn sorted_params(body: &[u8]) -> String {
    let mut params: Vec<_> = form_urlencoded::parse(body).collect();
    params.sort_unstable();
    params.dedup();
    let mut data = String::with_capacity(body.len());
    for (name, value) in params {
        data.push_str(&name);
        data.push_str(&value);
    }
    data
}

fn query_value(url: &str, name: &str) -> Option<String> {
    let query = url.split_once('?')?.1.split('#').next()?;
    form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}

fn algorithm(request: &Request<'_>) -> Algorithm {
    let settings = request.headers.header(SETTINGS).unwrap_or_default();
    let named = settings.split(',').find_map(|part| {
        let (key, value) = part.split_once('=')?;
        (key.trim() == "algorithm").then(|| value.trim())
    });
    if named.is_some_and(|name| name.eq_ignore_ascii_case("HMAC_SHA256")) {
        Algorithm::Sha256
    } else {
        Algorithm::Sha1
    }
}

impl Scheme for Twilio {
    fn name(&self) -> &'static str {
        "twilio"
    }

    fn signature_headers(&self) -> Vec<&str> {
        vec![HEADER, SETTINGS]
    }

    fn key_from_secret(&self, secret: &str) -> Result<SigningKey, KeyError> {
        SigningKey::from_bytes(secret.as_bytes())
    }

    fn verify(
        &self,
        request: &Request<'_>,
        keys: &[SigningKey],
        _now: i64,
    ) -> Result<Verified, VerifyError> {
        let signature = DIGEST_BASE64
            .decode(request.required(HEADER)?.trim())
            .map_err(|_| VerifyError::MalformedHeader(HEADER.to_owned()))?;
        if request.url.is_empty() {
            return Err(VerifyError::MissingUrl);
        }
        let params = match query_value(request.url, "bodySHA256") {
            Some(expected) => {
                let actual = hex::encode(sha2::Sha256::digest(request.body));
                if !bool::from(actual.as_bytes().ct_eq(expected.as_bytes())) {
                    return Err(VerifyError::NoMatch);
                }
                String::new()
            }
            None => {
                // Twilio posts a few dozen parameters; a body of thousands is refused before
                // they are sorted.
                if request.body.split(|&byte| byte == b'&').count() > MAX_FORM_PARAMS {
                    return Err(VerifyError::MalformedBody(
                        "more form parameters than Twilio sends",
                    ));
                }
                sorted_params(request.body)
            }
        };
        let algorithm = algorithm(request);
        let candidates = candidate_urls(request.url);
        let key_index = candidates
            .iter()
            .find_map(|url| {
                first_match(
                    keys,
                    algorithm,
                    &[url.as_bytes(), params.as_bytes()],
                    std::slice::from_ref(&signature),
                )
                .ok()
            })
            .ok_or(VerifyError::NoMatch)?;
        Ok(Verified {
            key_index,
            timestamp: None,
        })
    }

    fn sign(&self, key: &SigningKey, message: &Outgoing<'_>) -> Result<Signed, SignError> {
        if message.url.is_empty() {
            return Err(SignError::MissingUrl);
        }
        let params = if query_value(message.url, "bodySHA256").is_some() {
            String::new()
        } else {
            sorted_params(message.body)
        };
        let digest = key.hmac(
            Algorithm::Sha1,
            &[message.url.as_bytes(), params.as_bytes()],
        );
        Ok(Signed {
            headers: vec![
                (
                    "i-twilio-idempotency-token".to_owned(),
                    message.id.to_owned(),
                ),
                (HEADER.to_owned(), DIGEST_BASE64.encode(digest)),
            ],
            body: message.body.to_vec(),
        })
    }

    fn profile(&self) -> Profile {
        fields(&[Field::header("i-twilio-idempotency-token")], &[]).signing_url()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::{assert_vector, verify};

    const TOKEN: &str = "12345";
    const FORM: &[u8] = b"CallSid=CA1234567890ABCDE&Caller=%2B14158675310&Digits=1234&From=%2B14158675310&To=%2B18005551212";
    /// The documentation vector (twilio.com/docs/usage/security), reproduced by
    /// `getExpectedTwilioSignature("12345", url, params)` of npm `twilio` 6.3.1.
    const FORM_SIGNATURE: &str = "GvWf1cFY/Q7PnoempGyD5oXAezc=";

    #[test]
    fn twilio_documentation_form_vector_verifies_with_and_without_the_port() {
        let headers = [("X-Twilio-Signature", FORM_SIGNATURE)];
        assert_vector(
            &Twilio,
            TOKEN,
            "https://mycompany.com/myapp.php?foo=1&bar=2",
            &headers,
            FORM,
            0,
        );
        // twilio-node's validateRequest accepts it at the :443 spelling too.
        assert_vector(
            &Twilio,
            TOKEN,
            "https://mycompany.com:443/myapp.php?foo=1&bar=2",
            &headers,
            FORM,
            0,
        );
        assert_eq!(
            verify(
                &Twilio,
                TOKEN,
                "https://mycompany.com/myapp.php?foo=1&bar=3",
                &headers,
                FORM,
                0
            ),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            verify(&Twilio, TOKEN, "", &headers, FORM, 0),
            Err(VerifyError::MissingUrl)
        );
    }

    #[test]
    fn a_signature_made_with_the_port_verifies_without_it() {
        // getExpectedTwilioSignature at "https://mycompany.com:443/...", accepted by
        // validateRequest at the URL without the port (npm twilio 6.3.1).
        let headers = [("X-Twilio-Signature", "5s2PFy0qmPcZucb4eH4b08ZJtL0=")];
        assert_vector(
            &Twilio,
            TOKEN,
            "https://mycompany.com/myapp.php?foo=1&bar=2",
            &headers,
            FORM,
            0,
        );
    }

    #[test]
    fn json_bodies_are_signed_through_body_sha256() {
        // getExpectedBodyHash and getExpectedTwilioSignature of npm twilio 6.3.1, accepted by
        // its validateRequestWithBody.
        let body = br#"{"property": "value", "boolean": true}"#;
        let url = "https://mycompany.com/myapp.php?bodySHA256=0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620";
        let headers = [("X-Twilio-Signature", "y77kIzt2vzLz71DgmJGsen2scGs=")];
        assert_vector(&Twilio, TOKEN, url, &headers, body, 0);
        let tampered = br#"{"property": "value", "boolean": false}"#;
        assert_eq!(
            verify(&Twilio, TOKEN, url, &headers, tampered, 0),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn a_quote_verifies_whether_it_was_signed_raw_or_percent_encoded() {
        // Both accepted by twilio-node 6.3.1's validateRequest at the raw URL.
        let raw = "https://mycompany.com/myapp.php?name=O'Brien";
        for signature in [
            "chiruQx2pfMBVC+crzNOlph5CL4=",
            "PUkY8q9apU1fFBSsyg7y3+3d1Zo=",
        ] {
            assert_vector(
                &Twilio,
                TOKEN,
                raw,
                &[("X-Twilio-Signature", signature)],
                FORM,
                0,
            );
        }
    }

    #[test]
    fn candidates_follow_twilio_node() {
        let urls = candidate_urls("https://user:pw@[::1]:8443/p?q='a b'");
        assert_eq!(urls[0], "https://user:pw@[::1]/p?q='a b'");
        assert_eq!(urls[1], "https://user:pw@[::1]:8443/p?q='a b'");
        assert!(
            urls.contains(&"https://user:pw@[::1]:8443/p?q=%27a%20b%27".to_owned()),
            "{urls:?}"
        );
        assert!(
            urls.contains(&"https://user:pw@[::1]:8443/p?q='a%20b'".to_owned()),
            "{urls:?}"
        );
    }

    #[test]
    fn repeated_parameters_are_sorted_and_deduplicated() {
        assert_eq!(sorted_params(b"b=2&a=9&b=1&b=2"), "a9b1b2");
        assert_eq!(sorted_params(b""), "");
    }
}
