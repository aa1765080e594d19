//! Reading the few signed fields of a JSON body before its signature is checked.
//!
//! Such a body is anyone's: parsed into a [`serde_json::Value`], a megabyte of `[{"":0},...]`
//! builds some 150,000 maps, about a hundred times the body's size in memory. The schemes that
//! find their signature inside the body (Adyen, Mailgun) deserialize it instead into structs
//! naming only the fields they sign, whose values are [`JsonScalar`]s: everything else, and any
//! object or array where a scalar was expected, is read past without being built.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A JSON value as a signed string spells it: a string as it is, a number or a boolean as JSON
/// writes it (as [`serde_json::Value`] prints it); an object or an array, which no signed
/// string holds, is skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JsonScalar {
    /// A string.
    Text(String),
    /// A number, as JSON writes it.
    Number(String),
    /// `true` or `false`.
    Bool(bool),
    /// `null`, an object or an array.
    Other,
}

impl JsonScalar {
    /// The text of a string or a number; `None` for the rest.
    pub(crate) fn text_or_number(self) -> Option<String> {
        match self {
            Self::Text(text) | Self::Number(text) => Some(text),
            Self::Bool(_) | Self::Other => None,
        }
    }

    /// The text of a string, a number or a boolean; empty for the rest.
    pub(crate) fn into_text(self) -> String {
        match self {
            Self::Text(text) | Self::Number(text) => text,
            Self::Bool(flag) => flag.to_string(),
            Self::Other => String::new(),
        }
    }
}

impl<'de> Deserialize<'de> for JsonScalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = JsonScalar;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Text(text.to_owned()))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Text(text))
    }

    fn visit_i64<E: de::Error>(self, number: i64) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Number(number.to_string()))
    }

    fn visit_u64<E: de::Error>(self, number: u64) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Number(number.to_string()))
    }

    fn visit_f64<E: de::Error>(self, number: f64) -> Result<JsonScalar, E> {
        // Spelled as `serde_json` spells it, not as Rust's `Display` does (`1e21`, not
        // `1000000000000000000000`).
        Ok(
            serde_json::Number::from_f64(number).map_or(JsonScalar::Other, |number| {
                JsonScalar::Number(number.to_string())
            }),
        )
    }

    fn visit_bool<E: de::Error>(self, flag: bool) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Bool(flag))
    }

    fn visit_unit<E: de::Error>(self) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<JsonScalar, A::Error> {
        while items.next_element::<IgnoredAny>()?.is_some() {}
        Ok(JsonScalar::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<JsonScalar, A::Error> {
        while entries.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(JsonScalar::Other)
    }
}

/// Whether `body` is JSON at all: read past, nothing built. For error messages, on the path of
/// a body that did not deserialize.
pub(crate) fn is_json(body: &[u8]) -> bool {
    serde_json::from_slice::<IgnoredAny>(body).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(json: &str) -> JsonScalar {
        serde_json::from_str(json).expect("JSON")
    }

    #[test]
    fn scalars_are_spelled_as_a_parsed_value_prints_them() {
        for json in [
            "\"a\\u00e9\"",
            "12",
            "-7",
            "1.5",
            "1e21",
            "0.1",
            "true",
            "null",
        ] {
            let value: serde_json::Value = serde_json::from_str(json).expect("JSON");
            let expected = match &value {
                serde_json::Value::String(text) => text.clone(),
                serde_json::Value::Null => String::new(),
                other => other.to_string(),
            };
            assert_eq!(read(json).into_text(), expected, "{json}");
        }
    }

    #[test]
    fn objects_and_arrays_are_skipped() {
        assert_eq!(read(r#"{"a":[1,{"b":2}]}"#), JsonScalar::Other);
        assert_eq!(read(r#"[{"":0},{"":0}]"#), JsonScalar::Other);
        assert_eq!(read("false").text_or_number(), None);
        assert_eq!(read("42").text_or_number().as_deref(), Some("42"));
    }
}
