//! What a scenario expected and what the policy answered, where they differ: one [`Diff`] per
//! mismatch, carrying both values (for `policy test -o json` and JUnit) and, for a list, where it
//! first differs.

use serde::Serialize;
use serde_json::Value;
use std::fmt;

/// One mismatch of a scenario.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diff {
    /// What was compared: `order`, `admission.verdict`, `pulls[0] throttle ms (…)`, `grant`…
    pub what: String,
    pub expected: Value,
    pub actual: Value,
    /// What a reader needs beyond the values: the first position two lists differ at, an image
    /// the expectation names that the scenario does not list, the failures behind fallbacks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Diff {
    pub fn new(what: impl Into<String>, expected: impl Serialize, actual: impl Serialize) -> Self {
        Self {
            what: what.into(),
            expected: serde_json::to_value(expected).unwrap_or(Value::Null),
            actual: serde_json::to_value(actual).unwrap_or(Value::Null),
            note: None,
        }
    }

    /// A mismatch that is no comparison of values: a scenario that cannot be read, an
    /// expectation that names what does not exist.
    pub fn problem(what: impl Into<String>, note: impl Into<String>) -> Self {
        Self {
            note: Some(note.into()),
            ..Self::new(what, Value::Null, Value::Null)
        }
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }

    /// Two lists: the diff, noting the first position they differ at (or which is longer).
    pub fn lists<T: Serialize + PartialEq + fmt::Display>(
        what: impl Into<String>,
        expected: &[T],
        actual: &[T],
    ) -> Self {
        let first = expected.iter().zip(actual).position(|(e, a)| e != a);
        let note = match first {
            Some(i) => format!(
                "first difference at position {i}: expected {}, actual {}",
                expected[i], actual[i]
            ),
            None => format!(
                "the same for {} entries; expected {} in all, actual {}",
                expected.len().min(actual.len()),
                expected.len(),
                actual.len()
            ),
        };
        Self::new(what, expected, actual).with_note(note)
    }

    /// One line: `what: expected E, actual A` (a JUnit failure's message).
    pub fn summary(&self) -> String {
        match (&self.expected, &self.actual) {
            (Value::Null, Value::Null) => {
                format!("{}: {}", self.what, self.note.as_deref().unwrap_or(""))
            }
            (e, a) => format!("{}: expected {e}, actual {a}", self.what),
        }
    }
}

impl fmt::Display for Diff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.expected.is_null() && self.actual.is_null() {
            return write!(f, "{}", self.summary());
        }
        write!(
            f,
            "{}:\n  - expected {}\n  + actual   {}",
            self.what, self.expected, self.actual
        )?;
        if let Some(note) = &self.note {
            for line in note.lines() {
                write!(f, "\n    {line}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_marked_where_they_first_differ() {
        let d = Diff::lists("order", &["a", "b", "c"], &["a", "c", "b"]);
        assert_eq!(
            d.note.as_deref(),
            Some("first difference at position 1: expected b, actual c")
        );
        let text = d.to_string();
        assert!(
            text.starts_with("order:\n  - expected [\"a\",\"b\",\"c\"]"),
            "{text}"
        );
        assert!(text.ends_with("first difference at position 1: expected b, actual c"));
        let shorter = Diff::lists("order", &["a", "b"], &["a"]);
        assert!(
            shorter
                .note
                .unwrap()
                .contains("expected 2 in all, actual 1")
        );
        assert_eq!(
            Diff::new("concurrency", 3, 5).summary(),
            "concurrency: expected 3, actual 5"
        );
        let p = Diff::problem("expect.order", "names r/x@sha256:00, not in the images");
        assert_eq!(
            p.to_string(),
            "expect.order: names r/x@sha256:00, not in the images"
        );
        let json = serde_json::to_value(Diff::new("verdict", "admit-all", "reject")).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"what": "verdict", "expected": "admit-all", "actual": "reject"})
        );
    }
}
