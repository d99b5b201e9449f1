//! The input rounds of a call to a `2026-07-28` upstream, kept so that a call resumes at the
//! upstream's pending round instead of calling its round 1 again.
//!
//! Such an upstream asks for input by answering `tools/call` with an `input_required` result
//! (its `inputRequests` and an opaque `requestState`); the call is then *over* upstream —
//! nothing is in flight — until it is made again with the answers. The gateway records each
//! such result before it asks its own client (`gateway.eE.round-N`), and records that it sent
//! the answers of round N before it sends them (`gateway.eE.answered-N`). In a task these are
//! journal steps; in a synchronous call they travel in the gateway's own signed
//! `requestState` from one MRTR round to the next ([`crate::tool::ToolContext`]'s carried
//! values). So:
//!
//! - a run that finds round N recorded and not answered resumes there: it asks the client (an
//!   answer already given is returned at once) and sends round N+1 — after a gateway restart
//!   while the task waits for input, and on each round of a synchronous call alike;
//! - a run that finds round N answered knows the call with its answers may have reached the
//!   upstream: the crash rule applies (an idempotent tool calls again from round 1 in a new
//!   epoch `E+1`, any other fails).
//!
//! The upstream's state of a round expires ([`super::Upstream::state_ttl`]); a round resumed
//! after its deadline fails at once with [`UpstreamError::StateExpired`], and a task waiting
//! for input fails at the deadline rather than take an answer the upstream would refuse.

use serde_json::{Map, Value, json};

use super::error::UpstreamError;
use super::link::Hooks;

/// Most epochs (calls from round 1 after a restart) looked for.
const MAX_EPOCHS: u32 = 64;
/// Most rounds of one call.
pub(crate) const MAX_ROUNDS: u32 = 16;

fn round_step(epoch: u32, round: u32) -> String {
    format!("gateway.e{epoch}.round-{round}")
}

fn answered_step(epoch: u32, round: u32) -> String {
    format!("gateway.e{epoch}.answered-{round}")
}

/// One `input_required` result of the upstream, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Round {
    /// Its number in the call (1 for the answer to the first `tools/call`).
    pub(crate) number: u32,
    /// Its `inputRequests`, by the upstream's keys.
    pub(crate) requests: Map<String, Value>,
    /// Its `requestState`, echoed with the answers.
    pub(crate) state: Option<Value>,
    /// When the gateway received it (ms since the epoch).
    pub(crate) asked_at_ms: u64,
}

impl Round {
    fn to_json(&self) -> Value {
        json!({
            "requests": self.requests,
            "requestState": self.state,
            "askedAtMs": self.asked_at_ms,
        })
    }

    fn from_json(number: u32, v: &Value) -> Option<Self> {
        Some(Self {
            number,
            requests: v.get("requests")?.as_object()?.clone(),
            state: v.get("requestState").filter(|s| !s.is_null()).cloned(),
            asked_at_ms: v.get("askedAtMs")?.as_u64()?,
        })
    }

    /// The key under which the gateway asks its client the upstream's request `key`.
    pub(crate) fn our_key(&self, key: &str) -> String {
        format!("round{}-{key}", self.number)
    }

    /// When the upstream's state of this round expires, if it does.
    pub(crate) fn deadline_ms(&self, ttl: Option<std::time::Duration>) -> Option<u64> {
        ttl.map(|t| {
            self.asked_at_ms
                .saturating_add(u64::try_from(t.as_millis()).unwrap_or(u64::MAX))
        })
    }
}

/// Where an earlier run of the call stopped.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Position {
    /// Nothing recorded: the call starts at round 1 of this epoch.
    Fresh { epoch: u32 },
    /// Round N of this epoch waits for its answers: nothing is in flight upstream.
    Waiting { epoch: u32, round: Round },
    /// The answers of this epoch's last round were (perhaps) sent: a call may be in flight.
    Sent { epoch: u32 },
}

impl Position {
    /// Whether an earlier run may have left a call in flight upstream (`false` when it
    /// waits for input: resuming repeats nothing).
    pub(crate) fn may_be_in_flight(&self) -> bool {
        !matches!(self, Self::Waiting { .. })
    }
}

/// Reads the recorded rounds.
pub(crate) fn position(hooks: &dyn Hooks) -> Position {
    let Some(epoch) = (1..=MAX_EPOCHS)
        .take_while(|e| hooks.recorded(&round_step(*e, 1)).is_some())
        .last()
    else {
        return Position::Fresh { epoch: 1 };
    };
    let (number, value) = (1..=MAX_ROUNDS)
        .map_while(|n| hooks.recorded(&round_step(epoch, n)).map(|v| (n, v)))
        .last()
        .unwrap_or((1, Value::Null));
    if hooks.recorded(&answered_step(epoch, number)).is_some() {
        return Position::Sent { epoch };
    }
    match Round::from_json(number, &value) {
        Some(round) => Position::Waiting { epoch, round },
        // A record this code cannot read is treated as a call that may be in flight.
        None => Position::Sent { epoch },
    }
}

