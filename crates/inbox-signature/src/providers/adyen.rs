//! Adyen (standard notifications): the signature is inside each notification item,
//! `notificationItems[].NotificationRequestItem.additionalData.hmacSignature`, the base64
//! HMAC-SHA256 — keyed with the **hex-decoded** HMAC key — of
//! `pspReference:originalReference:merchantAccountCode:merchantReference:amount.value:amount.currency:eventCode:success`
//! (absent fields empty, as the official libraries build it). Every item must verify. Only
//! those fields are signed: the rest of an item (`additionalData`, `reason`) is not protected
//! by the HMAC, which is Adyen's design; Basic auth on the endpoint adds nothing a TLS client
//! could not also replay, so the receiver's TLS matters here. One
//! request carries several items, each stored as its own event keyed by `pspReference`,
//! `eventCode` and `success`; Adyen expects the answer `[accepted]`. No timestamp.

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

use crate::family::first_match;
use crate::json_scalar::{is_json, JsonScalar};
use crate::parse::DIGEST_BASE64;
use crate::providers::Options;
use crate::{
    Ack, Algorithm, Batch, ItemId, KeyError, Outgoing, Profile, Request, Scheme, SignError, Signed,
    SigningKey, Verified, VerifyError,
};

/// The Adyen scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adyen;

/// Builds the scheme (no options).
///
/// # Errors
/// Never; the signature is the catalog's.
pub fn build(_: &Options) -> Result<Box<dyn Scheme>, String> {
    Ok(Box::new(Adyen))
}

/// An Adyen body, read for its signed fields alone (see [`crate::json_scalar`]).
#[derive(Deserialize)]
struct Notification {
    #[serde(rename = "notificationItems")]
    items: Vec<NotificationItem>,
}

#[derive(Deserialize)]
struct NotificationItem {
    #[serde(rename = "NotificationRequestItem")]
    item: SignedFields,
}

/// The fields of a `NotificationRequestItem` its HMAC covers, and the HMAC.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SignedFields {
    psp_reference: Option<JsonScalar>,
    original_reference: Option<JsonScalar>,
    merchant_account_code: Option<JsonScalar>,
    merchant_reference: Option<JsonScalar>,
    amount: Option<Amount>,
    event_code: Option<JsonScalar>,
    success: Option<JsonScalar>,
    additional_data: Option<AdditionalData>,
}

#[derive(Deserialize)]
struct Amount {
    value: Option<JsonScalar>,
    currency: Option<JsonScalar>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AdditionalData {
    hmac_signature: Option<JsonScalar>,
}

impl SignedFields {
    /// `pspReference:originalReference:merchantAccountCode:merchantReference:amount.value:amount.currency:eventCode:success`,
    /// absent fields empty.
    fn data_to_sign(self) -> String {
        let (value, currency) = self
            .amount
            .map_or((None, None), |amount| (amount.value, amount.currency));
        [
            self.psp_reference,
            self.original_reference,
            self.merchant_account_code,
            self.merchant_reference,
            value,
            currency,
            self.event_code,
            self.success,
        ]
        .into_iter()
        .map(|field| field.map(JsonScalar::into_text).unwrap_or_default())
        .collect::<Vec<_>>()
        .join(":")
    }
}

/// Each item's signed string and decoded `hmacSignature`.
///
/// # Errors
/// [`VerifyError::MalformedBody`] for a body without items, or an item without a signature.
pub fn parse_adyen_body(body: &[u8]) -> Result<Vec<(String, Vec<u8>)>, VerifyError> {
    let notification: Notification = serde_json::from_slice(body).map_err(|_| {
        VerifyError::MalformedBody(if is_json(body) {
            "no notificationItems, or an item without NotificationRequestItem"
        } else {
            "not JSON"
        })
    })?;
    if notification.items.is_empty() {
        return Err(VerifyError::MalformedBody("no notificationItems"));
    }
    notification
        .items
        .into_iter()
        .map(|NotificationItem { mut item }| {
            let signature = item
                .additional_data
                .take()
                .and_then(|data| data.hmac_signature)
                .and_then(|text| match text {
                    JsonScalar::Text(text) => DIGEST_BASE64.decode(text.trim()).ok(),
                    _ => None,
                })
                .ok_or(VerifyError::MalformedBody(
                    "an item without a base64 hmacSignature",
                ))?;
            Ok((item.data_to_sign(), signature))
        })
        .collect()
}

/// The signed string of one `NotificationRequestItem` given as a parsed value.
fn data_to_sign(item: &Value) -> Result<String, SignError> {
    serde_json::from_value::<SignedFields>(item.clone())
        .map(SignedFields::data_to_sign)
        .map_err(|_| {
            SignError::Body(
                "a NotificationRequestItem whose amount or additionalData is not an object",
            )
        })
}

impl Scheme for Adyen {
    fn name(&self) -> &'static str {
        "adyen"
    }

