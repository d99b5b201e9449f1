//! Legacy sessions: a signed, self-contained `Mcp-Session-Id`, plus the little mutable state
//! a session has (log level, resource subscriptions, ended) in the store's meta table.
//!
//! The id is `mcs1.` + base64url(payload JSON) + `.` + base64url(HMAC-SHA256(key, payload)),
//! where the key is derived from the runtime's request-state key (made on first start and
//! kept in the store), so every replica and every restart verifies the same ids. The payload
//! holds what `initialize` fixed for the session's lifetime: a random nonce, a digest of the
//! owner, the negotiated protocol version, the client's capabilities and info, and an expiry.
//!
//! What a session costs: `initialize` writes nothing; every later request verifies one HMAC
//! and reads one small meta record (absent until the session changes its log level or
//! subscriptions or is ended); `logging/setLevel`, `resources/(un)subscribe` and `DELETE`
//! write that record, at most [`MAX_RECORD_BYTES`]. `DELETE` replaces it with a tombstone of
//! a few dozen bytes, so that the id keeps answering 404 on every replica until it expires.
//!
//! Each owner's records are listed in one index record (nonce, expiry, ended): a write of
//! the owner's deletes the records of its expired sessions, and admits a session new to the
//! index only within [`crate::quota::Quotas::max_session_records`] (tombstones apart, at most
//! [`MAX_ENDED_RECORDS`], the earliest to expire giving way). Records of an owner that never
//! writes again, their tombstones and the owner's index are deleted once expired by the
//! adapter's periodic sweep ([`super::sweep`]; test
//! `expired_session_records_of_an_owner_who_never_returns_are_swept`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::task::Owner;
use crate::wire::LogLevel;

// Session ids travel only on the Streamable HTTP transport (a stdio connection is its
// session).
#[cfg(feature = "http")]
mod id;
#[cfg(feature = "http")]
pub(crate) use id::{SessionCodec, SessionError};

/// Largest client capabilities object kept whole in a session id; larger ones keep only
/// their top-level names.
const MAX_CAPABILITIES_BYTES: usize = 2048;
/// The meta-table key prefix of a session's mutable state.
pub(crate) const STATE_PREFIX: &str = "legacy_session/";
/// The meta-table key prefix of an owner's index of session records.
pub(crate) const INDEX_PREFIX: &str = "legacy_sessions_of/";
/// Largest stored state of one session (its log level and subscriptions).
pub(crate) const MAX_RECORD_BYTES: usize = 16 * 1024;
/// Most tombstones of ended, unexpired sessions kept per owner; past it the earliest to
/// expire is deleted (that id, of the same owner, is accepted again until it expires).
pub(crate) const MAX_ENDED_RECORDS: usize = 1024;

/// What `initialize` fixed for a session's lifetime.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Session {
    /// Random, 128 bits, hex: the key of the session's state and in-process streams.
    #[serde(rename = "n")]
    pub(crate) nonce: String,
    /// SHA-256 of the owner's tenant and principal (length-prefixed), hex.
    #[serde(rename = "o")]
    owner: String,
    /// The negotiated protocol version.
    #[serde(rename = "v")]
    pub(crate) version: String,
    /// The client's capabilities from `initialize`.
    #[serde(rename = "c")]
    pub(crate) capabilities: Map<String, Value>,
    /// The client's `clientInfo` from `initialize`, when it was well formed.
    #[serde(rename = "i", default, skip_serializing_if = "Option::is_none")]
    pub(crate) client_info: Option<Value>,
    /// Milliseconds since the Unix epoch after which the id is no longer accepted.
    #[serde(rename = "x")]
    pub(crate) expires_at_ms: u64,
}

