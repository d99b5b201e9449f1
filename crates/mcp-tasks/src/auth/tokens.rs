//! Static bearer tokens from a TOML file.
//!
//! ```toml
//! [[tokens]]
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"  # of the token
//! tenant = "acme"
//! principal = "alice"
//! scopes = ["tasks"]          # optional
//! ```
//!
//! Only the SHA-256 of each token is stored (`printf %s "$TOKEN" | sha256sum`). A request's
//! token is hashed and looked up by its digest, so the comparison never runs over the secret
//! itself. [`StaticTokens::reload`] swaps the whole table atomically; a file that does not
//! parse leaves the previous table in force.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::http::request::Parts;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{AuthError, Authenticator, Identity, bearer_token, check_name};
use crate::task::Owner;

/// Why a token file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenFileError {
    /// The file could not be read (missing, permissions, I/O).
    #[error("cannot read the token file {path}: {source}")]
    Read {
        /// The token file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid token table: not TOML, an unknown key, a hash that is not 64
    /// hex digits, a principal or tenant name that is not allowed, or a hash listed twice.
    /// On a reload the previous table stays in force.
    #[error("the token file {path} is not valid: {detail}")]
    Invalid {
        /// The token file.
        path: PathBuf,
        /// What is wrong, naming the entry.
        detail: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    tokens: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    sha256: String,
    tenant: String,
    principal: String,
    #[serde(default)]
    scopes: Vec<String>,
}

type Table = HashMap<[u8; 32], Identity>;

/// Bearer tokens mapped to identities, from a TOML file (see the module docs).
pub struct StaticTokens {
    path: Option<PathBuf>,
    table: RwLock<Arc<Table>>,
}

impl std::fmt::Debug for StaticTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticTokens")
            .field("path", &self.path)
            .field("tokens", &self.len())
            .finish()
    }
}

impl StaticTokens {
    /// Loads the token file at `path`.
    pub fn load(path: impl Into<PathBuf>) -> Result<Self, TokenFileError> {
        let path = path.into();
        let table = read_table(&path)?;
        Ok(Self {
            path: Some(path),
            table: RwLock::new(Arc::new(table)),
        })
    }

    /// Parses a token file held in memory.
    pub fn parse(text: &str) -> Result<Self, TokenFileError> {
        let table = parse_table(Path::new("<memory>"), text)?;
        Ok(Self {
            path: None,
            table: RwLock::new(Arc::new(table)),
        })
    }

    /// Reads the file again and swaps the table in; on an error the previous table stays.
    /// Returns the number of tokens now in force.
    pub async fn reload(&self) -> Result<usize, TokenFileError> {
        let Some(path) = self.path.clone() else {
            return Ok(self.len());
        };
        let table = tokio::task::spawn_blocking(move || read_table(&path))
            .await
            .map_err(|e| TokenFileError::Invalid {
                path: self.path.clone().unwrap_or_default(),
                detail: format!("the reload was interrupted: {e}"),
            })??;
        let n = table.len();
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
        Ok(n)
    }

    /// The number of tokens in force.
    pub fn len(&self) -> usize {
        self.current().len()
    }

    /// Whether the table has no token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn current(&self) -> Arc<Table> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The identity of a presented token.
    pub fn identify(&self, token: &str) -> Option<Identity> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.current().get(&digest).cloned()
    }
}

impl Authenticator for StaticTokens {
    fn authenticate<'a>(
        &'a self,
        request: &'a Parts,
    ) -> BoxFuture<'a, Result<Identity, AuthError>> {
        let result = match bearer_token(&request.headers) {
            Ok(None) => Err(AuthError::Missing),
            Ok(Some(token)) => self
                .identify(token)
                .ok_or_else(|| AuthError::InvalidToken("unknown token".into())),
            Err(e) => Err(e),
        };
        futures::future::ready(result).boxed()
    }
}

fn read_table(path: &Path) -> Result<Table, TokenFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_table(path, &text)
}

fn parse_table(path: &Path, text: &str) -> Result<Table, TokenFileError> {
    let invalid = |detail: String| TokenFileError::Invalid {
        path: path.to_owned(),
        detail,
    };
    let file: File = toml::from_str(text).map_err(|e| invalid(toml_error(text, &e)))?;
    let mut table = Table::new();
    for (i, entry) in file.tokens.into_iter().enumerate() {
        let n = i + 1;
        let digest = parse_digest(&entry.sha256)
            .ok_or_else(|| invalid(format!("token {n}: `sha256` must be 64 hex digits")))?;
        check_name("tenant", &entry.tenant).map_err(|e| invalid(format!("token {n}: {e}")))?;
        check_name("principal", &entry.principal)
            .map_err(|e| invalid(format!("token {n}: {e}")))?;
        let scopes: BTreeSet<String> = entry.scopes.into_iter().collect();
        let identity = Identity {
            owner: Owner::new(entry.tenant, entry.principal),
            scopes,
        };
        if table.insert(digest, identity).is_some() {
            return Err(invalid(format!("token {n}: the same sha256 appears twice")));
        }
    }
    Ok(table)
}

