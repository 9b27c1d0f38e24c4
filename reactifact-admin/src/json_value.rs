//! Artifact and payload bytes (rmp-serde, named fields) shown as JSON, without their Rust
//! types: maps, sequences, strings, numbers, booleans and nulls map to their JSON forms, and
//! byte strings to lowercase hex strings.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// A JSON value decoded from any self-describing serde input.
struct Json(Value);

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor).map(Json)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_bytes<E>(self, v: &[u8]) -> Result<Value, E> {
        Ok(Value::String(v.iter().map(|b| format!("{b:02x}")).collect()))
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(JsonVisitor)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(JsonVisitor)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Json(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some((Json(key), Json(value))) = map.next_entry()? {
            let key = match key {
                Value::String(s) => s,
                other => other.to_string(),
            };
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, _data: A) -> Result<Value, A::Error> {
        Err(de::Error::custom("an enum tag outside a map"))
    }
}

/// The bytes as JSON, or `None` if they do not decode as rmp-serde.
pub fn decode(bytes: &[u8]) -> Option<Value> {
    rmp_serde::from_slice::<Json>(bytes).ok().map(|Json(v)| v)
}

/// The bytes as pretty JSON text, or a note with their length and hex if they do not decode.
pub fn pretty(bytes: &[u8]) -> String {
    match decode(bytes) {
        Some(value) => serde_json::to_string_pretty(&value).expect("a JSON value serializes"),
        None => format!("({} bytes, not rmp-serde)", bytes.len()),
    }
}
