//! Failed credentials, throttled: [`FailureThrottle`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine as _;
use tokio::time::Instant;

/// The most addresses and principals one throttle tracks at once.
pub(crate) const MAX_TRACKED: usize = 65_536;

/// What a throttle counts failures by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    /// An IPv4 address, or an IPv6 address's `/64` prefix.
    Address(IpAddr),
    /// A principal a credential claims (unverified).
    Principal(String),
}

#[derive(Debug, Clone, Copy)]
struct Window {
    started: Instant,
    failures: u32,
}

/// Counts refused credentials per address and per claimed principal: after
/// [`FailureThrottle::max_failures`] refused credentials within [`FailureThrottle::window`]
/// from one address, or naming one principal, further
/// attempts from it are answered `429` with `Retry-After` *before* the credential is checked,
/// until the window that counted them has passed.
///
/// The MCP endpoint counts the bearer tokens its authenticator refuses (not requests without
/// any credential: an OAuth client's first request has none, by design); the console counts
/// refused logins and refused `Authorization` headers. Each surface has its own throttle.
///
/// The address is the TCP peer's (the `ConnectInfo<SocketAddr>` extension, which
/// [`crate::transport::http::serve_with`] sets), IPv6 addresses by their `/64` prefix (one
/// host commonly holds a whole prefix). The *claimed* principal is what a credential says about
/// its owner before it is verified: the `sub` (with its `iss`) of a JWT. An opaque bearer
/// token names nobody, so only its address counts. A claimed principal can be named by
/// anyone: an attacker can hold a principal's logins at `429` for one window at a time (never
/// longer than [`FailureThrottle::window`] after the last failure) — the price of bounding a
/// guess-the-secret attack per account.
///
/// Memory is bounded: at most 65,536 addresses and principals are tracked; past that,
/// expired entries are dropped, and while every entry is live new keys are not tracked (logged
/// once a window).
#[derive(Debug)]
pub struct FailureThrottle {
    max_failures: u32,
    window: Duration,
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    windows: HashMap<Key, Window>,
    /// When "too many keys" was last logged.
    warned: Option<Instant>,
}

impl Default for FailureThrottle {
    /// 10 failures a minute.
    fn default() -> Self {
        FailureThrottle::new(10, Duration::from_secs(60))
    }
}

impl FailureThrottle {
    /// A throttle that refuses an address or principal for the rest of a `window` once it has
    /// had `max_failures` refused credentials in it. `max_failures` 0 turns throttling off.
    pub fn new(max_failures: u32, window: Duration) -> FailureThrottle {
        FailureThrottle {
            max_failures,
            window: window.max(Duration::from_secs(1)),
            counts: Mutex::new(Counts::default()),
        }
    }

    /// Failures allowed in one window.
    pub fn max_failures(&self) -> u32 {
        self.max_failures
    }

    /// The window failures are counted in.
    pub fn window(&self) -> Duration {
        self.window
    }

    fn keys(address: Option<IpAddr>, principal: Option<&str>) -> impl Iterator<Item = Key> {
        address
            .map(|a| Key::Address(prefix(a)))
            .into_iter()
            .chain(principal.map(|p| Key::Principal(p.to_owned())))
    }

    /// `Err(retry_after)` when `address` or `principal` has used up its failures for the
    /// current window.
    pub fn check(&self, address: Option<IpAddr>, principal: Option<&str>) -> Result<(), Duration> {
        if self.max_failures == 0 {
            return Ok(());
        }
        let now = Instant::now();
        let counts = self.lock();
        let mut retry = None;
        for key in Self::keys(address, principal) {
            if let Some(w) = counts.windows.get(&key) {
                let ends = w.started + self.window;
                if w.failures >= self.max_failures && now < ends {
                    retry = retry.max(Some(ends - now));
                }
            }
        }
        match retry {
            // Whole seconds for `Retry-After`, rounded up.
            Some(after) => Err(Duration::from_secs(after.as_secs() + 1)),
            None => Ok(()),
        }
    }

    /// Records one refused credential from `address`, claiming `principal`.
    pub fn failed(&self, address: Option<IpAddr>, principal: Option<&str>) {
        if self.max_failures == 0 {
            return;
        }
        let now = Instant::now();
        let window = self.window;
        let mut counts = self.lock();
        for key in Self::keys(address, principal) {
            if !counts.windows.contains_key(&key) && counts.windows.len() >= MAX_TRACKED {
                counts.windows.retain(|_, w| now < w.started + window);
                if counts.windows.len() >= MAX_TRACKED {
                    if counts.warned.is_none_or(|at| now >= at + window) {
                        counts.warned = Some(now);
                        tracing::warn!(
                            tracked = MAX_TRACKED,
                            "authentication throttle: too many addresses and principals with \
                             recent failures; new ones are not counted this window"
                        );
                    }
                    continue;
                }
            }
            let w = counts.windows.entry(key).or_insert(Window {
                started: now,
                failures: 0,
            });
            if now >= w.started + window {
                *w = Window {
                    started: now,
                    failures: 0,
                };
            }
            w.failures = w.failures.saturating_add(1);
        }
    }

