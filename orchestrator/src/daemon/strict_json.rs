//! JSON as the daemon takes it: an object that names one key twice, at any depth, is refused.
//!
//! `serde_json` keeps the last of two equal keys, so `{"type":"list","type":"shutdown"}` would
//! be a shutdown; a client that sends that has a bug, and acting on either key would hide it.

use serde::de::{Deserialize, Deserializer, Error, MapAccess, SeqAccess, Visitor};
use std::collections::HashSet;
use std::fmt;

/// Checks that `bytes` is JSON in which no object names a key twice; the error is
/// `serde_json`'s (a syntax error, or a data error naming the duplicate key and where it is).
pub fn check_unique_keys(bytes: &[u8]) -> Result<(), serde_json::Error> {
    serde_json::from_slice::<UniqueKeys>(bytes).map(|_| ())
}

/// A JSON value that was checked and dropped.
struct UniqueKeys;

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<UniqueKeys, D::Error> {
        deserializer.deserialize_any(UniqueKeysVisitor)
    }
}

struct UniqueKeysVisitor;

impl<'de> Visitor<'de> for UniqueKeysVisitor {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: Error>(self, _: bool) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_i64<E: Error>(self, _: i64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_u64<E: Error>(self, _: u64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_f64<E: Error>(self, _: f64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_str<E: Error>(self, _: &str) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_unit<E: Error>(self) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueKeys, A::Error> {
        while seq.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueKeys, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if seen.contains(&key) {
                return Err(A::Error::custom(format_args!("duplicate key {key:?}")));
            }
            map.next_value::<UniqueKeys>()?;
            seen.insert(key);
        }
        Ok(UniqueKeys)
    }
}

#[cfg(test)]
mod tests {
    use super::check_unique_keys;

    #[test]
    fn a_key_named_twice_is_refused_at_any_depth_and_others_pass() {
        let err = check_unique_keys(br#"{"v":1,"type":"list","type":"shutdown"}"#).unwrap_err();
        assert!(err.is_data());
        assert!(err.to_string().contains("duplicate key \"type\""), "{err}");
        let deep = br#"{"plan":{"json":{"stage":[{"env":{"A":"1","A":"2"}}]}}}"#;
        assert!(check_unique_keys(deep)
            .unwrap_err()
            .to_string()
            .contains("duplicate key \"A\""));
        // Escapes that spell the same key are the same key.
        assert!(check_unique_keys(br#"{"a":1,"\u0061":2}"#).is_err());
        check_unique_keys(br#"{"a":{"a":1},"b":[{"a":1},{"a":2}],"c":null}"#).unwrap();
        assert!(check_unique_keys(b"{\"a\":").unwrap_err().is_eof());
    }
}
