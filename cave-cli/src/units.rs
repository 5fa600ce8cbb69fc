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

/// An amount of US dollars: `0.50`, `$0.50`, `12`.
pub fn parse_usd(text: &str) -> Result<f64, String> {
    let number = text.trim().trim_start_matches('$');
    match number.parse::<f64>() {
        Ok(usd) if usd.is_finite() && usd >= 0.0 => Ok(usd),
        _ => Err(format!(
            "{text:?} is not an amount of US dollars: write a number such as 0.50"
        )),
    }
}

/// A model's price in US dollars per million tokens: `IN,OUT`, or `IN,OUT,CACHED` with the
/// price of prompt tokens read from the provider's cache (`2.5,10,1.25`).
pub fn parse_price(text: &str) -> Result<cave_agent::Price, String> {
    let wrong = || {
        format!(
            "{text:?} is not a price: write dollars per million tokens as IN,OUT or IN,OUT,CACHED (e.g. 2.5,10)"
        )
    };
    let parts: Vec<f64> = text
        .split(',')
        .map(|p| parse_usd(p).map_err(|_| wrong()))
        .collect::<Result<_, _>>()?;
    let price = match parts[..] {
        [input, output] => cave_agent::Price::per_million(input, output),
        [input, output, cached] => {
            cave_agent::Price::per_million(input, output).and_then(|p| p.with_cached_input(cached))
        }
        _ => None,
    };
    price.ok_or_else(wrong)
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
    fn prices_and_dollars_read_as_written() {
        assert_eq!(parse_usd("$0.50"), Ok(0.5));
        assert!(parse_usd("-1").is_err());
        assert!(parse_usd("ten").is_err());
        let price = parse_price("2.5,10").unwrap();
        assert_eq!(
            (price.input, price.output, price.cached_input),
            (2.5, 10.0, None)
        );
        let cached = parse_price("2.5, 10, 1.25").unwrap();
        assert_eq!(cached.cached_input, Some(1.25));
        for bad in ["2.5", "1,2,3,4", "a,b", "1,-2", ""] {
            let error = parse_price(bad).unwrap_err();
            assert!(error.contains("IN,OUT"), "{bad}: {error}");
        }
    }

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
