//! The request body: an intent's rmp-serde payload transcoded to JSON.

use crate::error::WebhookError;

/// Transcodes rmp-serde bytes (named fields) to a JSON document.
///
/// Structs become objects, sequences arrays, enums the usual externally tagged form. Maps
/// with non-string keys and raw bytes have no JSON form and are refused; non-finite floats
/// become `null`, as in `serde_json`.
pub(crate) fn to_json(kind: &str, key: &str, payload: &[u8]) -> Result<Vec<u8>, WebhookError> {
    let fail = |reason: String| WebhookError::Payload {
        key: key.to_owned(),
        kind: kind.to_owned(),
        reason,
    };
    let value: serde_json::Value = rmp_serde::from_slice(payload).map_err(|e| fail(e.to_string()))?;
    serde_json::to_vec(&value).map_err(|e| fail(e.to_string()))
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
        let json = to_json("notify", "k", &bytes).unwrap();
        assert_eq!(
            String::from_utf8(json).unwrap(),
            r#"{"cents":1200,"customer":"ada","tags":["vip"]}"#
        );
    }

    #[test]
    fn a_map_with_integer_keys_is_refused() {
        let bytes = rmp_serde::to_vec_named(&BTreeMap::from([(1u8, "one")])).unwrap();
        let error = to_json("notify", "k1", &bytes).unwrap_err();
        assert!(!error.is_retryable());
        assert!(error.to_string().contains("`k1` (notify)"), "{error}");
    }

    #[test]
    fn garbage_is_refused() {
        assert!(to_json("notify", "k", &[0xc1]).is_err());
    }
}
