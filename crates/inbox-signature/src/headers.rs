//! Read access to request headers, independent of any HTTP framework.
//!
//! The receiver adapts its framework's header map to [`HeaderSource`]; tests and the simulator
//! use the implementations for plain lists of name/value pairs provided here.

/// Header names used by the schemes, in the lowercase form HTTP/2 sends them.
///
/// Lookups through [`HeaderSource`] are case-insensitive, so these also find the mixed-case
/// spellings providers document.
pub mod header_names {
    /// Stripe's `t=...,v1=...` header.
    pub const STRIPE_SIGNATURE: &str = "stripe-signature";
    /// GitHub's SHA-256 signature header (`sha256=<hex>`).
    pub const GITHUB_SIGNATURE_256: &str = "x-hub-signature-256";
    /// Standard Webhooks message id.
    pub const WEBHOOK_ID: &str = "webhook-id";
    /// Standard Webhooks timestamp (unix seconds).
    pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
    /// Standard Webhooks signature list (`v1,<base64> ...`).
    pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";
    /// Svix's spelling of [`WEBHOOK_ID`].
    pub const SVIX_ID: &str = "svix-id";
    /// Svix's spelling of [`WEBHOOK_TIMESTAMP`].
    pub const SVIX_TIMESTAMP: &str = "svix-timestamp";
    /// Svix's spelling of [`WEBHOOK_SIGNATURE`].
    pub const SVIX_SIGNATURE: &str = "svix-signature";
    /// Shopify's base64 signature header.
    pub const SHOPIFY_HMAC_SHA256: &str = "x-shopify-hmac-sha256";
    /// Slack's `v0=<hex>` signature header.
    pub const SLACK_SIGNATURE: &str = "x-slack-signature";
    /// Slack's timestamp header (unix seconds).
    pub const SLACK_REQUEST_TIMESTAMP: &str = "x-slack-request-timestamp";
}

/// Read access to request headers; names are matched case-insensitively by the implementor.
///
/// When a header appears several times, the implementations in this crate return the first
/// occurrence. The receiver is expected to reject requests that repeat one of
/// [`Scheme::signature_headers`](crate::Scheme::signature_headers) before verifying, because
/// which copy a verifier reads is otherwise an ambiguity an attacker could play with.
pub trait HeaderSource {
    /// The value of the header `name`, or `None` when it is absent.
    fn header(&self, name: &str) -> Option<&str>;
}

impl<T: HeaderSource + ?Sized> HeaderSource for &T {
    fn header(&self, name: &str) -> Option<&str> {
        (**self).header(name)
    }
}

impl HeaderSource for [(&str, &str)] {
    fn header(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(candidate, _)| candidate.eq_ignore_ascii_case(name))
            .map(|(_, value)| *value)
    }
}

// Arrays are listed separately because a slice is unsized and cannot become `&dyn HeaderSource`,
// while `&[("name", "value")]` in a test is an array reference.
impl<const N: usize> HeaderSource for [(&str, &str); N] {
    fn header(&self, name: &str) -> Option<&str> {
        self.as_slice().header(name)
    }
}

impl HeaderSource for [(String, String)] {
    fn header(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(candidate, _)| candidate.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

impl HeaderSource for Vec<(String, String)> {
    fn header(&self, name: &str) -> Option<&str> {
        self.as_slice().header(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn str_pairs_are_looked_up_case_insensitively_and_first_wins() {
        let headers = [
            ("Stripe-Signature", "first"),
            ("stripe-signature", "second"),
        ];
        assert_eq!(headers.header("STRIPE-SIGNATURE"), Some("first"));
        assert_eq!(headers.as_slice().header("stripe-signature"), Some("first"));
        assert_eq!(headers.header("x-hub-signature-256"), None);
    }

    #[test]
    fn owned_pairs_are_looked_up_case_insensitively() {
        let headers = vec![("X-Hub-Signature-256".to_owned(), "sha256=00".to_owned())];
        assert_eq!(headers.header("x-hub-signature-256"), Some("sha256=00"));
        assert_eq!(headers.header("x-hub-signature"), None);
        let dynamic: &dyn HeaderSource = &headers;
        assert_eq!(dynamic.header("X-HUB-SIGNATURE-256"), Some("sha256=00"));
    }

    #[test]
    fn non_ascii_names_do_not_match_by_accident() {
        let headers = [("stripe-sıgnature", "x")];
        assert_eq!(headers.header("stripe-signature"), None);
    }
}
