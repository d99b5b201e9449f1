//! OAuth 2.1 resource server: JWT access tokens verified against the issuer's JWKS.
//!
//! Signatures and claims are checked by the `jsonwebtoken` crate; this module only chooses
//! the key and the rules:
//!
//! - the algorithm is pinned by the server ([`JwtConfig::algorithms`], asymmetric only): the
//!   token's `alg` must be one of them and match the key's `alg` when the JWK names one;
//! - `exp`, `iss`, `aud` and `sub` are required; `iss` must be the configured issuer, `aud`
//!   must contain this server's canonical URI (RFC 8707); `nbf` is enforced when present;
//! - keys come from a JWKS file or URL, cached; a token whose `kid` is not in the cache
//!   triggers one refetch, at most once per [`JwtConfig::refetch_interval`] (so that a flood
//!   of made-up `kid`s cannot turn the server into a JWKS hammer); the cache is also renewed
//!   after [`JwtConfig::max_age`] so that removed keys stop being accepted.
//!
//! The caller's [`Owner`]: the principal is the issuer and subject, plus the `client_id`
//! claim when the token has one (`iss#sub#client_id`, `#` and `%` in parts percent-encoded);
//! the tenant is the value of [`JwtConfig::tenant_claim`], or the issuer when none is set.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::http::request::Parts;
use futures::FutureExt;
use futures::future::BoxFuture;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use super::{AuthError, Authenticator, Identity, bearer_token, check_name};
use crate::task::Owner;

/// Where the issuer's public keys are.
#[derive(Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// A local JSON file holding a JWK Set.
    Path(PathBuf),
    /// An `https://` (or, for tests and local identity providers, `http://`) URL serving it.
    Url(String),
}

impl JwksSource {
    /// A URL when `s` starts with `http://` or `https://`, a path otherwise.
    pub fn parse(s: &str) -> Self {
        if s.starts_with("https://") || s.starts_with("http://") {
            Self::Url(s.to_owned())
        } else {
            Self::Path(PathBuf::from(s))
        }
    }
}

/// Shows a URL without its credentials or query, like [`Display`](std::fmt::Display).
impl std::fmt::Debug for JwksSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Path(p) => f.debug_tuple("Path").field(p).finish(),
            Self::Url(u) => f.debug_tuple("Url").field(&redact_url(u)).finish(),
        }
    }
}

/// Shown without what may be a secret: a URL's user information (`user:password@`) and its
/// query (`?token=…`) are replaced by `…`.
impl std::fmt::Display for JwksSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Path(p) => write!(f, "{}", p.display()),
            Self::Url(u) => f.write_str(&redact_url(u)),
        }
    }
}

/// `url` without its user information and query.
pub(crate) fn redact_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((_, host)) => format!("…@{host}"),
        None => authority.to_owned(),
    };
    let path = match path.find(['?', '#']) {
        Some(i) => format!("{}?…", &path[..i]),
        None => path.to_owned(),
    };
    if scheme.is_empty() {
        format!("{authority}{path}")
    } else {
        format!("{scheme}://{authority}{path}")
    }
}

/// How JWT access tokens are verified.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct JwtConfig {
    /// Where the signing keys come from.
    pub jwks: JwksSource,
    /// The expected `iss`, exactly.
    pub issuer: String,
    /// The expected audience: this server's canonical URI (RFC 8707).
    pub audience: String,
    /// Accepted signature algorithms (default `RS256`); symmetric ones are refused.
    pub algorithms: Vec<Algorithm>,
    /// The claim holding the tenant; `None` makes the issuer the tenant.
    pub tenant_claim: Option<String>,
    /// Clock skew tolerated on `exp` and `nbf` (default 60 s).
    pub leeway: Duration,
    /// Least time between two fetches of the JWKS caused by unknown `kid`s (default 30 s).
    pub refetch_interval: Duration,
    /// Age after which the cached JWKS is fetched again on the next use (default 1 h).
    pub max_age: Duration,
}

impl JwtConfig {
    /// Verification against the keys of `jwks`, for tokens of `issuer` meant for `audience`.
    pub fn new(jwks: JwksSource, issuer: impl Into<String>, audience: impl Into<String>) -> Self {
        Self {
            jwks,
            issuer: issuer.into(),
            audience: audience.into(),
            algorithms: vec![Algorithm::RS256],
            tenant_claim: None,
            leeway: Duration::from_secs(60),
            refetch_interval: Duration::from_secs(30),
            max_age: Duration::from_secs(3600),
        }
    }