/// A TOML error of the token file without anything quoted from it (a key or a value may be a
/// secret pasted in the wrong place): its message with quoted text elided, and its line.
fn toml_error(text: &str, error: &toml::de::Error) -> String {
    let message = elide_quoted(error.message());
    match error.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!("line {line}: {message}")
        }
        None => message,
    }
}

/// `message` with the text between backticks or double quotes replaced by `…`.
pub(crate) fn elide_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut open: Option<char> = None;
    for c in message.chars() {
        match open {
            Some(q) if c == q => {
                out.push('…');
                out.push(c);
                open = None;
            }
            Some(_) => {}
            None => {
                out.push(c);
                if c == '`' || c == '"' {
                    open = Some(c);
                }
            }
        }
    }
    if open.is_some() {
        out.push('…');
    }
    out
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token pasted as a key or a value never appears in the error (nor does the line).
    #[test]
    fn errors_quote_nothing_from_the_file() {
        for text in [
            "tok-SECRET-1 = \"x\"\n",
            "[[tokens]]\nsha256 = 5\ntenant = \"a\"\nprincipal = \"tok-SECRET-1\"\n",
            "[[tokens]]\nsha256 = \"tok-SECRET-1\"\n",
            "[[tokens]]\ntok-SECRET-1\n",
            "[[tokens]]\nsha256 = \"tok-SECRET-1\n",
        ] {
            let e = StaticTokens::parse(text).unwrap_err().to_string();
            assert!(!e.contains("SECRET"), "{e}");
        }
        let e = StaticTokens::parse("\n\ntok-SECRET-1 = 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3"), "{e}");
        assert_eq!(
            elide_quoted("unknown field `x`, expected `a`"),
            "unknown field `…`, expected `…`"
        );
    }

    fn sha(token: &str) -> String {
        Sha256::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    #[test]
    fn tokens_map_to_identities() {
        let text = format!(
            "[[tokens]]\nsha256 = \"{}\"\ntenant = \"acme\"\nprincipal = \"alice\"\nscopes = [\"tasks\"]\n\n\
             [[tokens]]\nsha256 = \"{}\"\ntenant = \"globex\"\nprincipal = \"alice\"\n",
            sha("secret-a"),
            sha("secret-b").to_uppercase()
        );
        let tokens = StaticTokens::parse(&text).unwrap();
        assert_eq!(tokens.len(), 2);
        let a = tokens.identify("secret-a").unwrap();
        assert_eq!(a.owner, Owner::new("acme", "alice"));
        assert!(a.scopes.contains("tasks"));
        let b = tokens.identify("secret-b").unwrap();
        assert_eq!(b.owner, Owner::new("globex", "alice"));
        assert!(tokens.identify("secret-c").is_none());
        assert!(tokens.identify(&sha("secret-a")).is_none());
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let bad = |text: &str| StaticTokens::parse(text).unwrap_err().to_string();
        assert!(
            bad("[[tokens]]\nsha256 = \"ab\"\ntenant = \"t\"\nprincipal = \"p\"")
                .contains("64 hex")
        );
        assert!(
            bad("[[tokens]]\ntoken = \"plain\"\ntenant = \"t\"\nprincipal = \"p\"")
                .contains("token")
        );
        let dup = format!(
            "[[tokens]]\nsha256 = \"{0}\"\ntenant = \"t\"\nprincipal = \"p\"\n[[tokens]]\nsha256 = \"{0}\"\ntenant = \"t\"\nprincipal = \"q\"",
            sha("x")
        );
        assert!(bad(&dup).contains("twice"));
        let empty = format!(
            "[[tokens]]\nsha256 = \"{}\"\ntenant = \"\"\nprincipal = \"p\"",
            sha("x")
        );
        assert!(bad(&empty).contains("tenant is empty"));
    }

    #[tokio::test]
    async fn reload_swaps_the_table_and_keeps_it_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let entry = |t: &str, p: &str| {
            format!(
                "[[tokens]]\nsha256 = \"{}\"\ntenant = \"t\"\nprincipal = \"{p}\"\n",
                sha(t)
            )
        };
        std::fs::write(&path, entry("one", "alice")).unwrap();
        let tokens = StaticTokens::load(&path).unwrap();
        assert!(tokens.identify("one").is_some());
        std::fs::write(&path, entry("two", "bob")).unwrap();
        assert_eq!(tokens.reload().await.unwrap(), 1);
        assert!(tokens.identify("one").is_none());
        assert_eq!(tokens.identify("two").unwrap().owner.principal, "bob");
        std::fs::write(&path, "not toml [").unwrap();
        assert!(tokens.reload().await.is_err());
        assert!(
            tokens.identify("two").is_some(),
            "the previous table stays in force"
        );
    }
}