fn owner_digest(owner: &Owner) -> String {
    let mut h = Sha256::new();
    for part in [&owner.tenant, &owner.principal] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Session {
    /// A new session of `owner`.
    pub(crate) fn new(
        owner: &Owner,
        version: &str,
        capabilities: Map<String, Value>,
        client_info: Option<Value>,
        expires_at_ms: u64,
    ) -> Self {
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).expect("the operating system random source is unavailable");
        let capabilities = if serde_json::to_vec(&capabilities).map_or(usize::MAX, |v| v.len())
            <= MAX_CAPABILITIES_BYTES
        {
            capabilities
        } else {
            capabilities
                .keys()
                .map(|k| (k.clone(), Value::Object(Map::new())))
                .collect()
        };
        Self {
            nonce: hex(&nonce),
            owner: owner_digest(owner),
            version: version.to_owned(),
            capabilities,
            client_info,
            expires_at_ms,
        }
    }

    /// The meta-table key of this session's mutable state.
    pub(crate) fn state_key(&self) -> String {
        state_key_of(&self.nonce)
    }

    /// The meta-table key of the index of the owner's session records.
    pub(crate) fn index_key(&self) -> String {
        format!("{INDEX_PREFIX}{}", self.owner)
    }
}

/// The meta-table key of the state of the session with `nonce`.
pub(crate) fn state_key_of(nonce: &str) -> String {
    format!("{STATE_PREFIX}{nonce}")
}

/// One of `n` stripes for a key.
pub(crate) fn stripe(key: &str, n: usize) -> usize {
    let digest = Sha256::digest(key.as_bytes());
    usize::from(digest[0]) % n.max(1)
}

/// The sessions of one owner that have a stored record: nonce → (expiry in ms, ended).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct RecordIndex(std::collections::BTreeMap<String, (u64, bool)>);