    fn signature_headers(&self) -> Vec<&str> {
        Vec::new()
    }

    /// The HMAC key as the Customer Area shows it: hexadecimal.
    fn key_from_secret(&self, secret: &str) -> Result<SigningKey, KeyError> {
        SigningKey::from_bytes(&hex::decode(secret.trim()).map_err(|_| KeyError::NotHex)?)
    }

    fn verify(
        &self,
        request: &Request<'_>,
        keys: &[SigningKey],
        _now: i64,
    ) -> Result<Verified, VerifyError> {
        let mut first = None;
        for (data, signature) in parse_adyen_body(request.body)? {
            let index = first_match(keys, Algorithm::Sha256, &[data.as_bytes()], &[signature])?;
            first.get_or_insert(index);
        }
        Ok(Verified {
            key_index: first.unwrap_or_default(),
            timestamp: None,
        })
    }

    /// Writes each item's `additionalData.hmacSignature`.
    fn sign(&self, key: &SigningKey, message: &Outgoing<'_>) -> Result<Signed, SignError> {
        let mut json: Value = serde_json::from_slice(message.body)
            .map_err(|_| SignError::Body("Adyen bodies are JSON with notificationItems"))?;
        let items = json
            .get_mut("notificationItems")
            .and_then(Value::as_array_mut)
            .ok_or(SignError::Body(
                "Adyen bodies are JSON with notificationItems",
            ))?;
        for item in items {
            let item = item
                .get_mut("NotificationRequestItem")
                .and_then(Value::as_object_mut)
                .ok_or(SignError::Body("an item without NotificationRequestItem"))?;
            let data = data_to_sign(&Value::Object(item.clone()))?;
            let signature = DIGEST_BASE64.encode(key.hmac(Algorithm::Sha256, &[data.as_bytes()]));
            let additional = item
                .entry("additionalData")
                .or_insert_with(|| Value::Object(serde_json::Map::new()));
            if let Some(additional) = additional.as_object_mut() {
                additional.insert("hmacSignature".into(), signature.into());
            }
        }
        Ok(Signed {
            headers: Vec::new(),
            body: json.to_string().into_bytes(),
        })
    }

