//! Tool arguments: an intent's rmp-serde payload transcoded to a JSON object.

use serde_json::{Map, Value};

/// Transcodes rmp-serde bytes (named fields) to a JSON object, or says why it cannot.
///
/// Structs become objects, sequences arrays, enums the usual externally tagged form. A tool's
/// arguments are an object, so a payload that is not one (a number, a sequence, a unit
/// variant) is refused, as are maps with non-string keys and raw bytes, which have no JSON
/// form.
pub(crate) fn to_arguments(payload: &[u8]) -> Result<Map<String, Value>, String> {
    let value: Value = rmp_serde::from_slice(payload).map_err(|e| e.to_string())?;
    object(value)
}

/// `value` as an object, or why it is not one.
pub(crate) fn object(value: Value) -> Result<Map<String, Value>, String> {
    match value {
        Value::Object(map) => Ok(map),
        other => Err(format!(
            "tool arguments are a JSON object, and this is {}",
            match other {
                Value::Null => "null",
                Value::Bool(_) => "a boolean",
                Value::Number(_) => "a number",
                Value::String(_) => "a string",
                Value::Array(_) => "an array",
                Value::Object(_) => "an object",
            }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn named_fields_become_an_object() {
        #[derive(serde::Serialize)]
        struct Notify {
            customer: String,
            cents: u64,
            tags: Vec<&'static str>,
        }
        let bytes = rmp_serde::to_vec_named(&Notify {
            customer: "ada".into(),
            cents: 1200,
            tags: vec!["vip"],
        })
        .unwrap();
        let arguments = to_arguments(&bytes).unwrap();
        assert_eq!(
            Value::Object(arguments).to_string(),
            r#"{"cents":1200,"customer":"ada","tags":["vip"]}"#
        );
    }

    #[test]
    fn what_is_not_an_object_is_refused() {
        let error = to_arguments(&rmp_serde::to_vec_named(&[1, 2]).unwrap()).unwrap_err();
        assert!(error.contains("an array"), "{error}");
        let bytes = rmp_serde::to_vec_named(&BTreeMap::from([(1u8, "one")])).unwrap();
        assert!(to_arguments(&bytes).is_err());
        assert!(to_arguments(&[0xc1]).is_err());
    }
}
