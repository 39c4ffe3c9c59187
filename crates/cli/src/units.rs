//! Sizes and durations on the command line: `128MiB`, `2KiB`, `64`, `1G`, `2TiB` (binary
//! units; bytes when bare); `500ms`, `5s`, `15m`, `24h`, `0` (seconds when bare).

use std::time::Duration;

/// Parses a size; the error says what was expected.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 =
        num.parse().map_err(|_| format!("'{s}' is not a size (examples: 4096, 2KiB, 128MiB, 1GiB, 2TiB)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => return Err(format!("'{other}' is not a size unit (use B, KiB, MiB, GiB or TiB)")),
    };
    n.checked_mul(1 << shift).ok_or_else(|| format!("'{s}' is too large"))
}

/// A size for people, to three figures: `2.23 MiB`, `310 B`.
pub fn show_about(n: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if n >= 1 << shift {
            let v = n as f64 / (1u64 << shift) as f64;
            let places = if v >= 100.0 {
                0
            } else if v >= 10.0 {
                1
            } else {
                2
            };
            return format!("{v:.places$} {unit}");
        }
    }
    format!("{n} B")
}

/// A size for people: `128 MiB`, `2 KiB`, `100 B`.
pub fn show_size(n: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{} {unit}", n >> shift);
        }
    }
    format!("{n} B")
}

/// Parses a duration such as `500ms`, `5s`, `15m`, `24h` or `0`; `None` for zero (never).
pub fn parse_duration(s: &str) -> Result<Option<Duration>, String> {
    let t = s.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = num.parse().map_err(|_| format!("{s:?}: expected a number and ms, s, m, h or d"))?;
    let ms = match unit {
        "ms" => Some(n),
        "" | "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => return Err(format!("{s:?}: the unit is ms, s, m, h or d")),
    };
    let ms = ms.ok_or_else(|| format!("{s:?} is too long"))?;
    Ok((ms > 0).then(|| Duration::from_millis(ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("128MiB"), Ok(128 << 20));
        assert_eq!(show_about(2342784), "2.23 MiB");
        assert_eq!(show_about(310), "310 B");
        assert_eq!(show_about(150 << 10), "150 KiB");
        assert_eq!(parse_size("2KiB"), Ok(2048));
        assert_eq!(parse_size("2k"), Ok(2048));
        assert_eq!(parse_size("64"), Ok(64));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999999GiB").is_err());
        assert_eq!(show_size(128 << 20), "128 MiB");
        assert_eq!(show_size(2112), "2112 B");
        assert_eq!(parse_size("2TiB"), Ok(2 << 40));
        assert_eq!(show_size(3 << 40), "3 TiB");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s"), Ok(Some(Duration::from_secs(5))));
        assert_eq!(parse_duration("5"), Ok(Some(Duration::from_secs(5))));
        assert_eq!(parse_duration("250ms"), Ok(Some(Duration::from_millis(250))));
        assert_eq!(parse_duration("24h"), Ok(Some(Duration::from_secs(86_400))));
        assert_eq!(parse_duration("0"), Ok(None));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("99999999999999999d").is_err());
    }
}
