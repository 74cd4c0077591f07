//! A cluster request's JSON body: an object of known fields, each with its
//! rule. Every refusal is a 400 naming the field (or `body`), never echoing a
//! value.
use serde_json::{Map, Value};

use crate::error::GatewayError;
use crate::secret::looks_like_secret;

/// Longest cluster name: a DNS label.
const MAX_NAME_CHARS: usize = 63;

/// The body as a JSON object holding only `fields`: else a 400 naming the
/// body or the first unknown field.
pub(super) fn json_object(
    body: &[u8],
    fields: &[&str],
) -> Result<Map<String, Value>, GatewayError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| GatewayError::bad_field("body", &format!("is not valid JSON ({e})")))?;
    let Value::Object(input) = value else {
        return Err(GatewayError::bad_field("body", "must be a JSON object"));
    };
    if let Some(unknown) = input.keys().find(|k| !fields.contains(&k.as_str())) {
        // Never echo a credential pasted in the wrong place.
        if looks_like_secret(unknown.bytes()) {
            return Err(GatewayError::bad_field("body", "holds an unknown field"));
        }
        return Err(GatewayError::bad_field(unknown.as_str(), "unknown field"));
    }
    Ok(input)
}

/// A cluster name, when given: 1–63 lower-case letters, digits and `-`,
/// starting with a letter and not ending with `-` (it becomes a host name).
pub(super) fn name(value: Option<&Value>) -> Result<Option<String>, GatewayError> {
    let s = match value {
        None => return Ok(None),
        Some(Value::String(s)) => s,
        Some(_) => return Err(GatewayError::bad_field("name", "must be a string")),
    };
    let valid = (1..=MAX_NAME_CHARS).contains(&s.len())
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && !s.ends_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !valid {
        return Err(GatewayError::bad_field(
            "name",
            "must be 1-63 lower-case letters, digits and '-', starting with a letter and not ending with '-'",
        ));
    }
    Ok(Some(s.clone()))
}

/// One of `allowed`, when given.
pub(super) fn one_of(
    field: &str,
    value: Option<&Value>,
    allowed: &'static [&'static str],
) -> Result<Option<&'static str>, GatewayError> {
    match value {
        None => Ok(None),
        Some(Value::String(s)) => match allowed.iter().copied().find(|a| *a == s.as_str()) {
            Some(a) => Ok(Some(a)),
            None => Err(GatewayError::bad_field(
                field,
                &format!("must be one of {}", allowed.join(", ")),
            )),
        },
        Some(_) => Err(GatewayError::bad_field(field, "must be a string")),
    }
}
