//! What verifying an unsigned hostile body costs in memory, for the schemes that read their
//! signature out of the body before it is verified (Adyen, Mailgun, Twilio's form): a
//! megabyte of tiny nested objects or of distinct form names must not cost many times its
//! size, whoever sent it. A test binary of its own: it counts the process's allocations.

use inbox_signature::providers::{self, Options};
use inbox_signature::{Request, VerifyError};

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

const MEBIBYTE: usize = 1 << 20;

/// About a mebibyte of `{"":0},{"":0},...`: each item a map of its own once parsed.
fn tiny_objects() -> String {
    vec![r#"{"":0}"#; MEBIBYTE / 7].join(",")
}

/// The most heap in use, beyond what was in use before, while `scheme` verifies `body` with
/// `secret` and `headers`; and what the verification said.
fn peak_while_verifying(
    scheme: &str,
    secret: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (usize, Result<(), VerifyError>) {
    let scheme = providers::build(scheme, &Options::default()).expect("catalog scheme");
    let key = scheme.key_from_secret(secret).expect("key");
    let request = Request::post(&headers, body).at("https://hooks.example.com/webhooks/p");
    let before = dhat::HeapStats::get();
    let verified = scheme.verify(&request, &[key], 1_700_000_000).map(|_| ());
    let after = dhat::HeapStats::get();
    (after.max_bytes.saturating_sub(before.curr_bytes), verified)
}

// One test: dhat's profiler is one per process.
#[test]
fn unsigned_hostile_bodies_cost_at_most_a_few_times_their_size() {
    let _profiler = dhat::Profiler::builder().testing().build();

    let objects = tiny_objects();
    let mailgun = format!(
        r#"{{"event-data":[{objects}],"signature":{{"timestamp":"1700000000","token":[{objects}],"signature":"00"}}}}"#
    );
    let (peak, verified) = peak_while_verifying("mailgun", "key", &[], mailgun.as_bytes());
    assert!(verified.is_err(), "{verified:?}");
    assert!(peak < MEBIBYTE, "mailgun: {peak} bytes at the peak");

    let adyen = format!(
        r#"{{"notificationItems":[{{"NotificationRequestItem":{{"pspReference":[{objects}],"amount":{{"value":[{objects}]}},"additionalData":{{"hmacSignature":"AAAA"}}}}}}]}}"#
    );
    let (peak, verified) = peak_while_verifying("adyen", "00ff", &[], adyen.as_bytes());
    assert_eq!(verified, Err(VerifyError::NoMatch));
    assert!(peak < MEBIBYTE, "adyen: {peak} bytes at the peak");

    // Distinct names, two bytes a parameter.
    let names: Vec<String> = (0..MEBIBYTE / 8).map(|n| format!("{n:x}")).collect();
    let form = names.join("&");
    let headers = [("x-twilio-signature", "AAAA")];
    let (peak, verified) = peak_while_verifying("twilio", "token", &headers, form.as_bytes());
    assert!(
        matches!(verified, Err(VerifyError::MalformedBody(_))),
        "{verified:?}"
    );
    assert!(peak < MEBIBYTE, "twilio: {peak} bytes at the peak");
}