    /// The accepted signature algorithms (pinned; never taken from the token).
    pub fn algorithms(mut self, algorithms: Vec<Algorithm>) -> Self {
        self.algorithms = algorithms;
        self
    }

    /// The claim that names the tenant.
    pub fn tenant_claim(mut self, claim: impl Into<String>) -> Self {
        self.tenant_claim = Some(claim.into());
        self
    }

    /// How often an unknown `kid` may make the verifier fetch the key set again.
    pub fn refetch_interval(mut self, interval: Duration) -> Self {
        self.refetch_interval = interval;
        self
    }
}

/// Why a verifier could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JwtSetupError {
    /// An HMAC algorithm (`HS256`, ...) was configured: verifying it would need the shared
    /// secret of the authorization server, which a resource server must not hold.
    #[error("algorithm {0:?} is symmetric: a resource server verifies with public keys only")]
    SymmetricAlgorithm(Algorithm),
    /// The list of accepted algorithms is empty, so no token could ever verify.
    #[error("no algorithm is accepted")]
    NoAlgorithm,
    /// The key set could not be fetched or read at start (unreachable, not JSON, no usable
    /// key); the server does not start without keys.
    #[error("the JWKS at {location} could not be loaded: {detail}")]
    Jwks {
        /// The JWKS URL or file it was configured with.
        location: String,
        /// What went wrong, for the operator.
        detail: String,
    },
}

struct Key {
    kid: Option<String>,
    alg: Option<String>,
    key: DecodingKey,
}

struct Keys {
    keys: Vec<Key>,
    fetched: Instant,
}

struct FetchState {
    last_attempt: Option<Instant>,
}

