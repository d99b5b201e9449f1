//! Session ids: `mcs1.` + base64url(payload JSON) + `.` + base64url(HMAC-SHA256(key,
//! payload)), signed and verified here (see the parent module).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{Session, owner_digest};
use crate::task::Owner;

type HmacSha256 = Hmac<Sha256>;

/// The prefix of every session id this runtime issues (and of its format version).
const PREFIX: &str = "mcs1.";
/// Longest accepted session id.
pub(crate) const MAX_SESSION_ID_LEN: usize = 8192;
impl Session {
    /// Whether `owner` is the owner that opened the session (constant time).
    pub(crate) fn belongs_to(&self, owner: &Owner) -> bool {
        let theirs = owner_digest(owner);
        theirs.len() == self.owner.len()
            && theirs
                .bytes()
                .zip(self.owner.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// Why a session id is not accepted. Every case answers `404` over HTTP (the client starts a
/// new session); the reason is only logged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum SessionError {
    #[error("the session id is malformed")]
    Malformed,
    #[error("the session id's signature does not verify")]
    BadSignature,
    #[error("the session belongs to another caller")]
    ForeignOwner,
    #[error("the session expired")]
    Expired,
    #[error("the session was ended")]
    Ended,
}

/// Signs and verifies session ids.
pub(crate) struct SessionCodec {
    key: Vec<u8>,
}

impl SessionCodec {
    pub(crate) fn new(key: Vec<u8>) -> Self {
        Self { key }
    }

    fn mac(&self, data: &[u8]) -> HmacSha256 {
        let mut mac =
            HmacSha256::new_from_slice(&self.key).expect("HMAC accepts keys of any length");
        mac.update(data);
        mac
    }

    /// The `Mcp-Session-Id` of `session`: visible ASCII only (base64url and dots).
    pub(crate) fn encode(&self, session: &Session) -> String {
        let body = B64.encode(serde_json::to_vec(session).unwrap_or_default());
        let tag = B64.encode(self.mac(body.as_bytes()).finalize().into_bytes());
        format!("{PREFIX}{body}.{tag}")
    }

    /// The session of an id this codec issued to `owner`, unless it expired at `now_ms`.
    pub(crate) fn decode(
        &self,
        id: &str,
        owner: &Owner,
        now_ms: u64,
    ) -> Result<Session, SessionError> {
        if id.len() > MAX_SESSION_ID_LEN {
            return Err(SessionError::Malformed);
        }
        let rest = id.strip_prefix(PREFIX).ok_or(SessionError::Malformed)?;
        let (body, tag) = rest.split_once('.').ok_or(SessionError::Malformed)?;
        let tag = B64.decode(tag).map_err(|_| SessionError::Malformed)?;
        self.mac(body.as_bytes())
            .verify_slice(&tag)
            .map_err(|_| SessionError::BadSignature)?;
        let bytes = B64.decode(body).map_err(|_| SessionError::Malformed)?;
        let session: Session =
            serde_json::from_slice(&bytes).map_err(|_| SessionError::Malformed)?;
        if !session.belongs_to(owner) {
            return Err(SessionError::ForeignOwner);
        }
        if now_ms >= session.expires_at_ms {
            return Err(SessionError::Expired);
        }
        Ok(session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn session(owner: &Owner) -> Session {
        let caps = json!({ "elicitation": {}, "sampling": {} });
        Session::new(
            owner,
            "2025-11-25",
            caps.as_object().unwrap().clone(),
            Some(json!({ "name": "c", "version": "1" })),
            10_000,
        )
    }

    #[test]
    fn ids_round_trip_for_their_owner_only() {
        let codec = SessionCodec::new(b"k".to_vec());
        let alice = Owner::new("t", "alice");
        let s = session(&alice);
        let id = codec.encode(&s);
        assert!(id.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{id}");
        assert_eq!(codec.decode(&id, &alice, 0), Ok(s));
        assert_eq!(
            codec.decode(&id, &Owner::new("t", "bob"), 0),
            Err(SessionError::ForeignOwner)
        );
        assert_eq!(
            codec.decode(&id, &alice, 10_000),
            Err(SessionError::Expired)
        );
    }

    #[test]
    fn tampered_and_foreign_ids_are_refused() {
        let codec = SessionCodec::new(b"k".to_vec());
        let alice = Owner::new("t", "alice");
        let id = codec.encode(&session(&alice));
        let other = SessionCodec::new(b"other".to_vec());
        assert_eq!(
            other.decode(&id, &alice, 0),
            Err(SessionError::BadSignature)
        );
        let mut tampered = id.clone().into_bytes();
        let i = PREFIX.len() + 3;
        tampered[i] = if tampered[i] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tampered).unwrap();
        assert!(codec.decode(&tampered, &alice, 0).is_err());
        for bad in ["", "mcs1.", "mcs1.a.b", "xyz", "mcs1.!!.!!"] {
            assert!(codec.decode(bad, &alice, 0).is_err(), "{bad}");
        }
    }
}
