//! The console's sign-in sessions, kept in the store's meta table so that every replica of a
//! shared store accepts them.
//!
//! A login creates a session: a random 256-bit id that only the browser's cookie holds. The
//! store keeps, under `console_session/` and the hex SHA-256 of the id, a [`Record`]: when the
//! session was created, when it expires ([`SessionPolicy::ttl`]), when it was last used (an
//! idle session ends after [`SessionPolicy::idle`]), and the credential it was opened with,
//! *sealed* with keys derived from the id (HMAC-SHA256 in counter mode, then an HMAC tag over
//! the sealed bytes): the store alone (a backup, a database dump) yields neither a session id
//! nor a credential.
//!
//! Every request with the cookie opens the record and asks the authenticator about the
//! credential again: a credential removed from the token file, or a JWT past its expiry, ends
//! its sessions at their next use (and the console's open event streams within
//! [`super::live`]'s re-check interval). Logout deletes the record.
//!
//! Persisted format (the meta value, JSON, frozen; a test holds a golden copy):
//! `{"v":1,"created_ms":…,"expires_ms":…,"seen_ms":…,"sealed":"<base64url>"}`.

use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::store::{Store, WriteOp};

/// The meta-table prefix of console sessions.
pub(crate) const PREFIX: &str = "console_session/";
/// How many records one sweep step reads.
const SWEEP_PAGE: usize = 200;

/// How long sessions last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionPolicy {
    /// The longest a session lasts from its login (default 12 h).
    pub ttl: Duration,
    /// How long an unused session lasts (default 30 min).
    pub idle: Duration,
}

impl Default for SessionPolicy {
    fn default() -> Self {
        SessionPolicy {
            ttl: Duration::from_secs(12 * 3600),
            idle: Duration::from_secs(30 * 60),
        }
    }
}

/// A session id as the cookie carries it (43 base64url characters).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SessionId([u8; 32]);

impl std::fmt::Debug for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionId(…)")
    }
}

impl SessionId {
    fn random() -> Result<SessionId, String> {
        let mut id = [0u8; 32];
        getrandom::fill(&mut id).map_err(|e| format!("no randomness for a session id: {e}"))?;
        Ok(SessionId(id))
    }

    /// The id of a cookie value; `None` for anything that is not one.
    pub(crate) fn parse(cookie: &str) -> Option<SessionId> {
        if cookie.len() != 43 {
            return None;
        }
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(cookie)
            .ok()?;
        Some(SessionId(bytes.try_into().ok()?))
    }

    /// The cookie value.
    pub(crate) fn cookie_value(&self) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.0)
    }

    /// The meta key of the session: the id's hash, never the id.
    fn key(&self) -> String {
        let digest = Sha256::digest(self.0);
        let mut key = String::with_capacity(PREFIX.len() + 64);
        key.push_str(PREFIX);
        for b in digest {
            key.push_str(&format!("{b:02x}"));
        }
        key
    }

    /// A value bound to this session (for its CSRF token): HMAC of the id under `key`.
    pub(crate) fn bind(&self, key: &[u8]) -> Vec<u8> {
        let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts keys of any length");
        mac.update(&self.0);
        mac.finalize().into_bytes().to_vec()
    }

    fn derived(&self, label: &[u8]) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC accepts keys of any length");
        mac.update(label);
        let key = mac.finalize().into_bytes();
        Hmac::<Sha256>::new_from_slice(&key).expect("HMAC accepts keys of any length")
    }

    /// XORs `data` with the key stream of this session.
    fn stream(&self, data: &mut [u8]) {
        let cipher = self.derived(b"mcp-tasks console session: seal");
        for (block, chunk) in data.chunks_mut(32).enumerate() {
            let mut mac = cipher.clone();
            mac.update(&(block as u64).to_be_bytes());
            let pad = mac.finalize().into_bytes();
            for (b, p) in chunk.iter_mut().zip(pad) {
                *b ^= p;
            }
        }
    }

    fn tag(&self, sealed: &[u8]) -> Vec<u8> {
        let mut mac = self.derived(b"mcp-tasks console session: tag");
        mac.update(sealed);
        mac.finalize().into_bytes().to_vec()
    }

    fn seal(&self, credential: &str) -> String {
        let mut bytes = credential.as_bytes().to_vec();
        self.stream(&mut bytes);
        let tag = self.tag(&bytes);
        bytes.extend_from_slice(&tag);
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    fn open(&self, sealed: &str) -> Option<String> {
        let mut bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(sealed)
            .ok()?;
        if bytes.len() < 32 {
            return None;
        }
        let tag = bytes.split_off(bytes.len() - 32);
        let expected = self.tag(&bytes);
        let same = tag
            .iter()
            .zip(&expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
        if !same {
            return None;
        }
        self.stream(&mut bytes);
        String::from_utf8(bytes).ok()
    }
}

/// A stored session (see the module docs for its format).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    v: u32,
    created_ms: u64,
    expires_ms: u64,
    seen_ms: u64,
    sealed: String,
}

