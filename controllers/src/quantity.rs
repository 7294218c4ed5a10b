//! Kubernetes resource quantities (`100Gi`, `500m`, `1.5`, `2e3`) as numbers, to compare values
//! that the API server may have written in another but equal form (`0.5` is stored as `500m`).

/// The value of a quantity in base units (bytes, cores), or `None` when it is not one.
pub fn parse(quantity: &str) -> Option<f64> {
    let text = quantity.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '+' | '-')))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let multiplier = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exponent if exponent.starts_with(['e', 'E']) => 10f64.powi(exponent[1..].parse().ok()?),
        _ => return None,
    };
    Some(number * multiplier)
}

/// Whether two quantity strings denote the same value.
pub fn same_value(a: &str, b: &str) -> bool {
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => (x - y).abs() <= f64::EPSILON * x.abs().max(y.abs()).max(1.0),
        _ => false,
    }
}

/// Whole gibibytes of a storage quantity, rounded up; `None` when it is not a quantity.
pub fn gibibytes(quantity: &str) -> Option<u64> {
    let bytes = parse(quantity)?;
    if bytes < 0.0 {
        return None;
    }
    // Values are far below 2^53 bytes, where f64 is exact.
    Some((bytes / 1024f64.powi(3)).ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_in_different_forms_are_the_same() {
        assert!(same_value("0.5", "500m"));
        assert!(same_value("1Gi", "1073741824"));
        assert!(same_value("2e3", "2k"));
        assert!(!same_value("1Gi", "1G"));
        assert!(!same_value("abc", "abc"));
    }

    #[test]
    fn storage_is_read_in_gibibytes() {
        assert_eq!(gibibytes("100Gi"), Some(100));
        assert_eq!(gibibytes("1Ti"), Some(1024));
        assert_eq!(gibibytes("1G"), Some(1));
        assert_eq!(gibibytes("lots"), None);
    }
}