    fn profile(&self) -> Profile {
        Profile {
            batch: Some(Batch {
                items: "/notificationItems".into(),
                unwrap: "/NotificationRequestItem".into(),
                id: ItemId::Pointers(vec![
                    "/pspReference".into(),
                    "/eventCode".into(),
                    "/success".into(),
                ]),
                event_type: Some("/eventCode".into()),
            }),
            ack: Ack::Text("[accepted]".into()),
            ..Profile::fields(Vec::new(), Vec::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::{assert_vector, key};

    /// The key of Adyen/adyen-node-api-library src/__tests__/hmacValidator.spec.ts.
    const KEY: &str = "DFB1EB5485895CFA84146406857104ABB4CBCABDC8AAF103A624C8F6A3EAAB00";

    #[test]
    fn adyen_library_vector_of_its_own_tests() {
        // hmacValidator.spec.ts: this data string and key give this signature; reproduced by
        // `new HmacValidator().calculateHmac(data, KEY)` of npm @adyen/api-library 32.1.0.
        let key = key(&Adyen, KEY);
        let digest = key.hmac(
            Algorithm::Sha256,
            &[b"pspReference:originalReference:merchantAccount:reference:1000:EUR:CAPTURE:true"],
        );
        assert_eq!(
            DIGEST_BASE64.encode(digest),
            "xhpHvYq2u2Np0rstbZ6QjLGu7JWhvf7Iwaa6EviJSX0="
        );
    }

    /// Two items whose signatures are `calculateHmac(item, KEY)` of npm @adyen/api-library
    /// 32.1.0 (the first item has an empty originalReference, the second none at all).
    const BATCH: &[u8] = br#"{"live":"false","notificationItems":[{"NotificationRequestItem":{"pspReference":"7914073381342284","originalReference":"","merchantAccountCode":"TestMerchant","merchantReference":"TestPayment-1407325143704","amount":{"value":1130,"currency":"EUR"},"eventCode":"AUTHORISATION","success":"true","additionalData":{"hmacSignature":"Ny9gS2veKo5E4w8/OL6xz1/wvT/hYkAXy1xNc/QvO4I="}}},{"NotificationRequestItem":{"pspReference":"8814073381342285","merchantAccountCode":"TestMerchant","merchantReference":"TestPayment-2","amount":{"value":500,"currency":"USD"},"eventCode":"REFUND","success":"false","additionalData":{"hmacSignature":"zbBL3agazjrQpzNXpvJGPgpYE7vJreJ3rq9dyK4uwpQ="}}}]}"#;

    #[test]
    fn every_item_of_an_sdk_signed_batch_verifies() {
        assert_vector(&Adyen, KEY, "", &[], BATCH, 0);
        let items = parse_adyen_body(BATCH).expect("items");
        assert_eq!(
            items[0].0,
            "7914073381342284::TestMerchant:TestPayment-1407325143704:1130:EUR:AUTHORISATION:true"
        );
        assert_eq!(
            items[1].0,
            "8814073381342285::TestMerchant:TestPayment-2:500:USD:REFUND:false"
        );
    }

    #[test]
    fn one_bad_item_fails_the_whole_request() {
        let text = std::str::from_utf8(BATCH)
            .expect("utf-8")
            .replace("\"value\":500", "\"value\":501");
        let headers: [(&str, &str); 0] = [];
        let request = Request::post(&headers, text.as_bytes());
        assert_eq!(
            Adyen.verify(&request, &[key(&Adyen, KEY)], 0),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn signing_writes_what_the_sdk_computed() {
        let unsigned = std::str::from_utf8(BATCH)
            .expect("utf-8")
            .replace(
                "\"hmacSignature\":\"Ny9gS2veKo5E4w8/OL6xz1/wvT/hYkAXy1xNc/QvO4I=\"",
                "",
            )
            .replace(
                "\"hmacSignature\":\"zbBL3agazjrQpzNXpvJGPgpYE7vJreJ3rq9dyK4uwpQ=\"",
                "",
            );
        let signed = Adyen
            .sign(
                &key(&Adyen, KEY),
                &Outgoing::post(unsigned.as_bytes(), "", 0),
            )
            .expect("signs");
        let items = parse_adyen_body(&signed.body).expect("signed items");
        assert_eq!(
            DIGEST_BASE64.encode(&items[0].1),
            "Ny9gS2veKo5E4w8/OL6xz1/wvT/hYkAXy1xNc/QvO4I="
        );
        assert_eq!(
            DIGEST_BASE64.encode(&items[1].1),
            "zbBL3agazjrQpzNXpvJGPgpYE7vJreJ3rq9dyK4uwpQ="
        );
    }
}
