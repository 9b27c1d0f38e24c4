//! Field diffs: two encodings of an artifact compared field by field, for replay divergences
//! and branch diffs.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::model::hash;

/// One field that differs between the recorded and the replayed content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldDiff {
    /// The field's path, e.g. `.total_cents`, `.lines[2].sku` or `payload.sent_at`; empty for
    /// the whole value.
    pub path: String,
    /// The recorded value, JSON-like; `absent` if the field is missing.
    pub recorded: String,
    /// The replayed value, JSON-like; `absent` if the field is missing.
    pub replayed: String,
}

/// The fields that differ between two rmp-serde encodings, `path` naming the root (empty for
/// the whole value); empty if either does not decode.
pub(crate) fn diff_bytes(path: &str, a: &[u8], b: &[u8]) -> Vec<FieldDiff> {
    let mut out = Vec::new();
    if let (Ok(va), Ok(vb)) = (rmp_serde::from_slice::<Value>(a), rmp_serde::from_slice::<Value>(b)) {
        diff_values(path, Some(&va), Some(&vb), &mut out);
    }
    out
}

const MAX_FIELDS: usize = 16;

fn diff_values(path: &str, a: Option<&Value>, b: Option<&Value>, out: &mut Vec<FieldDiff>) {
    if out.len() >= MAX_FIELDS || a == b {
        return;
    }
    match (a, b) {
        (Some(Value::Map(ma)), Some(Value::Map(mb))) => {
            for (key, va) in ma {
                let vb = mb.iter().find(|(k, _)| k == key).map(|(_, v)| v);
                diff_values(&child(path, key), Some(va), vb, out);
            }
            for (key, vb) in mb {
                if !ma.iter().any(|(k, _)| k == key) {
                    diff_values(&child(path, key), None, Some(vb), out);
                }
            }
        }
        (Some(Value::Seq(sa)), Some(Value::Seq(sb))) => {
            for i in 0..sa.len().max(sb.len()) {
                diff_values(&format!("{path}[{i}]"), sa.get(i), sb.get(i), out);
            }
        }
        _ => out.push(FieldDiff {
            path: path.to_owned(),
            recorded: a.map_or_else(|| "absent".to_owned(), Value::to_string),
            replayed: b.map_or_else(|| "absent".to_owned(), Value::to_string),
        }),
    }
}

fn child(path: &str, key: &Value) -> String {
    match key {
        Value::Str(name) => format!("{path}.{name}"),
        other => format!("{path}[{other}]"),
    }
}

/// Any rmp-serde value, decoded without knowing its type, for field-by-field comparison.
#[derive(Clone, Debug, PartialEq)]
enum Value {
    Nil,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Seq(Vec<Value>),
    Map(Vec<(Value, Value)>),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Nil => f.write_str("null"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x}"),
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Bytes(b) => write!(f, "<{} bytes {}>", b.len(), hash::hex(&b[..b.len().min(16)])),
            Value::Seq(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            Value::Map(entries) => {
                f.write_str("{")?;
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{k}: {v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ValueVisitor;
        impl<'de> Visitor<'de> for ValueVisitor {
            type Value = Value;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any MessagePack value")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
                Ok(Value::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
                Ok(Value::Int(v.into()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
                Ok(Value::Int(v.into()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
                Ok(Value::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
                Ok(Value::Str(v.to_owned()))
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Value, E> {
                Ok(Value::Bytes(v.to_vec()))
            }
            fn visit_none<E: de::Error>(self) -> Result<Value, E> {
                Ok(Value::Nil)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
                Ok(Value::Nil)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
                Value::deserialize(d)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Value::Seq(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Value::Map(entries))
            }
        }
        deserializer.deserialize_any(ValueVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize)]
    struct Line {
        sku: String,
        qty: u32,
    }

    #[derive(serde::Serialize)]
    struct Invoice {
        lines: Vec<Line>,
        total: u64,
        note: Option<String>,
    }

    #[test]
    fn field_diffs_name_the_paths_that_differ() {
        let a = crate::model::artifact::encode(&Invoice {
            lines: vec![Line {
                sku: "a".into(),
                qty: 1,
            }],
            total: 10,
            note: None,
        })
        .unwrap();
        let b = crate::model::artifact::encode(&Invoice {
            lines: vec![Line {
                sku: "a".into(),
                qty: 2,
            }],
            total: 10,
            note: Some("x".into()),
        })
        .unwrap();
        let diffs = diff_bytes("", &a, &b);
        let paths: Vec<_> = diffs
            .iter()
            .map(|d| (d.path.as_str(), d.recorded.as_str(), d.replayed.as_str()))
            .collect();
        assert_eq!(paths, [(".lines[0].qty", "1", "2"), (".note", "null", "\"x\"")]);
    }
}
