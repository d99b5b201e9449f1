//! Integrity-protected `requestState` for core MRTR (`input_required` results).
//!
//! The state carries the answers collected in earlier rounds, so a multi-round call can be
//! resumed by any replica. It is attacker-controlled input, so it is signed with
//! HMAC-SHA256 under a per-store key and bound to the caller, the method, the tool or prompt
//! name, a digest of the arguments, and an expiry. Anything that does not verify is `-32602`.
//!
//! Format: `base64url(payload JSON) "." base64url(HMAC(key, first part))`.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::task::Owner;
use crate::wire::error::RpcError;

type HmacSha256 = Hmac<Sha256>;

/// The meta-table key under which the signing key is kept.
pub(crate) const KEY_META: &str = "request_state_key";
/// How long a `requestState` stays valid.
pub(crate) const LIFETIME_MS: u64 = 10 * 60 * 1000;

#[derive(Serialize, Deserialize)]
struct Payload {
    v: u8,
    owner: String,
    method: String,
    name: String,
    args: String,
    exp: u64,
    answers: BTreeMap<String, Value>,
    /// What the tool carries from round to round (`ToolContext::carry`); absent from the
    /// states signed before it existed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    carried: BTreeMap<String, Value>,
}

/// What a verified `requestState` holds.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Verified {
    /// The answers of earlier rounds.
    pub(crate) answers: BTreeMap<String, Value>,
    /// What the tool carried from earlier rounds.
    pub(crate) carried: BTreeMap<String, Value>,
}

/// What a request is bound to.
pub(crate) struct Binding<'a> {
    pub(crate) owner: &'a Owner,
    pub(crate) method: &'a str,
    pub(crate) name: &'a str,
    pub(crate) arguments: &'a Map<String, Value>,
}