impl RecordIndex {
    /// An index as stored (an unreadable one starts empty: its records then stay until they
    /// are written again).
    pub(crate) fn decode(bytes: &[u8]) -> Self {
        serde_json::from_slice(bytes).unwrap_or_default()
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Admits a write of the record of session `nonce` (expiring at `expires_at_ms`,
    /// `ended` or not) at `now_ms`: the nonces whose records are to be deleted (expired, or
    /// tombstones past [`MAX_ENDED_RECORDS`]), or the refusal when the owner already has
    /// `limit` records of sessions that did not end.
    pub(crate) fn admit(
        &mut self,
        nonce: &str,
        expires_at_ms: u64,
        ended: bool,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<String>, crate::quota::QuotaError> {
        let mut gone: Vec<String> = self
            .0
            .iter()
            .filter(|(n, (x, _))| *x <= now_ms && n.as_str() != nonce)
            .map(|(n, _)| n.clone())
            .collect();
        for n in &gone {
            self.0.remove(n);
        }
        let open = |index: &Self| {
            index
                .0
                .iter()
                .filter(|(n, (_, e))| !*e && n.as_str() != nonce)
                .count()
        };
        if !ended && !self.0.contains_key(nonce) && open(self) >= limit {
            return Err(crate::quota::QuotaError {
                kind: crate::quota::QuotaKind::SessionRecords,
                limit: limit as u64,
                retry_after: std::time::Duration::from_secs(60),
            });
        }
        self.0.insert(nonce.to_owned(), (expires_at_ms, ended));
        let tombstones = self.0.values().filter(|(_, e)| *e).count();
        if tombstones > MAX_ENDED_RECORDS {
            let mut ended: Vec<(u64, String)> = self
                .0
                .iter()
                .filter(|(n, (_, e))| *e && n.as_str() != nonce)
                .map(|(n, (x, _))| (*x, n.clone()))
                .collect();
            ended.sort();
            for (_, n) in ended.into_iter().take(tombstones - MAX_ENDED_RECORDS) {
                self.0.remove(&n);
                gone.push(n);
            }
        }
        Ok(gone)
    }

    /// Drops the sessions whose ids expired at `now_ms`: their nonces (their records are to
    /// be deleted).
    pub(crate) fn expire(&mut self, now_ms: u64) -> Vec<String> {
        let gone: Vec<String> = self
            .0
            .iter()
            .filter(|(_, (x, _))| *x <= now_ms)
            .map(|(n, _)| n.clone())
            .collect();
        for n in &gone {
            self.0.remove(n);
        }
        gone
    }

    /// Whether no session is listed.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Sessions listed.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

/// The mutable part of a session, as kept in the store's meta table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct SessionState {
    /// `DELETE` ended the session: its id answers 404 from now on.
    #[serde(default)]
    pub(crate) ended: bool,
    /// The level set by `logging/setLevel` (none: no log messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) log_level: Option<String>,
    /// URIs of `resources/subscribe`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) subscriptions: Vec<String>,
    /// When the session's id expires (ms since the epoch; the record is deleted after).
    #[serde(rename = "x", default, skip_serializing_if = "is_zero")]
    pub(crate) expires_at_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl SessionState {
    pub(crate) fn level(&self) -> Option<LogLevel> {
        self.log_level.as_deref().and_then(LogLevel::from_wire)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn large_capabilities_keep_their_names() {
        let big = json!({ "experimental": { "x": "y".repeat(4000) }, "sampling": {} });
        let s = Session::new(
            &Owner::anonymous(),
            "2025-11-25",
            big.as_object().unwrap().clone(),
            None,
            1,
        );
        assert_eq!(
            Value::Object(s.capabilities),
            json!({ "experimental": {}, "sampling": {} })
        );
    }

    #[test]
    fn the_record_index_bounds_open_records_and_tombstones_and_drops_expired_ones() {
        let mut index = RecordIndex::default();
        for i in 0..3 {
            assert!(
                index
                    .admit(&format!("s{i}"), 100, false, 0, 3)
                    .unwrap()
                    .is_empty()
            );
        }
        // A fourth open session is refused; one already listed writes again.
        let e = index.admit("s3", 100, false, 0, 3).err().unwrap();
        assert_eq!(
            (e.kind, e.limit),
            (crate::quota::QuotaKind::SessionRecords, 3)
        );
        assert!(index.admit("s0", 100, false, 0, 3).is_ok());
        // Ending one makes room, and is never refused.
        assert!(index.admit("s0", 100, true, 0, 3).unwrap().is_empty());
        assert!(index.admit("s3", 200, false, 0, 3).unwrap().is_empty());
        // Past the tombstone bound, the earliest to expire goes.
        for i in 0..MAX_ENDED_RECORDS {
            index
                .admit(&format!("e{i:05}"), 150 + i as u64, true, 0, 3)
                .unwrap();
        }
        assert_eq!(index.len(), 3 + MAX_ENDED_RECORDS, "s0 gave way");
        // Once their ids expired, every listed record goes on the next write.
        let gone = index.admit("new", 10_000, false, 5_000, 3).unwrap();
        assert_eq!(gone.len(), 3 + MAX_ENDED_RECORDS);
        assert_eq!(index.len(), 1);
        assert_eq!(RecordIndex::decode(&index.encode()), index);
    }

    #[test]
    fn expiring_an_index_drops_expired_sessions_only() {
        let mut index = RecordIndex::default();
        index.admit("open", 100, false, 0, 8).unwrap();
        index.admit("ended", 100, true, 0, 8).unwrap();
        index.admit("later", 200, false, 0, 8).unwrap();
        assert!(index.expire(99).is_empty());
        assert_eq!(index.expire(100), ["ended", "open"]);
        assert!(!index.is_empty());
        assert_eq!(index.expire(200), ["later"]);
        assert!(index.is_empty());
    }

    #[test]
    fn state_round_trips() {
        let st = SessionState {
            ended: false,
            log_level: Some("info".into()),
            subscriptions: vec!["test://x".into()],
            expires_at_ms: 5,
        };
        assert_eq!(SessionState::decode(&st.encode()), Some(st.clone()));
        assert_eq!(st.level(), Some(LogLevel::Info));
        assert_eq!(SessionState::decode(b"{}"), Some(SessionState::default()));
    }
}
