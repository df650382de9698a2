//! Memory sizes in plans: `"256MiB"`, `"64GiB"`, `"1.5TiB"`, `"500MB"`, or a number of bytes.

use schemars::JsonSchema;
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A size in bytes, written as a number and a unit: binary (`KiB`, `MiB`, `GiB`, `TiB`),
/// decimal (`kB`, `MB`, `GB`, `TB`) or `B`; a bare integer is bytes.
///
/// Serializes back as the largest binary unit that divides it (`"64GiB"`), or as bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

/// Why a size was refused, phrased for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByteSizeError(pub String);

impl fmt::Display for ByteSizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ByteSizeError {}

const UNITS: [(&str, u64); 9] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("TB", 1_000_000_000_000),
    ("GB", 1_000_000_000),
    ("MB", 1_000_000),
    ("kB", 1_000),
    ("B", 1),
];

impl std::str::FromStr for ByteSize {
    type Err = ByteSizeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let refuse = || {
            ByteSizeError(format!(
                "invalid size `{text}`: write a number and a unit (KiB, MiB, GiB, TiB, kB, MB, GB, TB or B), like \"256MiB\" or \"64GiB\""
            ))
        };
        let s = text.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, unit) = (&s[..split], s[split..].trim());
        if number.is_empty() {
            return Err(refuse());
        }
        let size = match unit {
            "" => 1,
            unit => UNITS
                .iter()
                .find(|(name, _)| *name == unit)
                .map(|(_, size)| *size)
                .ok_or_else(refuse)?,
        };
        let value: f64 = number.parse().map_err(|_| refuse())?;
        let bytes = value * size as f64;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(ByteSizeError(format!("invalid size `{text}`: too large")));
        }
        if bytes.fract() != 0.0 {
            return Err(ByteSizeError(format!(
                "invalid size `{text}`: not a whole number of bytes"
            )));
        }
        Ok(ByteSize(bytes as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (unit, size) in &UNITS[..4] {
            if self.0 >= *size && self.0.is_multiple_of(*size) {
                return write!(f, "{}{unit}", self.0 / size);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"256MiB\" or \"64GiB\", or a number of bytes")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("invalid size {v}: it is negative")))
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl JsonSchema for ByteSize {
    fn schema_name() -> String {
        "ByteSize".into()
    }

    fn json_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        let mut schema = schemars::schema::SchemaObject {
            instance_type: Some(
                vec![
                    schemars::schema::InstanceType::String,
                    schemars::schema::InstanceType::Integer,
                ]
                .into(),
            ),
            ..Default::default()
        };
        schema.metadata().description =
            Some("A size such as \"256MiB\", \"64GiB\" or \"500MB\", or a number of bytes.".into());
        schema.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_and_decimal_units_and_print_back() {
        assert_eq!("256MiB".parse(), Ok(ByteSize(256 << 20)));
        assert_eq!("64GiB".parse(), Ok(ByteSize(64 << 30)));
        assert_eq!("1.5GiB".parse(), Ok(ByteSize(3 << 29)));
        assert_eq!("500MB".parse(), Ok(ByteSize(500_000_000)));
        assert_eq!("4096".parse(), Ok(ByteSize(4096)));
        assert_eq!(ByteSize(64 << 30).to_string(), "64GiB");
        assert_eq!(ByteSize(1000).to_string(), "1000B");
        for bad in ["", "GiB", "12 potatoes", "1.1B", "99999999999TiB"] {
            let e = bad.parse::<ByteSize>().unwrap_err();
            assert!(e.0.contains(&format!("`{bad}`")), "{e}");
        }
    }
}