/// Records round `round` of `epoch` (before its input is asked).
pub(crate) async fn record(
    hooks: &dyn Hooks,
    epoch: u32,
    round: &Round,
) -> Result<(), crate::tool::ToolError> {
    hooks
        .carry(&round_step(epoch, round.number), round.to_json())
        .await
}

/// Records that the answers of round `round` of `epoch` are about to be sent.
pub(crate) async fn record_answered(
    hooks: &dyn Hooks,
    epoch: u32,
    round: u32,
) -> Result<(), crate::tool::ToolError> {
    hooks
        .carry(&answered_step(epoch, round), Value::Bool(true))
        .await
}

/// The error of a round whose state expired at `deadline_ms`.
pub(crate) fn expired(upstream: &str, deadline_ms: u64, ttl_s: f64) -> UpstreamError {
    UpstreamError::StateExpired {
        upstream: upstream.to_owned(),
        reason: format!(
            "keeps the state of an input round for {ttl_s} s (--upstream-state-ttl); this one expired at {}, before the answer came, so the call cannot go on",
            crate::wire::iso8601(deadline_ms)
        ),
    }
}

/// The `statusMessage` of a task waiting for a round's input.
pub(crate) fn waiting_message(upstream: &str, deadline_ms: Option<u64>) -> String {
    match deadline_ms {
        Some(d) => format!(
            "waiting for input; upstream `{upstream}` keeps this round's state until {} (an answer after that cannot be used)",
            crate::wire::iso8601(d)
        ),
        None => format!("waiting for input for upstream `{upstream}`"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use futures::future::BoxFuture;

    use super::*;
    use crate::tool::ToolError;

    /// A journal in memory.
    #[derive(Default)]
    struct Journal(Mutex<BTreeMap<String, Value>>);

    impl Hooks for Journal {
        fn is_task(&self) -> bool {
            true
        }
        fn progress<'a>(
            &'a self,
            _: f64,
            _: Option<f64>,
            _: Option<&'a str>,
        ) -> BoxFuture<'a, Result<(), ToolError>> {
            Box::pin(async { Ok(()) })
        }
        fn status<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), ToolError>> {
            Box::pin(async { Ok(()) })
        }
        fn input<'a>(
            &'a self,
            _: Option<&'a str>,
            _: Value,
        ) -> BoxFuture<'a, Result<Value, ToolError>> {
            Box::pin(async { Err(ToolError::Cancelled) })
        }
        fn cancelled(&self) -> BoxFuture<'_, ()> {
            Box::pin(futures::future::pending())
        }
        fn upstream_task(&self) -> Option<String> {
            None
        }
        fn remember_task<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), ToolError>> {
            Box::pin(async { Ok(()) })
        }
        fn recorded(&self, name: &str) -> Option<Value> {
            self.0.lock().unwrap().get(name).cloned()
        }
        fn carry<'a>(
            &'a self,
            name: &'a str,
            value: Value,
        ) -> BoxFuture<'a, Result<(), ToolError>> {
            self.0
                .lock()
                .unwrap()
                .entry(name.to_owned())
                .or_insert(value);
            Box::pin(async { Ok(()) })
        }
    }

    fn round(number: u32) -> Round {
        Round {
            number,
            requests: json!({ "confirm": { "method": "elicitation/create", "params": {} } })
                .as_object()
                .cloned()
                .unwrap(),
            state: Some(json!(format!("state-{number}"))),
            asked_at_ms: 1_000 * u64::from(number),
        }
    }

    #[tokio::test]
    async fn a_run_resumes_at_the_unanswered_round_and_not_after_its_answers_went_out() {
        let j = Journal::default();
        assert_eq!(position(&j), Position::Fresh { epoch: 1 });
        record(&j, 1, &round(1)).await.unwrap();
        assert_eq!(
            position(&j),
            Position::Waiting {
                epoch: 1,
                round: round(1)
            }
        );
        assert!(!position(&j).may_be_in_flight());
        record_answered(&j, 1, 1).await.unwrap();
        assert_eq!(position(&j), Position::Sent { epoch: 1 });
        assert!(position(&j).may_be_in_flight());
        record(&j, 1, &round(2)).await.unwrap();
        assert_eq!(
            position(&j),
            Position::Waiting {
                epoch: 1,
                round: round(2)
            }
        );
        // An idempotent call started again after a restart: a new epoch, its own rounds.
        record_answered(&j, 1, 2).await.unwrap();
        record(&j, 2, &round(1)).await.unwrap();
        assert_eq!(
            position(&j),
            Position::Waiting {
                epoch: 2,
                round: round(1)
            }
        );
    }

    #[test]
    fn a_deadline_is_the_ask_plus_the_lifetime_and_the_messages_name_it() {
        let r = round(1);
        assert_eq!(r.deadline_ms(None), None);
        let d = r.deadline_ms(Some(std::time::Duration::from_secs(600)));
        assert_eq!(d, Some(601_000));
        assert!(waiting_message("dep", d).contains("1970-01-01T00:10:01"));
        assert!(
            expired("dep", 601_000, 600.0)
                .to_string()
                .starts_with("upstream `dep` keeps the state of an input round for 600 s")
        );
        assert_eq!(r.our_key("confirm"), "round1-confirm");
    }
}
