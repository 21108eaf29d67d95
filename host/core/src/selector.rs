//! Kubernetes label selectors (`matchLabels` + `matchExpressions`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl LabelSelector {
    /// No requirement at all. For pools, an empty selector selects nothing.
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    /// Whether `labels` satisfy every requirement. An empty selector matches everything (the
    /// Kubernetes meaning); callers that want "empty selects nothing" check [`Self::is_empty`].
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator {
                    Operator::In => value.is_some_and(|v| r.values.contains(v)),
                    Operator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                    Operator::Exists => value.is_some(),
                    Operator::DoesNotExist => value.is_none(),
                }
            })
    }

    pub fn labels(pairs: &[(&str, &str)]) -> Self {
        Self {
            match_labels: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn match_labels_and_expressions() {
        let role = "machineconfiguration.openshift.io/role";
        let (sel, _): (LabelSelector, _) = crate::yaml::from_str(
            &format!("matchExpressions: [{{key: {role}, operator: In, values: [worker, infra]}}]"),
            crate::yaml::Fields::Strict,
        )
        .unwrap();
        assert!(sel.matches(&labels(&[(role, "worker")])));
        assert!(sel.matches(&labels(&[(role, "infra")])));
        assert!(!sel.matches(&labels(&[(role, "master")])));
        assert!(!sel.matches(&labels(&[])));
        let not_in = LabelSelector {
            match_expressions: vec![Requirement {
                key: "a".into(),
                operator: Operator::NotIn,
                values: vec!["x".into()],
            }],
            ..Default::default()
        };
        assert!(not_in.matches(&labels(&[])) && !not_in.matches(&labels(&[("a", "x")])));
        let exists = LabelSelector {
            match_labels: labels(&[("b", "1")]),
            match_expressions: vec![Requirement {
                key: "a".into(),
                operator: Operator::Exists,
                values: vec![],
            }],
        };
        assert!(exists.matches(&labels(&[("a", ""), ("b", "1")])));
        assert!(!exists.matches(&labels(&[("a", ""), ("b", "2")])));
        assert!(LabelSelector::default().is_empty());
    }
}
