//! Kubernetes-style byte quantities (`16Gi`, `500M`, `1048576`).

use std::fmt;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid quantity {input:?}: {why}")]
pub struct QuantityError {
    pub input: String,
    pub why: &'static str,
}

/// Parse a byte quantity: a non-negative integer or decimal with an optional suffix
/// (`Ki Mi Gi Ti Pi Ei`, `k M G T P E`).
pub fn parse_bytes(input: &str) -> Result<u64, QuantityError> {
    let err = |why| QuantityError {
        input: input.to_string(),
        why,
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    if number.is_empty() {
        return Err(err("expected a number"));
    }
    let multiplier: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => decimal_exponent(suffix).ok_or_else(|| err("unknown suffix"))?,
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(err("malformed number"));
    }
    let whole: u64 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| err("too large"))?
    };
    let mut bytes = whole
        .checked_mul(multiplier)
        .ok_or_else(|| err("too large"))?;
    if !frac.is_empty() {
        let digits = frac.len().min(18) as u32;
        let frac_value: u128 = frac[..digits as usize]
            .parse()
            .map_err(|_| err("malformed number"))?;
        let extra = frac_value * multiplier as u128 / 10u128.pow(digits);
        bytes = bytes
            .checked_add(extra as u64)
            .ok_or_else(|| err("too large"))?;
    }
    Ok(bytes)
}

/// `e3`, `E+11`: a decimal exponent, as Kubernetes quantities allow (`E` alone is exa).
fn decimal_exponent(suffix: &str) -> Option<u64> {
    let digits = suffix.strip_prefix(['e', 'E'])?;
    let n: u32 = digits.strip_prefix('+').unwrap_or(digits).parse().ok()?;
    10u64.checked_pow(n)
}

/// A byte count that reads and writes as a quantity (`16Gi`) in YAML; plain integers also read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&pinset_policy_sdk::fmt_bytes(self.0))
    }
}

impl<'de> serde::Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(Bytes(n)),
            Raw::Text(s) => parse_bytes(&s).map(Bytes).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_exponents_read_as_kubernetes_reads_them() {
        assert_eq!(parse_bytes("1e11").unwrap(), 100_000_000_000);
        assert_eq!(parse_bytes("1.5E+3").unwrap(), 1_500);
        assert_eq!(parse_bytes("2E").unwrap(), 2_000_000_000_000_000_000);
        assert!(parse_bytes("1e-3").is_err());
        assert!(parse_bytes("1e99").is_err());
    }

    #[test]
    fn parses_binary_decimal_and_plain() {
        assert_eq!(parse_bytes("16Gi"), Ok(16 << 30));
        assert_eq!(parse_bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_bytes("500M"), Ok(500_000_000));
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes(" 0 "), Ok(0));
    }

    #[test]
    fn rejects_garbage_with_the_input_named() {
        let e = parse_bytes("12Qi").unwrap_err();
        assert_eq!(e.why, "unknown suffix");
        assert!(e.to_string().contains("12Qi"));
        assert!(parse_bytes("Gi").is_err());
        assert!(parse_bytes("1.2.3").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("99999999999Ei").is_err());
    }

    #[test]
    fn deserializes_from_yaml_numbers_and_strings() {
        let strict = crate::yaml::Fields::Strict;
        let (v, _): (Vec<Bytes>, _) = crate::yaml::from_str("[1024, '2Ki', 3Mi]", strict).unwrap();
        assert_eq!(v, vec![Bytes(1024), Bytes(2048), Bytes(3 << 20)]);
        assert!(crate::yaml::from_str::<Bytes>("'lots'", strict).is_err());
    }
}
