//! Asking a person, on the terminal, for the answers to input requests: elicitation forms
//! field by field (typed: booleans, numbers, enums, strings), URL elicitations, sampling
//! (the person writes the reply) and roots (share the working directory or not).
//!
//! At any prompt `!decline` declines the request and `!cancel` cancels it.

use std::io::Write;
use std::sync::Arc;

use mcp_tasks::client::{InputHandler, input_handler};
use serde_json::{Map, Value, json};

/// An input handler that asks on the terminal (core MRTR rounds of `call`).
pub fn handler() -> Arc<dyn InputHandler> {
    input_handler(|key: String, request: Value| async move { ask(&key, &request).await })
}

/// Asks every request; returns the ones answered.
pub async fn ask_all(requests: &Map<String, Value>) -> Map<String, Value> {
    let mut answers = Map::new();
    for (key, request) in requests {
        if let Some(answer) = ask(key, request).await {
            answers.insert(key.clone(), answer);
        }
    }
    answers
}

/// One line from stdin after `prompt` on stderr; `None` at end of input.
async fn read_line(prompt: String) -> Option<String> {
    tokio::task::spawn_blocking(move || {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "{prompt}");
        let _ = err.flush();
        drop(err);
        let mut line = String::new();
        match std::io::stdin().read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line.trim_end_matches(['\r', '\n']).to_owned()),
        }
    })
    .await
    .ok()
    .flatten()
}

enum Refusal {
    Decline,
    Cancel,
    Eof,
}

/// A line, with `!decline` / `!cancel` / end of input as refusals.
async fn line(prompt: String) -> Result<String, Refusal> {
    match read_line(prompt).await {
        None => Err(Refusal::Eof),
        Some(l) if l.trim() == "!decline" => Err(Refusal::Decline),
        Some(l) if l.trim() == "!cancel" => Err(Refusal::Cancel),
        Some(l) => Ok(l.trim().to_owned()),
    }
}

async fn ask(key: &str, request: &Value) -> Option<Value> {
    let method = request.get("method").and_then(Value::as_str).unwrap_or("");
    let params = request.get("params").cloned().unwrap_or(Value::Null);
    match method {
        "elicitation/create" => elicit(key, &params).await,
        "sampling/createMessage" => sample(key, &params).await,
        "roots/list" => roots(key).await,
        other => {
            eprintln!("[{key}] cannot answer `{other}` on a terminal");
            None
        }
    }
}

fn refused(r: Refusal) -> Option<Value> {
    match r {
        Refusal::Decline => Some(json!({ "action": "decline" })),
        Refusal::Cancel => Some(json!({ "action": "cancel" })),
        Refusal::Eof => None,
    }
}

async fn elicit(key: &str, params: &Value) -> Option<Value> {
    let message = params.get("message").and_then(Value::as_str).unwrap_or("");
    eprintln!("\n? [{key}] {message}");
    if params.get("mode").and_then(Value::as_str) == Some("url") {
        let url = params.get("url").and_then(Value::as_str).unwrap_or("?");
        eprintln!("  open: {url}");
        return match line("  done? [y/N] (!decline, !cancel): ".into()).await {
            Ok(l) if yes(&l) == Some(true) => Some(json!({ "action": "accept" })),
            Ok(_) => Some(json!({ "action": "decline" })),
            Err(r) => refused(r),
        };
    }
    eprintln!("  (!decline declines, !cancel cancels)");
    let schema = params
        .get("requestedSchema")
        .cloned()
        .unwrap_or(Value::Null);
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut content = Map::new();
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    for (name, field) in properties {
        match field_value(name, field, required.contains(&name.as_str())).await {
            Ok(Some(v)) => {
                content.insert(name.clone(), v);
            }
            Ok(None) => {}
            Err(r) => return refused(r),
        }
    }
    Some(json!({ "action": "accept", "content": content }))
}

fn yes(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "y" | "yes" | "true" | "1" => Some(true),
        "n" | "no" | "false" | "0" => Some(false),
        _ => None,
    }
}

