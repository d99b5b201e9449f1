//! The JWKS cache of the JWT verifier against a JWKS served over HTTP on 127.0.0.1: a key
//! rotated in is fetched on its first unknown `kid`, and made-up `kid`s cannot make the
//! server fetch more than once per refetch interval.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::get;
use jsonwebtoken::{EncodingKey, Header};
use mcp_tasks::auth::{AuthError, JwksSource, JwtConfig, JwtVerifier};
use serde_json::json;

const ISSUER: &str = "https://idp.example.test";
const AUDIENCE: &str = "https://mcp.example.test/mcp";
const INTERVAL: Duration = Duration::from_secs(2);

struct Jwks {
    doc: Mutex<String>,
    fetches: AtomicUsize,
}

async fn serve_jwks(jwks: Arc<Jwks>) -> String {
    let app = axum::Router::new().route(
        "/jwks.json",
        get(move || {
            let jwks = jwks.clone();
            async move {
                jwks.fetches.fetch_add(1, Ordering::SeqCst);
                let doc = jwks.doc.lock().unwrap().clone();
                ([("content-type", "application/json")], doc)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/jwks.json")
}

fn token(key: &[u8], kid: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut header = Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some(kid.into());
    let claims = json!({ "iss": ISSUER, "sub": "erin", "aud": AUDIENCE, "exp": now + 600 });
    jsonwebtoken::encode(&header, &claims, &EncodingKey::from_rsa_pem(key).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_kids_refetch_the_jwks_at_a_bounded_rate() {
    let jwks = Arc::new(Jwks {
        doc: Mutex::new(std::fs::read_to_string("tests/data/auth/jwks.json").unwrap()),
        fetches: AtomicUsize::new(0),
    });
    let url = serve_jwks(jwks.clone()).await;
    let verifier = JwtVerifier::new(
        JwtConfig::new(JwksSource::parse(&url), ISSUER, AUDIENCE).refetch_interval(INTERVAL),
    )
    .await
    .unwrap();
    assert_eq!(
        jwks.fetches.load(Ordering::SeqCst),
        1,
        "loaded once at start"
    );

    let key1 = include_bytes!("../data/auth/test-rsa.pem");
    let key2 = include_bytes!("../data/auth/test-rsa-2.pem");
    let erin = verifier.verify(&token(key1, "test-key-1")).await.unwrap();
    assert_eq!(erin.owner.tenant, ISSUER);
    assert_eq!(erin.owner.principal, format!("{ISSUER}#erin"));
    assert_eq!(
        jwks.fetches.load(Ordering::SeqCst),
        1,
        "a known kid fetches nothing"
    );

    // Signing is slow in a debug build: the made-up tokens are made before the clock matters.
    let made_up: Vec<String> = (0..50)
        .map(|i| token(key2, &format!("made-up-{i}")))
        .collect();
    let rotated = token(key2, "test-key-2");

    // The issuer rotates a key in: its first token (once the interval since the last fetch
    // has passed) triggers one refetch and is accepted.
    tokio::time::sleep(INTERVAL).await;
    *jwks.doc.lock().unwrap() =
        std::fs::read_to_string("tests/data/auth/jwks-rotated.json").unwrap();
    verifier.verify(&rotated).await.unwrap();
    assert_eq!(jwks.fetches.load(Ordering::SeqCst), 2);

    // A flood of made-up kids right after: refused, and no more fetches within the interval
    // (50 cache misses take far less than the interval).
    for token in &made_up {
        let e = verifier.verify(token).await.unwrap_err();
        assert!(
            matches!(e, AuthError::InvalidToken(ref m) if m.contains("unknown key")),
            "{e}"
        );
    }
    assert_eq!(jwks.fetches.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_verifier_refuses_symmetric_algorithms_and_a_missing_jwks() {
    let e = JwtVerifier::new(
        JwtConfig::new(
            JwksSource::parse("tests/data/auth/jwks.json"),
            ISSUER,
            AUDIENCE,
        )
        .algorithms(vec![jsonwebtoken::Algorithm::HS256]),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("symmetric"), "{e}");
    let e = JwtVerifier::new(JwtConfig::new(
        JwksSource::parse("tests/data/auth/no-such-file.json"),
        ISSUER,
        AUDIENCE,
    ))
    .await
    .unwrap_err();
    assert!(e.to_string().contains("no-such-file.json"), "{e}");
}