impl Record {
    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a session record serialises")
    }

    fn decode(bytes: &[u8]) -> Option<Record> {
        serde_json::from_slice::<Record>(bytes)
            .ok()
            .filter(|r| r.v == 1)
    }

    fn ended(&self, policy: &SessionPolicy, now_ms: u64) -> bool {
        now_ms >= self.expires_ms || now_ms >= self.seen_ms.saturating_add(ms(policy.idle))
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Why a session cookie does not sign anyone in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ended {
    /// No such session (never made, logged out, or swept).
    Unknown,
    /// Past its lifetime or idle too long (now deleted).
    Expired,
    /// The store could not be read.
    Unavailable(String),
}

/// Opens a session for `credential` (an `Authorization` value the authenticator accepted).
pub(crate) async fn create(
    store: &Store,
    policy: &SessionPolicy,
    credential: &str,
    now_ms: u64,
) -> Result<SessionId, String> {
    let id = SessionId::random()?;
    let record = Record {
        v: 1,
        created_ms: now_ms,
        expires_ms: now_ms.saturating_add(ms(policy.ttl)),
        seen_ms: now_ms,
        sealed: id.seal(credential),
    };
    store
        .commit(vec![WriteOp::PutMeta {
            key: id.key(),
            value: record.encode(),
        }])
        .await
        .map_err(|e| format!("the session could not be stored: {e}"))?;
    Ok(id)
}

/// The credential of session `id`, if it is open; an ended one is deleted. A use more than a
/// tenth of the idle timeout after the last recorded one is recorded (so an active session
/// costs a write every few minutes, not one per request).
pub(crate) async fn resume(
    store: &Store,
    policy: &SessionPolicy,
    id: &SessionId,
    now_ms: u64,
) -> Result<String, Ended> {
    let key = id.key();
    let bytes = store
        .meta_get(&key)
        .await
        .map_err(|e| Ended::Unavailable(e.to_string()))?
        .ok_or(Ended::Unknown)?;
    let Some(mut record) = Record::decode(&bytes) else {
        end(store, id).await;
        return Err(Ended::Unknown);
    };
    if record.ended(policy, now_ms) {
        end(store, id).await;
        return Err(Ended::Expired);
    }
    let Some(credential) = id.open(&record.sealed) else {
        end(store, id).await;
        return Err(Ended::Unknown);
    };
    if now_ms.saturating_sub(record.seen_ms) > ms(policy.idle) / 10 {
        record.seen_ms = now_ms;
        let write = WriteOp::PutMeta {
            key,
            value: record.encode(),
        };
        if let Err(e) = store.commit(vec![write]).await {
            tracing::debug!(error = %e, "console: a session's last use could not be recorded");
        }
    }
    Ok(credential)
}

/// Deletes session `id` (logout, or its credential was refused).
pub(crate) async fn end(store: &Store, id: &SessionId) {
    if let Err(e) = store
        .commit(vec![WriteOp::DeleteMeta { key: id.key() }])
        .await
    {
        tracing::warn!(error = %e, "console: a session could not be deleted");
    }
}

/// Deletes the ended sessions of one page of the meta table after `after`; the key to carry
/// on from (`None`: the walk is done, start again).
pub(crate) async fn sweep(
    store: &Store,
    policy: &SessionPolicy,
    after: Option<String>,
    now_ms: u64,
) -> Option<String> {
    let page = match store.meta_page(PREFIX, after.as_deref(), SWEEP_PAGE).await {
        Ok(page) => page,
        Err(e) => {
            tracing::debug!(error = %e, "console: sessions could not be swept");
            return None;
        }
    };
    let next = (page.len() == SWEEP_PAGE)
        .then(|| page.last().map(|(k, _)| k.clone()))
        .flatten();
    let ended: Vec<WriteOp> = page
        .into_iter()
        .filter(|(_, v)| Record::decode(v).is_none_or(|r| r.ended(policy, now_ms)))
        .map(|(key, _)| WriteOp::DeleteMeta { key })
        .collect();
    if !ended.is_empty()
        && let Err(e) = store.commit(ended).await
    {
        tracing::debug!(error = %e, "console: ended sessions could not be deleted");
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_credential_opens_with_its_id_only() {
        let id = SessionId([7; 32]);
        let sealed = id.seal("Bearer root-token-that-is-longer-than-one-block-of-32");
        assert!(!sealed.contains("root"));
        assert_eq!(
            id.open(&sealed).as_deref(),
            Some("Bearer root-token-that-is-longer-than-one-block-of-32")
        );
        assert_eq!(SessionId([8; 32]).open(&sealed), None);
        let mut tampered = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&sealed)
            .unwrap();
        tampered[0] ^= 1;
        let tampered = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tampered);
        assert_eq!(id.open(&tampered), None);
    }

    #[test]
    fn ids_parse_from_cookies_and_keys_hide_them() {
        let id = SessionId::random().unwrap();
        let cookie = id.cookie_value();
        assert_eq!(cookie.len(), 43);
        assert_eq!(SessionId::parse(&cookie), Some(id.clone()));
        assert_eq!(SessionId::parse("short"), None);
        assert_eq!(SessionId::parse(&"!".repeat(43)), None);
        assert!(!id.key().contains(&cookie));
        assert!(id.key().starts_with(PREFIX));
        assert_eq!(id.key().len(), PREFIX.len() + 64);
    }

    /// The persisted format is frozen: this golden value must keep decoding.
    #[test]
    fn the_record_format_is_frozen() {
        let golden =
            br#"{"v":1,"created_ms":1000,"expires_ms":43201000,"seen_ms":1000,"sealed":"AAAA"}"#;
        let record = Record::decode(golden).expect("the golden record decodes");
        assert_eq!(
            record,
            Record {
                v: 1,
                created_ms: 1000,
                expires_ms: 43_201_000,
                seen_ms: 1000,
                sealed: "AAAA".into()
            }
        );
        assert_eq!(record.encode(), golden.to_vec());
        assert_eq!(
            Record::decode(br#"{"v":2,"created_ms":1,"expires_ms":1,"seen_ms":1,"sealed":""}"#),
            None
        );
    }

    #[tokio::test]
    async fn sessions_end_by_lifetime_idleness_and_logout() {
        let store = Store::memory();
        let policy = SessionPolicy {
            ttl: Duration::from_secs(100),
            idle: Duration::from_secs(10),
        };
        let id = create(&store, &policy, "Bearer t", 0).await.unwrap();
        assert_eq!(
            resume(&store, &policy, &id, 5_000).await.unwrap(),
            "Bearer t"
        );
        // Used at 5 s: idle until 15 s.
        assert_eq!(
            resume(&store, &policy, &id, 14_000).await.unwrap(),
            "Bearer t"
        );
        assert_eq!(
            resume(&store, &policy, &id, 30_000).await,
            Err(Ended::Expired),
            "idle for 16 s"
        );
        assert_eq!(
            resume(&store, &policy, &id, 30_001).await,
            Err(Ended::Unknown)
        );

        let id = create(&store, &policy, "Bearer t", 0).await.unwrap();
        let mut now = 0;
        while now < 99_000 {
            now += 9_000;
            if now >= 100_000 {
                break;
            }
            assert!(resume(&store, &policy, &id, now).await.is_ok(), "{now}");
        }
        assert_eq!(
            resume(&store, &policy, &id, 100_000).await,
            Err(Ended::Expired)
        );

        let id = create(&store, &policy, "Bearer t", 0).await.unwrap();
        end(&store, &id).await;
        assert_eq!(resume(&store, &policy, &id, 1).await, Err(Ended::Unknown));
    }

    #[tokio::test]
    async fn a_sweep_deletes_ended_sessions_only() {
        let store = Store::memory();
        let policy = SessionPolicy {
            ttl: Duration::from_secs(100),
            idle: Duration::from_secs(10),
        };
        let old = create(&store, &policy, "Bearer a", 0).await.unwrap();
        let new = create(&store, &policy, "Bearer b", 50_000).await.unwrap();
        assert_eq!(sweep(&store, &policy, None, 55_000).await, None);
        assert!(store.meta_get(&old.key()).await.unwrap().is_none());
        assert!(store.meta_get(&new.key()).await.unwrap().is_some());
    }
}
