//! Human durations in plans: `"500ms"`, `"90s"`, `"30m"`, `"2h"`, `"1h30m"`, `"1d"`.

use schemars::JsonSchema;
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::Duration;

/// The longest duration a plan may give: 100 years (`36500d`). Longer ones are refused (a
/// deadline that far cannot be computed on every clock).
pub const MAX_DURATION: Duration = Duration::from_secs(36_500 * 86_400);

/// A duration written as a string of number+unit parts (`ms`, `s`, `m`, `h`, `d`).
///
/// Serializes back to the canonical form (`"1h30m"`), so a resolved plan round-trips.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    /// The wrapped duration.
    pub fn get(self) -> Duration {
        self.0
    }

    /// Builds one from whole seconds.
    pub fn from_secs(secs: u64) -> Self {
        HumanDuration(Duration::from_secs(secs))
    }
}

/// Why a duration string was refused, phrased for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationError(pub String);

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DurationError {}

impl std::str::FromStr for HumanDuration {
    type Err = DurationError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let refuse = || {
            DurationError(format!(
                "invalid duration `{text}`: write a number and a unit (ms, s, m, h, d), like \"90s\", \"30m\" or \"1h30m\""
            ))
        };
        let s = text.trim();
        if s.is_empty() {
            return Err(refuse());
        }
        let too_long = || {
            DurationError(format!(
                "invalid duration `{text}`: it is longer than the most a plan may give, 100 years (\"36500d\")"
            ))
        };
        let mut total_ms: u128 = 0;
        let mut rest = s;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if digits == 0 {
                return Err(refuse());
            }
            let number: u128 = rest[..digits].parse().map_err(|_| too_long())?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let unit_ms: u128 = match &rest[..unit_len] {
                "ms" => 1,
                "s" => 1_000,
                "m" => 60_000,
                "h" => 3_600_000,
                "d" => 86_400_000,
                _ => return Err(refuse()),
            };
            rest = &rest[unit_len..];
            total_ms = number
                .checked_mul(unit_ms)
                .and_then(|v| v.checked_add(total_ms))
                .ok_or_else(too_long)?;
        }
        if total_ms > MAX_DURATION.as_millis() {
            return Err(too_long());
        }
        let ms = u64::try_from(total_ms).map_err(|_| too_long())?;
        Ok(HumanDuration(Duration::from_millis(ms)))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ms = self.0.as_millis();
        if ms == 0 {
            return f.write_str("0s");
        }
        for (unit, size) in [
            ("d", 86_400_000u128),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1_000),
            ("ms", 1),
        ] {
            if ms >= size {
                write!(f, "{}{}", ms / size, unit)?;
                ms %= size;
            }
        }
        Ok(())
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"90s\", \"30m\" or \"2h\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HumanDuration, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(Visitor)
    }
}

impl JsonSchema for HumanDuration {
    fn schema_name() -> String {
        "HumanDuration".into()
    }

    fn json_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        let mut schema = schemars::schema::SchemaObject {
            instance_type: Some(schemars::schema::InstanceType::String.into()),
            ..Default::default()
        };
        schema.string().pattern = Some("^([0-9]+(ms|s|m|h|d))+$".into());
        schema.metadata().description =
            Some("A duration such as \"500ms\", \"90s\", \"30m\", \"2h\" or \"1h30m\".".into());
        schema.into()
    }
}

/// How long a stage may go without progress before it is judged hung: a duration, or
/// `"off"` (never judged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallTimeout {
    /// Never judged hung.
    Off,
    /// Hung after this long without progress.
    After(HumanDuration),
}

impl StallTimeout {
    /// The window, unless off.
    pub fn window(self) -> Option<Duration> {
        match self {
            StallTimeout::Off => None,
            StallTimeout::After(d) => Some(d.get()),
        }
    }
}

impl fmt::Display for StallTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StallTimeout::Off => f.write_str("off"),
            StallTimeout::After(d) => d.fmt(f),
        }
    }
}

impl Serialize for StallTimeout {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for StallTimeout {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = StallTimeout;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"10m\", or \"off\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StallTimeout, E> {
                if v == "off" {
                    return Ok(StallTimeout::Off);
                }
                let d: HumanDuration = v.parse().map_err(E::custom)?;
                if d.get().is_zero() {
                    return Err(E::custom("a stall timeout of 0 would judge every stage hung: give a duration, or \"off\""));
                }
                Ok(StallTimeout::After(d))
            }
        }
        d.deserialize_str(Visitor)
    }
}

impl JsonSchema for StallTimeout {
    fn schema_name() -> String {
        "StallTimeout".into()
    }

    fn json_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        let mut schema = schemars::schema::SchemaObject {
            instance_type: Some(schemars::schema::InstanceType::String.into()),
            ..Default::default()
        };
        schema.string().pattern = Some("^(off|([0-9]+(ms|s|m|h|d))+)$".into());
        schema.metadata().description =
            Some("A duration such as \"90s\" or \"30m\", or \"off\".".into());
        schema.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_canonical_forms() {
        for (text, ms, canon) in [
            ("90s", 90_000, "1m30s"),
            ("2h", 7_200_000, "2h"),
            ("1h30m", 5_400_000, "1h30m"),
            ("500ms", 500, "500ms"),
            ("1d", 86_400_000, "1d"),
        ] {
            let d: HumanDuration = text.parse().unwrap();
            assert_eq!(d.0.as_millis(), ms, "{text}");
            assert_eq!(d.to_string(), canon);
            assert_eq!(canon.parse::<HumanDuration>().unwrap(), d);
        }
    }

    #[test]
    fn refuses_malformed() {
        for bad in ["", "90", "s", "1x", "-5s", "1.5h"] {
            let err = bad.parse::<HumanDuration>().unwrap_err();
            assert!(err.0.contains("write a number and a unit"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_duration_too_long_is_called_too_long_not_malformed() {
        for long in [
            "99999999999999999999d",
            "99999999999999999999999999999999999999999d",
            "36501d",
            "36500d1ms",
        ] {
            let err = long.parse::<HumanDuration>().unwrap_err();
            assert!(err.0.contains("longer than the most"), "{long}: {err}");
            assert!(!err.0.contains("write a number"), "{long}: {err}");
        }
        assert_eq!(
            "36500d".parse::<HumanDuration>().unwrap().get(),
            MAX_DURATION
        );
    }
}
