//! Sizes and durations as people write them on a command line.

/// A size: bytes (`1048576`), or a number with a unit: `K`, `M`, `G`, `T` (powers of 1024;
/// `KiB`, `MB` and lowercase are accepted as the same).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: f64 = number.parse().map_err(|_| {
        format!("{text:?} is not a size: write bytes, or a number with K, M, G or T")
    })?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "{other:?} is not a size unit: use K, M, G or T (e.g. 512M)"
            ));
        }
    };
    let bytes = number * scale as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("{text:?} is out of range"));
    }
    Ok(bytes as u64)
}

/// A duration in seconds: a number of seconds (`1.5`), or a number with a unit: `ms`, `s`,
/// `m`, `h` (`500ms`, `30s`, `2m`).
pub fn parse_seconds(text: &str) -> Result<f64, String> {
    let (number, unit) = number_and_unit(text).ok_or_else(|| {
        format!("{text:?} is not a duration: write seconds (1.5), or a number with ms, s, m or h")
    })?;
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "ms" => 0.001,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "{other:?} is not a duration unit: use ms, s, m or h (e.g. 30s)"
            ));
        }
    };
    Ok(number * scale)
}

/// `"512M"` → `(512.0, "M")`: the leading number and what follows it.
fn number_and_unit(text: &str) -> Option<(f64, &str)> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    Some((number.parse().ok()?, unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_take_units() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1.5k"), Ok(1536));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12X").unwrap_err().contains("K, M, G or T"));
        assert!(parse_size("-1").is_err());
        assert_eq!(parse_seconds("1.5"), Ok(1.5));
        assert_eq!(parse_seconds("30s"), Ok(30.0));
        assert_eq!(parse_seconds("2m"), Ok(120.0));
        assert_eq!(parse_seconds("250ms"), Ok(0.25));
        assert!(parse_seconds("soon").is_err());
        assert!(parse_seconds("3d").unwrap_err().contains("ms, s, m or h"));
    }
}