/// Verifies JWT access tokens (see the module docs).
pub struct JwtVerifier {
    config: JwtConfig,
    keys: RwLock<Arc<Keys>>,
    fetch: tokio::sync::Mutex<FetchState>,
    client: reqwest::Client,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Largest JWKS document accepted.
const MAX_JWKS_BYTES: usize = 1024 * 1024;

impl JwtVerifier {
    /// Checks the configuration and loads the JWKS once.
    pub async fn new(config: JwtConfig) -> Result<Self, JwtSetupError> {
        if config.algorithms.is_empty() {
            return Err(JwtSetupError::NoAlgorithm);
        }
        if let Some(alg) = config
            .algorithms
            .iter()
            .find(|a| matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512))
        {
            return Err(JwtSetupError::SymmetricAlgorithm(*alg));
        }
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::limited(3))
            .build()
            .map_err(|e| JwtSetupError::Jwks {
                location: config.jwks.to_string(),
                detail: e.without_url().to_string(),
            })?;
        let verifier = Self {
            keys: RwLock::new(Arc::new(Keys {
                keys: Vec::new(),
                fetched: Instant::now(),
            })),
            fetch: tokio::sync::Mutex::new(FetchState {
                last_attempt: Some(Instant::now()),
            }),
            client,
            config,
        };
        let keys = verifier
            .load_keys()
            .await
            .map_err(|detail| JwtSetupError::Jwks {
                location: verifier.config.jwks.to_string(),
                detail,
            })?;
        *verifier.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(keys);
        Ok(verifier)
    }

    /// The configuration.
    pub fn config(&self) -> &JwtConfig {
        &self.config
    }

    fn cached(&self) -> Arc<Keys> {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    async fn load_keys(&self) -> Result<Keys, String> {
        let bytes = match &self.config.jwks {
            JwksSource::Path(path) => tokio::fs::read(path).await.map_err(|e| e.to_string())?,
            JwksSource::Url(url) => {
                // reqwest's errors name the URL, which may hold credentials: not here.
                let mut response = self
                    .client
                    .get(url)
                    .send()
                    .await
                    .map_err(|e| e.without_url().to_string())?;
                if !response.status().is_success() {
                    return Err(format!("HTTP status {}", response.status()));
                }
                let mut body = Vec::new();
                while let Some(chunk) = response
                    .chunk()
                    .await
                    .map_err(|e| e.without_url().to_string())?
                {
                    if body.len() + chunk.len() > MAX_JWKS_BYTES {
                        return Err(format!("the document exceeds {MAX_JWKS_BYTES} bytes"));
                    }
                    body.extend_from_slice(&chunk);
                }
                body
            }
        };
        parse_jwks(&bytes)
    }

    /// Fetches the JWKS again unless that happened less than `min_gap` ago (single flight:
    /// concurrent callers wait for one fetch). Returns whether the cache was renewed.
    async fn refresh(&self, min_gap: Duration) -> bool {
        let mut state = self.fetch.lock().await;
        if state.last_attempt.is_some_and(|t| t.elapsed() < min_gap) {
            return false;
        }
        state.last_attempt = Some(Instant::now());
        match self.load_keys().await {
            Ok(keys) => {
                tracing::info!(jwks = %self.config.jwks, keys = keys.keys.len(), "JWKS loaded");
                *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(keys);
                true
            }
            Err(detail) => {
                tracing::warn!(jwks = %self.config.jwks, %detail, "cannot refresh the JWKS; keeping the cached keys");
                false
            }
        }
    }

    /// The key for a token's `kid` and `alg`, refetching the JWKS once when it is unknown.
    async fn key_for(&self, kid: Option<&str>, alg: Algorithm) -> Result<DecodingKey, AuthError> {
        if self.cached().fetched.elapsed() >= self.config.max_age {
            self.refresh(self.config.refetch_interval).await;
        }
        for attempt in 0..2 {
            let keys = self.cached();
            let alg_name = format!("{alg:?}");
            let usable = |k: &&Key| k.alg.as_ref().is_none_or(|a| *a == alg_name);
            let found = match kid {
                Some(kid) => keys
                    .keys
                    .iter()
                    .filter(usable)
                    .find(|k| k.kid.as_deref() == Some(kid)),
                None => {
                    let mut candidates = keys.keys.iter().filter(usable);
                    match (candidates.next(), candidates.next()) {
                        (Some(only), None) => Some(only),
                        _ => {
                            return Err(AuthError::InvalidToken(
                                "the token names no key (`kid`) and the key set has several".into(),
                            ));
                        }
                    }
                }
            };
            if let Some(key) = found {
                return Ok(key.key.clone());
            }
            if attempt == 0 && !self.refresh(self.config.refetch_interval).await {
                break;
            }
        }
        Err(AuthError::InvalidToken(
            "the token is signed with an unknown key".into(),
        ))
    }

    /// Verifies a token and maps it to an identity.
    pub async fn verify(&self, token: &str) -> Result<Identity, AuthError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| AuthError::InvalidToken("the token is not a well-formed JWT".into()))?;
        if !self.config.algorithms.contains(&header.alg) {
            return Err(AuthError::InvalidToken(format!(
                "the token's algorithm {:?} is not accepted",
                header.alg
            )));
        }
        let key = self.key_for(header.kid.as_deref(), header.alg).await?;
        let mut validation = Validation::new(header.alg);
        validation.algorithms = vec![header.alg];
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&[&self.config.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.leeway = self.config.leeway.as_secs();
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation)
            .map_err(|e| AuthError::InvalidToken(describe(e.kind())))?;
        self.identity(&data.claims)
    }

    fn identity(&self, claims: &Map<String, Value>) -> Result<Identity, AuthError> {
        let text = |name: &str| claims.get(name).and_then(Value::as_str);
        let iss = text("iss").unwrap_or(&self.config.issuer);
        let sub = text("sub")
            .filter(|s| !s.is_empty())
            .ok_or_else(|| AuthError::InvalidToken("the token has no `sub` claim".into()))?;
        let mut principal = format!("{}#{}", escape(iss), escape(sub));
        if let Some(client) = text("client_id").filter(|s| !s.is_empty()) {
            principal.push('#');
            principal.push_str(&escape(client));
        }
        let tenant = match &self.config.tenant_claim {
            None => iss.to_owned(),
            Some(claim) => match claims.get(claim) {
                Some(Value::String(s)) if !s.is_empty() => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                _ => {
                    return Err(AuthError::InvalidToken(format!(
                        "the token has no `{claim}` claim naming its tenant"
                    )));
                }
            },
        };
        check_name("tenant", &tenant).map_err(AuthError::InvalidToken)?;
        check_name("principal", &principal).map_err(AuthError::InvalidToken)?;
        let mut scopes = BTreeSet::new();
        if let Some(scope) = text("scope") {
            scopes.extend(scope.split_ascii_whitespace().map(str::to_owned));
        }
        match claims.get("scp") {
            Some(Value::String(s)) => scopes.extend(s.split_ascii_whitespace().map(str::to_owned)),
            Some(Value::Array(a)) => {
                scopes.extend(a.iter().filter_map(Value::as_str).map(str::to_owned));
            }
            _ => {}
        }
        Ok(Identity {
            owner: Owner::new(tenant, principal),
            scopes,
        })
    }
}

