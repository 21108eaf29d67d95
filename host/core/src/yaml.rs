//! YAML read the way kubectl reads it: every error names its place (`LINE:COL: field.path:
//! message`), and fields the target type does not know are refused (kubectl's strict field
//! validation) or, leniently, reported as warnings.
//!
//! A stream is parsed with `saphyr` (a maintained YAML 1.2 parser that keeps each node's
//! position) into JSON values plus the position of every field path; documents are then
//! deserialized from the values, with the path of a type error (`serde_path_to_error`) and of
//! every ignored field (`serde_ignored`) mapped back to the line and column it came from.

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt;

/// Where a problem is and what it is. Displayed `LINE:COL: path: message` (no path for the
/// document itself); prefixed with the file by whoever read it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct YamlError {
    /// 1-based.
    pub line: usize,
    /// 1-based.
    pub col: usize,
    /// `spec.pinnedImages[2].name`; empty for the document.
    pub path: String,
    pub message: String,
}

impl fmt::Display for YamlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: ", self.line, self.col)?;
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

/// Whether fields the target type does not know are errors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fields {
    /// Refused, naming the field (the default, as `kubectl --validate=strict`).
    #[default]
    Strict,
    /// Read, and returned as warnings.
    Lenient,
}

/// One document of a stream: its value and where each of its fields was.
#[derive(Clone, Debug)]
pub struct Document {
    pub value: serde_json::Value,
    /// Position (line, col) of the document's first node.
    pub start: (usize, usize),
    places: HashMap<String, (usize, usize)>,
}

/// Every document of `text`; empty documents are skipped.
pub fn documents(text: &str) -> Result<Vec<Document>, YamlError> {
    let docs = MarkedYaml::load_from_str(text).map_err(|e| YamlError {
        line: e.marker().line(),
        col: e.marker().col() + 1,
        path: String::new(),
        message: e.info().to_string(),
    })?;
    let mut out = Vec::new();
    for doc in docs {
        let mut places = HashMap::new();
        let value = to_json(&doc, String::new(), &mut places)?;
        if !value.is_null() {
            out.push(Document {
                value,
                start: place(&doc),
                places,
            });
        }
    }
    Ok(out)
}

/// One (line, col) for a node, both 1-based.
fn place(node: &MarkedYaml) -> (usize, usize) {
    (node.span.start.line(), node.span.start.col() + 1)
}

fn at(node: &MarkedYaml, path: &str, message: String) -> YamlError {
    let (line, col) = place(node);
    YamlError {
        line,
        col,
        path: path.to_string(),
        message,
    }
}

fn to_json(
    node: &MarkedYaml,
    path: String,
    places: &mut HashMap<String, (usize, usize)>,
) -> Result<serde_json::Value, YamlError> {
    use serde_json::Value;
    Ok(match &node.data {
        YamlData::Value(scalar) => scalar_to_json(scalar),
        YamlData::Representation(text, ..) => Value::String(text.to_string()),
        YamlData::Tagged(_, inner) => to_json(inner, path, places)?,
        YamlData::Sequence(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let item_path = format!("{path}[{i}]");
                places.insert(item_path.clone(), place(item));
                out.push(to_json(item, item_path, places)?);
            }
            Value::Array(out)
        }
        YamlData::Mapping(map) => {
            let mut out = serde_json::Map::new();
            for (key, value) in map {
                let name = match &key.data {
                    YamlData::Value(Scalar::String(s)) => s.to_string(),
                    YamlData::Value(scalar) => scalar_to_json(scalar).to_string(),
                    _ => return Err(at(key, &path, "a mapping key must be a scalar".into())),
                };
                let field = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}.{name}")
                };
                places.insert(field.clone(), place(key));
                out.insert(name, to_json(value, field, places)?);
            }
            Value::Object(out)
        }
        YamlData::Alias(_) => {
            return Err(at(node, &path, "aliases (*name) are not supported".into()));
        }
        _ => return Err(at(node, &path, "not a valid YAML value".into())),
    })
}

fn scalar_to_json(scalar: &Scalar) -> serde_json::Value {
    use serde_json::Value;
    match scalar {
        Scalar::Null => Value::Null,
        Scalar::Boolean(b) => Value::Bool(*b),
        Scalar::Integer(i) => Value::from(*i),
        Scalar::FloatingPoint(f) => serde_json::Number::from_f64(f.into_inner())
            .map_or_else(|| Value::String(f.to_string()), Value::Number),
        Scalar::String(s) => Value::String(s.to_string()),
    }
}