impl Binding<'_> {
    fn owner(&self) -> String {
        format!("{}\u{0}{}", self.owner.tenant, self.owner.principal)
    }

    fn digest(&self) -> String {
        let canonical = canonical(&Value::Object(self.arguments.clone()));
        let hash = Sha256::digest(canonical.as_bytes());
        hash.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// JSON with object keys sorted at every level, so the digest ignores key order.
fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let items: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical(&m[k])))
                .collect();
            format!("{{{}}}", items.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

/// Signs and verifies request states with one key.
pub(crate) struct RequestStateCodec {
    key: Vec<u8>,
}

impl RequestStateCodec {
    pub(crate) fn new(key: Vec<u8>) -> Self {
        Self { key }
    }

    /// A fresh random 256-bit key.
    pub(crate) fn generate_key() -> Vec<u8> {
        let mut key = vec![0u8; 32];
        getrandom::fill(&mut key).expect("the operating system random source is unavailable");
        key
    }

    /// A key for another purpose, derived from this one (HMAC-SHA256 of `label`): as durable
    /// and as shared between replicas as the request-state key, and independent of it.
    #[cfg(feature = "http")]
    pub(crate) fn derive_key(&self, label: &str) -> Vec<u8> {
        self.mac(label.as_bytes()).finalize().into_bytes().to_vec()
    }

    fn mac(&self, data: &[u8]) -> HmacSha256 {
        let mut mac =
            HmacSha256::new_from_slice(&self.key).expect("HMAC accepts keys of any length");
        mac.update(data);
        mac
    }

    pub(crate) fn sign(
        &self,
        binding: &Binding<'_>,
        answers: BTreeMap<String, Value>,
        carried: BTreeMap<String, Value>,
        now_ms: u64,
    ) -> String {
        let payload = Payload {
            v: 1,
            owner: binding.owner(),
            method: binding.method.to_owned(),
            name: binding.name.to_owned(),
            args: binding.digest(),
            exp: now_ms.saturating_add(LIFETIME_MS),
            answers,
            carried,
        };
        let body = B64.encode(serde_json::to_vec(&payload).unwrap_or_default());
        let tag = B64.encode(self.mac(body.as_bytes()).finalize().into_bytes());
        format!("{body}.{tag}")
    }

    /// The answers and carried values of earlier rounds, if `state` is authentic, unexpired
    /// and bound to this request.
    pub(crate) fn verify(
        &self,
        state: &str,
        binding: &Binding<'_>,
        now_ms: u64,
    ) -> Result<Verified, RpcError> {
        let invalid = |why: &str| RpcError::invalid_params(format!("invalid requestState: {why}"));
        let (body, tag) = state.rsplit_once('.').ok_or_else(|| invalid("malformed"))?;
        let tag = B64
            .decode(tag)
            .map_err(|_| invalid("malformed signature"))?;
        self.mac(body.as_bytes())
            .verify_slice(&tag)
            .map_err(|_| invalid("signature does not verify"))?;
        let bytes = B64.decode(body).map_err(|_| invalid("malformed payload"))?;
        let payload: Payload =
            serde_json::from_slice(&bytes).map_err(|_| invalid("malformed payload"))?;
        if payload.v != 1 {
            return Err(invalid("unknown version"));
        }
        if payload.exp <= now_ms {
            return Err(invalid("expired; start the call again without it"));
        }
        if payload.owner != binding.owner()
            || payload.method != binding.method
            || payload.name != binding.name
            || payload.args != binding.digest()
        {
            return Err(invalid("it belongs to another request"));
        }
        Ok(Verified {
            answers: payload.answers,
            carried: payload.carried,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn binding<'a>(owner: &'a Owner, args: &'a Map<String, Value>) -> Binding<'a> {
        Binding {
            owner,
            method: "tools/call",
            name: "t",
            arguments: args,
        }
    }

    #[test]
    fn round_trip_and_tampering() {
        let codec = RequestStateCodec::new(RequestStateCodec::generate_key());
        let owner = Owner::anonymous();
        let args = json!({"b": 1, "a": [1, {"y": 2, "x": 1}]})
            .as_object()
            .cloned()
            .unwrap();
        let answers = BTreeMap::from([("k".to_owned(), json!({"action": "accept"}))]);
        let carried = BTreeMap::from([("gateway.e1.round-1".to_owned(), json!({"n": 1}))]);
        let state = codec.sign(
            &binding(&owner, &args),
            answers.clone(),
            carried.clone(),
            1000,
        );
        assert_eq!(
            codec.verify(&state, &binding(&owner, &args), 1001).unwrap(),
            Verified { answers, carried }
        );

        // Key order of the arguments does not matter.
        let reordered = json!({"a": [1, {"x": 1, "y": 2}], "b": 1})
            .as_object()
            .cloned()
            .unwrap();
        assert!(
            codec
                .verify(&state, &binding(&owner, &reordered), 1001)
                .is_ok()
        );

        for bad in [
            format!("{state}-TAMPERED"),
            format!("x{state}"),
            "garbage".into(),
            String::new(),
        ] {
            assert_eq!(
                codec
                    .verify(&bad, &binding(&owner, &args), 1001)
                    .unwrap_err()
                    .code,
                -32602
            );
        }
        let other = Owner::new("t", "mallory");
        assert!(codec.verify(&state, &binding(&other, &args), 1001).is_err());
        let changed = json!({"b": 2}).as_object().cloned().unwrap();
        assert!(
            codec
                .verify(&state, &binding(&owner, &changed), 1001)
                .is_err()
        );
        assert!(
            codec
                .verify(&state, &binding(&owner, &args), 1000 + LIFETIME_MS)
                .is_err()
        );
        let other_key = RequestStateCodec::new(RequestStateCodec::generate_key());
        assert!(
            other_key
                .verify(&state, &binding(&owner, &args), 1001)
                .is_err()
        );
    }

    #[test]
    fn a_state_signed_without_carried_values_still_verifies() {
        let codec = RequestStateCodec::new(RequestStateCodec::generate_key());
        let owner = Owner::anonymous();
        let args = Map::new();
        let answers = BTreeMap::from([("k".to_owned(), json!({"action": "decline"}))]);
        let state = codec.sign(&binding(&owner, &args), answers.clone(), BTreeMap::new(), 1);
        let (body, _) = state.rsplit_once('.').unwrap();
        let payload: Value = serde_json::from_slice(&B64.decode(body).unwrap()).unwrap();
        assert!(
            payload.get("carried").is_none(),
            "nothing carried, nothing written: {payload}"
        );
        let verified = codec.verify(&state, &binding(&owner, &args), 2).unwrap();
        assert_eq!(verified.answers, answers);
        assert!(verified.carried.is_empty());
    }
}