impl Authenticator for JwtVerifier {
    fn authenticate<'a>(
        &'a self,
        request: &'a Parts,
    ) -> BoxFuture<'a, Result<Identity, AuthError>> {
        async move {
            match bearer_token(&request.headers)? {
                None => Err(AuthError::Missing),
                Some(token) => self.verify(token).await,
            }
        }
        .boxed()
    }

    fn authorization_servers(&self) -> Vec<String> {
        vec![self.config.issuer.clone()]
    }
}

fn describe(kind: &ErrorKind) -> String {
    match kind {
        ErrorKind::ExpiredSignature => "the token has expired".into(),
        ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".into(),
        ErrorKind::InvalidAudience => "the token is not issued for this resource (aud)".into(),
        ErrorKind::InvalidIssuer => "the token is from another issuer (iss)".into(),
        ErrorKind::MissingRequiredClaim(c) => format!("the token has no `{c}` claim"),
        ErrorKind::InvalidSignature => "the token's signature does not verify".into(),
        ErrorKind::InvalidAlgorithm => "the token's algorithm does not fit its key".into(),
        _ => "the token is not a well-formed JWT".into(),
    }
}

/// Percent-encodes `%` and `#` so that `iss#sub#client` stays unambiguous.
fn escape(s: &str) -> String {
    s.replace('%', "%25").replace('#', "%23")
}

/// Parses a JWK Set, keeping the signature keys it can use and skipping (with a warning)
/// the ones it cannot, so that one exotic key does not disable the others.
fn parse_jwks(bytes: &[u8]) -> Result<Keys, String> {
    #[derive(serde::Deserialize)]
    struct Set {
        keys: Vec<Value>,
    }
    let set: Set = serde_json::from_slice(bytes).map_err(|e| format!("not a JWK Set: {e}"))?;
    let mut keys = Vec::new();
    for raw in set.keys {
        let jwk: Jwk = match serde_json::from_value(raw) {
            Ok(jwk) => jwk,
            Err(e) => {
                tracing::warn!(error = %e, "skipping a JWK that cannot be read");
                continue;
            }
        };
        if matches!(jwk.common.public_key_use, Some(ref u) if *u != PublicKeyUse::Signature) {
            continue;
        }
        let key = match DecodingKey::from_jwk(&jwk) {
            Ok(key) => key,
            Err(e) => {
                tracing::warn!(kid = ?jwk.common.key_id, error = %e, "skipping an unusable JWK");
                continue;
            }
        };
        keys.push(Key {
            kid: jwk.common.key_id.clone(),
            alg: jwk.common.key_algorithm.map(|a| format!("{a:?}")),
            key,
        });
    }
    if keys.is_empty() {
        return Err("the JWK Set holds no usable signature key".into());
    }
    Ok(Keys {
        keys,
        fetched: Instant::now(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jwks_url_is_shown_without_credentials_or_query() {
        for (url, shown) in [
            (
                "https://user:s3cret@idp.example/jwks.json?key=k3y#frag",
                "https://…@idp.example/jwks.json?…",
            ),
            ("https://idp.example/jwks", "https://idp.example/jwks"),
            ("http://a:b@127.0.0.1:9", "http://…@127.0.0.1:9"),
            ("https://idp.example?t=1", "https://idp.example?…"),
        ] {
            assert_eq!(JwksSource::parse(url).to_string(), shown);
            assert!(format!("{:?}", JwksSource::parse(url)).contains(shown));
        }
    }

    /// A JWKS that cannot be fetched names its location without the secret parts, and the
    /// transport's error does not repeat the URL.
    #[tokio::test]
    async fn setup_errors_hold_no_credentials() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let url = format!("http://user:s3cret@127.0.0.1:{port}/jwks?token=t0ken");
        let config = JwtConfig::new(JwksSource::parse(&url), "https://idp", "https://rs");
        let error = JwtVerifier::new(config).await.unwrap_err().to_string();
        assert!(error.contains("could not be loaded"), "{error}");
        assert!(
            !error.contains("s3cret") && !error.contains("t0ken"),
            "{error}"
        );
    }
}