impl Document {
    /// The position of `path`, else of its nearest ancestor that has one, else the document's.
    pub fn place_of(&self, path: &str) -> (usize, usize) {
        let mut p = path;
        loop {
            if let Some(place) = self.places.get(p) {
                return *place;
            }
            match p.rfind(['.', '[']) {
                Some(cut) => p = &p[..cut],
                None => return self.start,
            }
        }
    }

    /// The value at `path` (`items[3]`) as a document of its own, its places kept: what a
    /// `List`'s item is to a reader of objects.
    pub fn item(&self, path: &str) -> Option<Document> {
        let value = self.pointer(path)?.clone();
        let places = self
            .places
            .iter()
            .filter_map(|(p, at)| {
                let rest = p.strip_prefix(path)?;
                let rest = match rest.strip_prefix('.') {
                    Some(field) => field,
                    None if rest.starts_with('[') => rest,
                    None => return None,
                };
                Some((rest.to_string(), *at))
            })
            .collect();
        Some(Document {
            value,
            start: self.place_of(path),
            places,
        })
    }

    /// The value at a field path (`a.b[0].c`; field names without '.' or '[').
    fn pointer(&self, path: &str) -> Option<&serde_json::Value> {
        let mut v = &self.value;
        for part in path.split('.') {
            let (field, indices) = part.split_once('[').map_or((part, ""), |(f, i)| (f, i));
            if !field.is_empty() {
                v = v.get(field)?;
            }
            for index in indices.split('[').filter(|i| !i.is_empty()) {
                v = v.get(index.trim_end_matches(']').parse::<usize>().ok()?)?;
            }
        }
        Some(v)
    }

    /// An error at `path` of this document.
    pub fn error(&self, path: &str, message: impl Into<String>) -> YamlError {
        let (line, col) = self.place_of(path);
        YamlError {
            line,
            col,
            path: path.to_string(),
            message: message.into(),
        }
    }

    /// The document (or `value`, a changed copy of it) as `T`. Unknown fields are an error
    /// ([`Fields::Strict`]) or returned as warnings ([`Fields::Lenient`]).
    pub fn typed<T: DeserializeOwned>(
        &self,
        value: serde_json::Value,
        fields: Fields,
    ) -> Result<(T, Vec<YamlError>), YamlError> {
        let mut ignored = Vec::new();
        let mut note = |p: serde_ignored::Path| ignored.push(ignored_path(&p));
        let ignoring = serde_ignored::Deserializer::new(value, &mut note);
        let typed: Result<T, _> = serde_path_to_error::deserialize(ignoring);
        let mut unknown: Vec<YamlError> = ignored
            .iter()
            .map(|path| self.error(path, "unknown field"))
            .collect();
        // In the order of the document (values are read in key order).
        unknown.sort_by_key(|e| (e.line, e.col));
        let typed = match typed {
            Ok(typed) => typed,
            Err(e) => {
                let error = self.error(&error_path(e.path()), e.into_inner().to_string());
                // A misspelt field usually also leaves a required one missing: name the
                // misspelling first.
                return Err(match unknown.into_iter().next() {
                    Some(mut first) => {
                        first.message =
                            format!("unknown field (and {}: {})", error.path, error.message);
                        first
                    }
                    None => error,
                });
            }
        };
        match (fields, unknown.first()) {
            (Fields::Strict, Some(first)) => Err(first.clone()),
            _ => Ok((typed, unknown)),
        }
    }
}

