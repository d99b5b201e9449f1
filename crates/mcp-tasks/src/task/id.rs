//! Task identifiers and owners.

use std::fmt;

/// A server-generated, unguessable, header-safe task id: `tsk_` followed by 32 lowercase hex
/// digits. [`TaskId::generate`] issues 48 bits of the creation time (milliseconds since the
/// Unix epoch) followed by 80 random bits: unguessable, and ids sort by creation time, so a
/// store's new records land together at the end of its key order instead of in random pages
/// (fewer pages per commit: docs/BENCHMARKS.md, "What each part of a commit writes"). Clients
/// must treat the id as opaque.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId(String);

/// Why a string is not a task id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TaskIdError {
    /// Not `tsk_` followed by 32 lowercase hex digits (the form this runtime issues).
    #[error("malformed task id: expected `tsk_` followed by 32 lowercase hex digits")]
    Malformed,
}

const PREFIX: &str = "tsk_";
const HEX_LEN: usize = 32;

impl TaskId {
    /// A new id: the current time in milliseconds since the Unix epoch (48 bits, big-endian)
    /// and 80 random bits from the operating system's random source.
    pub fn generate() -> Self {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Self::at(now_ms)
    }

    /// A new id of creation time `now_ms`: [`TaskId::generate`] with a given clock.
    pub fn at(now_ms: u64) -> Self {
        let mut bytes = [0u8; HEX_LEN / 2];
        bytes[..6].copy_from_slice(&now_ms.to_be_bytes()[2..]);
        // getrandom only fails when the OS has no entropy source at all; there is no safe
        // fallback for an unguessable id, so that is a fatal environment error.
        getrandom::fill(&mut bytes[6..])
            .expect("the operating system random source is unavailable");
        Self::from_bytes(bytes)
    }

    /// An id built from given bytes (tests and seeded simulations).
    pub fn from_bytes(bytes: [u8; HEX_LEN / 2]) -> Self {
        let mut s = String::with_capacity(PREFIX.len() + HEX_LEN);
        s.push_str(PREFIX);
        for b in bytes {
            s.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            s.push(char::from(b"0123456789abcdef"[usize::from(b & 0xf)]));
        }
        Self(s)
    }

    /// Parses an id received from a client.
    pub fn parse(s: &str) -> Result<Self, TaskIdError> {
        let hex = s.strip_prefix(PREFIX).ok_or(TaskIdError::Malformed)?;
        if hex.len() == HEX_LEN && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            Ok(Self(s.to_owned()))
        } else {
            Err(TaskIdError::Malformed)
        }
    }

    /// The id as text (`tsk_` and 32 hex digits).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who a task belongs to: the authenticated tenant and principal that created it. Every task
/// method compares the caller's owner with the task's; a mismatch looks like an unknown id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner {
    /// The tenant (organization, account) the principal belongs to.
    pub tenant: String,
    /// The authenticated principal within the tenant.
    pub principal: String,
}

impl Owner {
    /// SHA-256 over the length-prefixed tenant and principal.
    fn digest(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for part in [&self.tenant, &self.principal] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().into()
    }

    /// A short pseudonym of this owner for logs and traces: the first 8 bytes of its digest in
    /// hex. It tells requests of one owner apart without writing who the owner is.
    pub fn log_id(&self) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(16);
        for b in &self.digest()[..8] {
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        out
    }

    /// An owner from a tenant and a principal.
    pub fn new(tenant: impl Into<String>, principal: impl Into<String>) -> Self {
        Self {
            tenant: tenant.into(),
            principal: principal.into(),
        }
    }

    /// Whether `other` is the same owner, in time that does not depend on where the two
    /// differ: the tenant and the principal are compared as separate, length-prefixed fields
    /// (so `("a", "b/c")` and `("a/b", "c")` stay apart) through their SHA-256 digests.
    pub fn same_as(&self, other: &Owner) -> bool {
        let (a, b) = (self.digest(), other.digest());
        a.iter()
            .zip(b.iter())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
    }

    /// The owner used when a transport has no authentication (a local stdio or loopback
    /// server): every caller is the same anonymous principal.
    pub fn anonymous() -> Self {
        Self::new("default", "anonymous")
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.principal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_parse_and_differ() {
        let a = TaskId::generate();
        let b = TaskId::generate();
        assert_ne!(a, b);
        assert_eq!(TaskId::parse(a.as_str()), Ok(a));
    }

    #[test]
    fn ids_sort_by_creation_time_and_keep_80_random_bits() {
        let t = 1_780_000_000_123u64;
        let (a, b, later) = (TaskId::at(t), TaskId::at(t), TaskId::at(t + 1));
        // The first 12 hex digits are the time; the other 20 (80 bits) differ.
        assert_eq!(&a.as_str()[4..16], format!("{t:012x}"));
        assert_eq!(a.as_str()[4..16], b.as_str()[4..16]);
        assert_ne!(a.as_str()[16..], b.as_str()[16..]);
        assert!(a < later && b < later);
        assert!(TaskId::generate().as_str()[4..16] > *format!("{t:012x}"));
    }

    #[test]
    fn owners_compare_field_by_field() {
        let alice = Owner::new("acme", "alice");
        assert!(alice.same_as(&Owner::new("acme", "alice")));
        assert!(!alice.same_as(&Owner::new("globex", "alice")));
        assert!(!alice.same_as(&Owner::new("acme", "bob")));
        assert!(!Owner::new("a", "b/c").same_as(&Owner::new("a/b", "c")));
        assert!(!Owner::new("ab", "c").same_as(&Owner::new("a", "bc")));
    }

    #[test]
    fn malformed_ids_are_rejected() {
        for bad in [
            "",
            "tsk_",
            "786512e2",
            "tsk_0123456789abcdef0123456789abcde",
            "tsk_0123456789abcdef0123456789abcdef0",
            "tsk_0123456789ABCDEF0123456789abcdef",
            "TSK_0123456789abcdef0123456789abcdef",
            "tsk_0123456789abcdef0123456789abcdeg",
            "gate-test",
        ] {
            assert_eq!(TaskId::parse(bad), Err(TaskIdError::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn log_id_is_the_hex_of_the_first_eight_digest_bytes() {
        let owner = Owner::new("acme", "alice");
        let expected: String = owner.digest()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(owner.log_id(), expected);
        assert_eq!(owner.log_id().len(), 16);
        assert_ne!(owner.log_id(), Owner::new("acme", "bob").log_id());
    }
}