    /// How many addresses and principals are tracked (for tests of the memory bound).
    pub fn tracked(&self) -> usize {
        self.lock().windows.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The address failures are counted by: IPv4 as is, IPv6 by its `/64` prefix (an IPv4-mapped
/// IPv6 address as its IPv4 address).
fn prefix(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(_) => address,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// The principal an `Authorization` value claims before it is verified: `iss` and `sub` of a
/// JWT (`None` for anything else, or for claims longer than 256 bytes).
pub fn claimed_principal(authorization: &str) -> Option<String> {
    let token = authorization
        .trim()
        .strip_prefix("Bearer ")
        .or_else(|| authorization.trim().strip_prefix("bearer "))?
        .trim();
    let mut parts = token.split('.');
    let (_header, payload, _signature) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || payload.len() > 8192 {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let sub = claims.get("sub")?.as_str()?;
    let iss = claims.get("iss").and_then(|v| v.as_str()).unwrap_or("");
    let claimed = format!("{iss} {sub}");
    (claimed.len() <= 256).then_some(claimed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn an_address_is_refused_after_its_failures_until_the_window_passes() {
        let t = FailureThrottle::new(3, Duration::from_secs(60));
        for _ in 0..3 {
            assert!(t.check(ip("10.0.0.1"), None).is_ok());
            t.failed(ip("10.0.0.1"), None);
        }
        let retry = t.check(ip("10.0.0.1"), None).unwrap_err();
        assert!(retry <= Duration::from_secs(61) && retry >= Duration::from_secs(60));
        // Another address is not affected.
        assert!(t.check(ip("10.0.0.2"), None).is_ok());
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(t.check(ip("10.0.0.1"), None).is_err());
        tokio::time::advance(Duration::from_secs(31)).await;
        assert!(t.check(ip("10.0.0.1"), None).is_ok(), "the window passed");
        // A new window counts from zero.
        t.failed(ip("10.0.0.1"), None);
        assert!(t.check(ip("10.0.0.1"), None).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_claimed_principal_is_refused_from_every_address() {
        let t = FailureThrottle::new(2, Duration::from_secs(10));
        t.failed(ip("10.0.0.1"), Some("iss alice"));
        t.failed(ip("10.0.0.2"), Some("iss alice"));
        assert!(t.check(ip("10.0.0.3"), Some("iss alice")).is_err());
        assert!(t.check(ip("10.0.0.3"), Some("iss bob")).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn ipv6_counts_by_prefix_and_zero_turns_it_off() {
        let t = FailureThrottle::new(1, Duration::from_secs(10));
        t.failed(ip("2001:db8::1"), None);
        assert!(t.check(ip("2001:db8::ffff"), None).is_err());
        assert!(t.check(ip("2001:db9::1"), None).is_ok());
        let off = FailureThrottle::new(0, Duration::from_secs(10));
        for _ in 0..100 {
            off.failed(ip("10.0.0.1"), None);
        }
        assert!(off.check(ip("10.0.0.1"), None).is_ok());
        assert_eq!(off.tracked(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn memory_is_bounded() {
        let t = FailureThrottle::new(5, Duration::from_secs(10));
        for i in 0..(MAX_TRACKED as u32 + 1000) {
            t.failed(Some(IpAddr::V4(i.into())), None);
        }
        assert_eq!(t.tracked(), MAX_TRACKED);
        tokio::time::advance(Duration::from_secs(11)).await;
        t.failed(ip("10.0.0.1"), None);
        assert_eq!(
            t.tracked(),
            1,
            "expired entries are dropped when the map is full"
        );
    }

    #[test]
    fn a_jwt_claims_its_subject_and_an_opaque_token_nobody() {
        let enc = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let jwt = format!(
            "Bearer {}.{}.sig",
            enc("{\"alg\":\"RS256\"}"),
            enc("{\"iss\":\"https://idp\",\"sub\":\"alice\"}")
        );
        assert_eq!(
            claimed_principal(&jwt).as_deref(),
            Some("https://idp alice")
        );
        assert_eq!(claimed_principal("Bearer opaque-token"), None);
        assert_eq!(claimed_principal("Basic abc"), None);
        assert_eq!(claimed_principal("Bearer a.b.c"), None);
    }
}