/// `a.b[0].c` from serde_ignored's path (which also marks `Option`s and newtypes).
fn ignored_path(p: &serde_ignored::Path) -> String {
    use serde_ignored::Path;
    match p {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", ignored_path(parent)),
        Path::Map { parent, key } => {
            let parent = ignored_path(parent);
            if parent.is_empty() {
                key.clone()
            } else {
                format!("{parent}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => ignored_path(parent),
    }
}

/// `a.b[0].c` from serde_path_to_error's path.
fn error_path(p: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in p.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Enum { .. } | Segment::Unknown => {}
        }
    }
    out
}

/// Every document of `text` as `T` (strict or lenient), each error prefixed by nothing: the
/// caller names the file.
pub fn from_str<T: DeserializeOwned>(
    text: &str,
    fields: Fields,
) -> Result<(T, Vec<YamlError>), YamlError> {
    let docs = documents(text)?;
    match docs.as_slice() {
        [doc] => doc.typed(doc.value.clone(), fields),
        [] => Err(YamlError {
            line: 1,
            col: 1,
            path: String::new(),
            message: "empty document".into(),
        }),
        [_, second, ..] => Err(second.error("", "one document expected, found several")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Set {
        spec: Option<Spec>,
    }

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Spec {
        pinned_images: Vec<Image>,
    }

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Image {
        name: String,
    }

    #[test]
    fn a_syntax_error_names_line_and_column() {
        let e = documents("a: 1\nb: [1, 2\nc: 3\n").unwrap_err();
        assert!(e.line >= 2 && e.col >= 1, "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("{}:{}: ", e.line, e.col)),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_field_is_refused_with_its_path_and_place_or_warned_about() {
        let text = "spec:\n  pinnedImages:\n    - name: a\n      nam: b\n  pinnedImage: []\n";
        let e = from_str::<Set>(text, Fields::Strict).unwrap_err();
        assert_eq!(
            e.to_string(),
            "4:7: spec.pinnedImages[0].nam: unknown field"
        );
        let (set, warnings) = from_str::<Set>(text, Fields::Lenient).unwrap();
        assert_eq!(set.spec.unwrap().pinned_images[0].name, "a");
        let said: Vec<String> = warnings.iter().map(ToString::to_string).collect();
        assert_eq!(
            said,
            [
                "4:7: spec.pinnedImages[0].nam: unknown field",
                "5:3: spec.pinnedImage: unknown field"
            ]
        );
    }

    #[test]
    fn a_wrong_type_names_the_field_and_its_line() {
        let e = from_str::<Set>("spec:\n  pinnedImages: {name: a}\n", Fields::Strict).unwrap_err();
        assert_eq!(e.path, "spec.pinnedImages");
        assert_eq!((e.line, e.col), (2, 3));
        assert!(e.message.contains("expected a sequence"), "{e}");
    }

    #[test]
    fn documents_positions_count_from_the_stream() {
        let docs = documents("a: 1\n---\n\n---\nb:\n  c: 2\n").unwrap();
        assert_eq!(docs.len(), 2, "the empty document is skipped");
        assert_eq!(docs[1].place_of("b.c"), (6, 3));
        assert_eq!(
            docs[1].place_of("b.c.d[3]"),
            (6, 3),
            "nearest known ancestor"
        );
        let e = documents("a: *x\n").unwrap_err();
        assert!(e.message.contains("alias") || e.line == 1, "{e}");
    }

    #[test]
    fn scalars_keep_their_yaml_types() {
        let docs = documents("i: 120000000000\nf: 1.5\ns: '1e11'\nb: true\nn: ~\n").unwrap();
        let v = &docs[0].value;
        assert_eq!(v["i"], 120000000000i64);
        assert_eq!(v["f"], 1.5);
        assert_eq!(v["s"], "1e11");
        assert_eq!(v["b"], true);
        assert!(v["n"].is_null());
    }

    #[test]
    fn a_lists_item_is_a_document_whose_places_are_the_lists() {
        let text =
            "kind: List\nitems:\n- kind: A\n  spec:\n    x: [1, 2]\n- kind: B\n  spec:\n    y: 2\n";
        let list = &documents(text).unwrap()[0];
        let b = list.item("items[1]").unwrap();
        assert_eq!(b.value["kind"], "B");
        assert_eq!(b.start, (6, 3));
        assert_eq!(b.place_of("spec.y"), (8, 5));
        let a = list.item("items[0]").unwrap();
        assert_eq!(a.error("spec.x[1]", "no").line, 5);
        assert!(list.item("items[2]").is_none() && list.item("nope").is_none());
    }
}

#[cfg(test)]
mod flow_tests {
    #[test]
    fn flow_mappings_read_like_block_ones() {
        let docs = super::documents("metadata: {name: w1, labels: {node-role.kubernetes.io/worker: '', pinset.test/hostile: giant-reason}}\n").unwrap();
        let labels = &docs[0].value["metadata"]["labels"];
        assert_eq!(labels["pinset.test/hostile"], "giant-reason", "{labels}");
        assert_eq!(labels["node-role.kubernetes.io/worker"], "", "{labels}");
    }
}
