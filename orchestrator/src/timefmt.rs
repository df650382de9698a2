//! Wall-clock formatting without a calendar dependency.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, now.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Seconds since the Unix epoch, now, with sub-millisecond precision.
pub fn unix_secs_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// UTC civil date and time of `unix_secs`: (year, month, day, hour, minute, second).
pub(crate) fn civil_utc(unix_secs: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    // Days-to-civil conversion (proleptic Gregorian), valid for all dates after 1970.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        month,
        day,
        (rem / 3600) as u32,
        (rem / 60 % 60) as u32,
        (rem % 60) as u32,
    )
}

/// `YYYYmmdd-HHMMSS` in UTC, for run directory names.
pub(crate) fn compact_stamp(unix_secs: u64) -> String {
    let (y, mo, d, h, mi, s) = civil_utc(unix_secs);
    format!("{y:04}{mo:02}{d:02}-{h:02}{mi:02}{s:02}")
}

/// RFC 3339 UTC timestamp with milliseconds.
pub fn rfc3339_ms(unix_ms: u64) -> String {
    let (y, mo, d, h, mi, s) = civil_utc(unix_ms / 1000);
    format!(
        "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{:03}Z",
        unix_ms % 1000
    )
}

/// A duration for a human: `1.2s`, `3m04s`, `1h02m`.
pub fn human_duration(d: std::time::Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 {
        format!("{s:.1}s")
    } else if s < 3600.0 {
        format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else {
        format!(
            "{}h{:02}m",
            (s / 3600.0) as u64,
            ((s % 3600.0) / 60.0) as u64
        )
    }
}

/// How long a stage (or a run) took, for a human: as [`human_duration`], but under 50 ms in
/// milliseconds (`35ms`), so that a stage that ran is not shown as taking `0.0s`.
pub fn human_wall(d: std::time::Duration) -> String {
    if d < std::time::Duration::from_millis(50) {
        format!("{}ms", d.as_millis())
    } else {
        human_duration(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_short_wall_is_shown_in_milliseconds_and_a_longer_one_as_a_duration() {
        assert_eq!(human_wall(Duration::from_micros(34_910)), "34ms");
        assert_eq!(human_wall(Duration::ZERO), "0ms");
        assert_eq!(human_wall(Duration::from_millis(50)), "0.1s");
        assert_eq!(human_wall(Duration::from_millis(2_780)), "2.8s");
        assert_eq!(human_wall(Duration::from_secs(184)), "3m04s");
        assert_eq!(human_duration(Duration::from_millis(34)), "0.0s");
    }

    #[test]
    fn known_instants() {
        assert_eq!(compact_stamp(0), "19700101-000000");
        // 2026-11-29T21:35:06Z
        assert_eq!(compact_stamp(1_795_988_106), "20261129-213506");
        assert_eq!(rfc3339_ms(951_782_400_123), "2000-02-29T00:00:00.123Z");
    }
}
