//! Reading one scalar of a JSON body at a JSON pointer, exactly as the provider wrote it.
//!
//! A dedup key must not lose information: read through `serde_json::Value`, integers beyond
//! 64 bits become floats, and `8262010272424615981079` and `8262010272424615981080` would
//! share one key, the second event acknowledged as a duplicate and never processed. Here the
//! value is taken from the raw text, so a number keeps its digits. And an object naming the
//! member on the path twice is ambiguous (parsers disagree on which one wins), so it is an
//! error rather than silently the last one.
//!
//! Decision: an id is text. A number is keyed by its JSON spelling, so `{"id":1}` and
//! `{"id":"1"}` are the same event; a provider that switched representation between a
//! delivery and its retry is still deduplicated.

use std::fmt;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

/// The member named on a pointer's path appears more than once in its object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("member {0:?} appears more than once")]
pub struct RepeatedMember(pub String);

/// The scalar at `pointer` (RFC 6901) in `json`: a string as its text, a number in its exact
/// spelling, a boolean as `true`/`false`. `None` when absent, null, an object or an array.
pub fn scalar_at(json: &RawValue, pointer: &str) -> Result<Option<String>, RepeatedMember> {
    let Some(value) = value_at(json, pointer)? else {
        return Ok(None);
    };
    let text = value.get().trim();
    Ok(match text.as_bytes().first() {
        Some(b'"') => serde_json::from_str::<String>(text).ok(),
        Some(b'-' | b'0'..=b'9') => Some(text.to_owned()),
        Some(b't' | b'f') => Some(text.to_owned()),
        _ => None,
    })
}

/// The raw value at `pointer`, byte for byte; `None` when the path does not exist.
pub fn value_at<'a>(
    json: &'a RawValue,
    pointer: &str,
) -> Result<Option<&'a RawValue>, RepeatedMember> {
    if pointer.is_empty() {
        return Ok(Some(json));
    }
    let Some(path) = pointer.strip_prefix('/') else {
        return Ok(None);
    };
    let mut current = json;
    for segment in path.split('/') {
        let key = segment.replace("~1", "/").replace("~0", "~");
        let next = match current.get().trim_start().as_bytes().first() {
            Some(b'{') => member(current, &key)?,
            Some(b'[') => element(current, &key),
            _ => None,
        };
        let Some(next) = next else {
            return Ok(None);
        };
        current = next;
    }
    Ok(Some(current))
}

fn element<'a>(array: &'a RawValue, index: &str) -> Option<&'a RawValue> {
    // RFC 6901: decimal digits without leading zeros.
    if index.is_empty() || (index.len() > 1 && index.starts_with('0')) {
        return None;
    }
    let index: usize = index.parse().ok()?;
    let items: Vec<&'a RawValue> = serde_json::from_str(array.get()).ok()?;
    items.get(index).copied()
}

fn member<'a>(object: &'a RawValue, key: &str) -> Result<Option<&'a RawValue>, RepeatedMember> {
    let mut deserializer = serde_json::Deserializer::from_str(object.get());
    match (FindMember { key }).deserialize(&mut deserializer) {
        Ok(Found::Once(value)) => Ok(Some(value)),
        Ok(Found::Missing) | Err(_) => Ok(None),
        Ok(Found::Repeated) => Err(RepeatedMember(key.to_owned())),
    }
}

enum Found<'a> {
    Missing,
    Once(&'a RawValue),
    Repeated,
}

/// Walks an object's members once, keeping the raw value of `key` and noticing a repeat.
struct FindMember<'k> {
    key: &'k str,
}

impl<'de> DeserializeSeed<'de> for FindMember<'_> {
    type Value = Found<'de>;

    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Found<'de>, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FindMember<'_> {
    type Value = Found<'de>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found<'de>, A::Error> {
        let mut found = Found::Missing;
        // Every member is read, so the object is checked whole.
        while let Some(name) = map.next_key::<String>()? {
            if name != self.key {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let value: &'de RawValue = map.next_value()?;
            found = match found {
                Found::Missing => Found::Once(value),
                Found::Once(_) | Found::Repeated => Found::Repeated,
            };
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(json: &str, pointer: &str) -> Result<Option<String>, RepeatedMember> {
        let raw: &RawValue = serde_json::from_str(json).unwrap_or_else(|err| panic!("{err}"));
        scalar_at(raw, pointer)
    }

    #[test]
    fn integers_beyond_64_bits_keep_every_digit() {
        let first = at(r#"{"id":8262010272424615981079}"#, "/id");
        let second = at(r#"{"id":8262010272424615981080}"#, "/id");
        assert_eq!(first, Ok(Some("8262010272424615981079".into())));
        assert_eq!(second, Ok(Some("8262010272424615981080".into())));
        assert_eq!(at(r#"{"id":-12.50}"#, "/id"), Ok(Some("-12.50".into())));
    }

    #[test]
    fn a_number_and_the_string_of_its_digits_are_one_id() {
        assert_eq!(at(r#"{"id":1}"#, "/id"), at(r#"{"id":"1"}"#, "/id"));
    }

    #[test]
    fn a_repeated_member_on_the_path_is_an_error_elsewhere_harmless() {
        assert_eq!(
            at(r#"{"id":"a","id":"b"}"#, "/id"),
            Err(RepeatedMember("id".into()))
        );
        assert_eq!(
            at(r#"{"data":{"id":1},"data":{"id":2}}"#, "/data/id"),
            Err(RepeatedMember("data".into()))
        );
        assert_eq!(
            at(r#"{"id":"a","note":1,"note":2}"#, "/id"),
            Ok(Some("a".into()))
        );
    }

    #[test]
    fn strings_are_unescaped_and_paths_follow_rfc_6901() {
        assert_eq!(
            at(r#"{"id":"a\u00e9\"b"}"#, "/id"),
            Ok(Some("aé\"b".into()))
        );
        assert_eq!(
            at(r#"{"a/b":{"c~d":true}}"#, "/a~1b/c~0d"),
            Ok(Some("true".into()))
        );
        assert_eq!(
            at(r#"{"items":[{"id":"x"},{"id":"y"}]}"#, "/items/1/id"),
            Ok(Some("y".into()))
        );
        assert_eq!(at(r#"{"items":[1]}"#, "/items/01"), Ok(None));
        assert_eq!(at(r#"{"id":null}"#, "/id"), Ok(None));
        assert_eq!(at(r#"{"id":{"nested":1}}"#, "/id"), Ok(None));
        assert_eq!(at(r#"{"other":1}"#, "/id"), Ok(None));
        assert_eq!(at(r#"[1,2]"#, "/id"), Ok(None));
    }
}
