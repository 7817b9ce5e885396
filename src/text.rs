//! Text for people: durations, sizes and bounded excerpts, written the same way everywhere
//! (messages from the engine, tool results, the command line).

use std::time::Duration;

/// A duration for people, to the millisecond: `1m 30s`, `250ms`.
pub fn duration(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

/// A size for people: `2 GiB`, `1.5 KiB`, `10 bytes` (binary units, like the settings).
pub fn bytes(n: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in UNITS {
        if n >= size {
            let value = n as f64 / size as f64;
            return if value.fract() == 0.0 {
                format!("{value:.0} {unit}")
            } else {
                format!("{value:.1} {unit}")
            };
        }
    }
    format!("{n} bytes")
}

/// At most `max` characters of `s`, cut on a character boundary.
pub fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((end, _)) => s[..end].to_string(),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_read_naturally() {
        assert_eq!(bytes(10), "10 bytes");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(2 << 30), "2 GiB");
        assert_eq!(duration(Duration::from_millis(90_250)), "1m 30s 250ms");
    }

    #[test]
    fn truncation_respects_characters() {
        assert_eq!(truncate_chars("héllo", 2), "hé");
        assert_eq!(truncate_chars("abc", 10), "abc");
        assert_eq!(truncate_chars("", 0), "");
    }
}
