//! Checks an input response (`tasks/update` `inputResponses` value) against the input request
//! it answers, so that a malformed answer is refused (and does not use up its key) instead of
//! being handed to the tool.
//!
//! - `elicitation/create` expects an `ElicitResult`: `action` is `accept`, `decline` or
//!   `cancel`; with `accept`, `content` is an object that matches the request's
//!   `requestedSchema` (when the request has one); `content` is never anything but an object.
//! - `sampling/createMessage` expects a `CreateMessageResult`: `role`, `content` and `model`.
//! - `roots/list` expects a `ListRootsResult`: a `roots` array of objects with a `uri`.
//! - Any other request: a JSON object.

use serde_json::Value;

/// Longest validation detail quoted back to a client.
const MAX_DETAIL: usize = 200;

/// `Err(reason)` when `response` is not a valid answer to `request`.
pub(crate) fn check(request: &Value, response: &Value) -> Result<(), String> {
    let Some(answer) = response.as_object() else {
        return Err("must be a JSON object".into());
    };
    match request.get("method").and_then(Value::as_str) {
        Some("elicitation/create") => {
            let action = answer
                .get("action")
                .ok_or_else(|| "needs `action` (accept, decline or cancel)".to_owned())?;
            let action = action.as_str().unwrap_or_default();
            if !matches!(action, "accept" | "decline" | "cancel") {
                return Err(format!(
                    "has an invalid `action` {}: it must be accept, decline or cancel",
                    cap(&answer["action"].to_string())
                ));
            }
            let content = match answer.get("content") {
                None => None,
                Some(Value::Object(c)) => Some(c),
                Some(other) => {
                    return Err(format!(
                        "has a `content` that is not an object: {}",
                        cap(&other.to_string())
                    ));
                }
            };
            let schema = request
                .get("params")
                .and_then(|p| p.get("requestedSchema"))
                .filter(|s| s.is_object());
            if action == "accept"
                && let Some(schema) = schema
            {
                let content = content
                    .ok_or_else(|| "accepts a form elicitation without `content`".to_owned())?;
                // A schema the tool wrote that does not compile is the tool's problem, not the
                // client's: the answer is then not checked beyond its shape.
                if let Ok(validator) = jsonschema::validator_for(schema)
                    && let Some(err) = validator
                        .iter_errors(&Value::Object(content.clone()))
                        .next()
                {
                    let path = err.instance_path().to_string();
                    let field = format!("content{}", path.replace('/', "."));
                    return Err(format!(
                        "has `{field}` not matching the requestedSchema: {}",
                        cap(&err.to_string())
                    ));
                }
            }
            Ok(())
        }
        Some("sampling/createMessage") => {
            for member in ["role", "content", "model"] {
                if !answer.contains_key(member) {
                    return Err(format!("needs `{member}` (a sampling result)"));
                }
            }
            if !answer["role"].is_string() || !answer["model"].is_string() {
                return Err("needs string `role` and `model` (a sampling result)".into());
            }
            Ok(())
        }
        Some("roots/list") => match answer.get("roots") {
            Some(Value::Array(roots))
                if roots
                    .iter()
                    .all(|r| r.get("uri").is_some_and(Value::is_string)) =>
            {
                Ok(())
            }
            _ => Err("needs `roots`: an array of objects with a `uri`".into()),
        },
        _ => Ok(()),
    }
}

fn cap(text: &str) -> String {
    if text.len() <= MAX_DETAIL {
        return text.to_owned();
    }
    let mut cut = MAX_DETAIL;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::check;

    fn form() -> serde_json::Value {
        json!({
            "method": "elicitation/create",
            "params": {
                "mode": "form",
                "message": "Delete?",
                "requestedSchema": {
                    "type": "object",
                    "properties": { "confirm": { "type": "boolean" } },
                    "required": ["confirm"]
                }
            }
        })
    }

    #[test]
    fn elicitation_answers_table() {
        let cases = [
            (
                json!({ "action": "accept", "content": { "confirm": true } }),
                Ok(()),
            ),
            (json!({ "action": "decline" }), Ok(())),
            (json!({ "action": "cancel", "content": {} }), Ok(())),
            (json!(5), Err("must be a JSON object")),
            (
                json!({ "content": { "confirm": true } }),
                Err("needs `action` (accept, decline or cancel)"),
            ),
            (
                json!({ "action": "bogus" }),
                Err("has an invalid `action` \"bogus\": it must be accept, decline or cancel"),
            ),
            (
                json!({ "action": "accept", "content": { "confirm": "yes" } }),
                Err(
                    "has `content.confirm` not matching the requestedSchema: \"yes\" is not of type \"boolean\"",
                ),
            ),
            (
                json!({ "action": "accept", "content": {} }),
                Err(
                    "has `content` not matching the requestedSchema: \"confirm\" is a required property",
                ),
            ),
            (
                json!({ "action": "accept" }),
                Err("accepts a form elicitation without `content`"),
            ),
            (
                json!({ "action": "decline", "content": [1] }),
                Err("has a `content` that is not an object: [1]"),
            ),
        ];
        for (answer, expected) in cases {
            assert_eq!(
                check(&form(), &answer),
                expected.map_err(str::to_owned),
                "{answer}"
            );
        }
    }

    #[test]
    fn other_requests_table() {
        let sampling = json!({ "method": "sampling/createMessage", "params": {} });
        assert_eq!(
            check(
                &sampling,
                &json!({ "role": "assistant", "content": { "type": "text", "text": "hi" }, "model": "m" })
            ),
            Ok(())
        );
        assert_eq!(
            check(&sampling, &json!({ "role": "assistant", "content": {} })),
            Err("needs `model` (a sampling result)".to_owned())
        );
        let roots = json!({ "method": "roots/list" });
        assert_eq!(
            check(&roots, &json!({ "roots": [{ "uri": "file:///" }] })),
            Ok(())
        );
        assert_eq!(
            check(&roots, &json!({ "roots": [{}] })),
            Err("needs `roots`: an array of objects with a `uri`".to_owned())
        );
        let custom = json!({ "method": "x/custom" });
        assert_eq!(check(&custom, &json!({ "anything": 1 })), Ok(()));
        assert_eq!(
            check(&custom, &json!("text")),
            Err("must be a JSON object".to_owned())
        );
    }
}
