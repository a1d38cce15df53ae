//! Comparing what a test asked for with what the API server holds.

use serde_json::Value;

/// Whether everything `expected` sets is in `actual` (which may hold more:
/// defaults). Lists must match element by element.
pub fn contains(actual: &Value, expected: &Value) -> bool {
    match (actual, expected) {
        (Value::Object(actual), Value::Object(expected)) => expected
            .iter()
            .all(|(key, value)| actual.get(key).is_some_and(|a| contains(a, value))),
        (Value::Array(actual), Value::Array(expected)) => {
            actual.len() == expected.len()
                && actual.iter().zip(expected).all(|(a, e)| contains(a, e))
        }
        // YAML's 1 and the server's 1.0 are the same number.
        (Value::Number(a), Value::Number(e)) => a.as_f64() == e.as_f64(),
        _ => actual == expected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_the_api_server_defaulted_do_not_count() {
        assert!(contains(
            &json!({ "a": 1, "b": [{ "c": 2, "d": 3 }] }),
            &json!({ "b": [{ "c": 2 }] })
        ));
        assert!(!contains(&json!({ "b": [1, 2] }), &json!({ "b": [1] })));
        assert!(!contains(&json!({ "a": 1 }), &json!({ "a": 2 })));
        assert!(!contains(&json!({}), &json!({ "a": 1 })));
    }
}