/// The options of an enum field: (value, label).
fn options(field: &Value) -> Option<Vec<(String, String)>> {
    let from_enum = |e: &Value| {
        e.as_array().map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|s| (s.to_owned(), s.to_owned()))
                .collect::<Vec<_>>()
        })
    };
    let from_consts = |o: &Value| {
        o.as_array().map(|a| {
            a.iter()
                .filter_map(|c| {
                    let v = c.get("const")?.as_str()?;
                    let t = c.get("title").and_then(Value::as_str).unwrap_or(v);
                    Some((v.to_owned(), t.to_owned()))
                })
                .collect::<Vec<_>>()
        })
    };
    field
        .get("enum")
        .and_then(from_enum)
        .or_else(|| field.get("oneOf").and_then(from_consts))
        .or_else(|| field.pointer("/items/enum").and_then(from_enum))
        .or_else(|| field.pointer("/items/anyOf").and_then(from_consts))
}

async fn field_value(name: &str, field: &Value, required: bool) -> Result<Option<Value>, Refusal> {
    let kind = field
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("string");
    let title = field.get("title").and_then(Value::as_str).unwrap_or(name);
    if let Some(d) = field.get("description").and_then(Value::as_str) {
        eprintln!("  {title}: {d}");
    }
    let default = field.get("default");
    let choices = options(field);
    if let Some(choices) = &choices {
        for (i, (_, label)) in choices.iter().enumerate() {
            eprintln!("    {}) {label}", i + 1);
        }
    }
    let hint = match (kind, &choices) {
        ("array", Some(_)) => "numbers or values, comma-separated".to_owned(),
        (_, Some(_)) => "number or value".to_owned(),
        ("boolean", None) => "y/n".to_owned(),
        (k, None) => k.to_owned(),
    };
    let default_hint = default.map(|d| format!(" [{d}]")).unwrap_or_default();
    let marker = if required { "" } else { ", optional" };
    loop {
        let input = line(format!("  {title} ({hint}{marker}){default_hint}: ")).await?;
        if input.is_empty() {
            if let Some(d) = default {
                return Ok(Some(d.clone()));
            }
            if !required {
                return Ok(None);
            }
            eprintln!("  a value is required");
            continue;
        }
        let pick = |s: &str| -> Option<String> {
            let choices = choices.as_ref()?;
            if let Ok(i) = s.parse::<usize>()
                && (1..=choices.len()).contains(&i)
            {
                return Some(choices[i - 1].0.clone());
            }
            choices.iter().find(|(v, _)| v == s).map(|(v, _)| v.clone())
        };
        let parsed = match (kind, &choices) {
            ("array", Some(_)) => input
                .split(',')
                .map(|s| pick(s.trim()))
                .collect::<Option<Vec<_>>>()
                .map(|v| json!(v)),
            (_, Some(_)) => pick(&input).map(Value::String),
            ("boolean", None) => yes(&input).map(Value::Bool),
            ("integer", None) => input.parse::<i64>().ok().map(|n| json!(n)),
            ("number", None) => input
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(Value::Number),
            _ => Some(Value::String(input.clone())),
        };
        match parsed {
            Some(v) => return Ok(Some(v)),
            None => eprintln!("  not a valid {hint}"),
        }
    }
}

async fn sample(key: &str, params: &Value) -> Option<Value> {
    eprintln!("\n? [{key}] the server asks for a model reply (sampling); you answer instead");
    if let Some(system) = params.get("systemPrompt").and_then(Value::as_str) {
        eprintln!("  system: {system}");
    }
    for m in params
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("?");
        let text = m
            .pointer("/content/text")
            .and_then(Value::as_str)
            .unwrap_or("[non-text content]");
        eprintln!("  {role}: {text}");
    }
    match line("  reply (empty to leave it unanswered): ".into()).await {
        Ok(reply) if !reply.is_empty() => Some(json!({
            "role": "assistant",
            "content": { "type": "text", "text": reply },
            "model": "human",
            "stopReason": "endTurn"
        })),
        _ => None,
    }
}

async fn roots(key: &str) -> Option<Value> {
    let dir = std::env::current_dir().ok()?;
    let uri = format!("file://{}", dir.display());
    eprintln!("\n? [{key}] the server asks for the client's roots");
    match line(format!("  share {uri}? [y/N]: ")).await {
        Ok(l) if yes(&l) == Some(true) => {
            let name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| uri.clone());
            Some(json!({ "roots": [{ "uri": uri, "name": name }] }))
        }
        Ok(_) => Some(json!({ "roots": [] })),
        Err(_) => None,
    }
}
