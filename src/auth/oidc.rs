//! `[auth.oidc]` at run time: the identity provider's key set, fetched at
//! start and every `jwks_refresh` (discovered from the issuer when no
//! `jwks_url` is set), fetched again when a token names a `kid` it does not
//! hold (at most once per [`UNKNOWN_KID_REFRESH`]), and kept when a fetch
//! fails; and the verification of one token against it.
use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::jwt::{JwtError, KeySet, Verified};
use crate::config::OidcSettings;
use crate::metrics::names::{JWKS_REFRESHES, JWT_VERIFICATIONS};
use crate::store::{CachedKeyStore, Change};

/// The session id of every verified token's cached session: one id, so
/// that a key leaving the set drops them all at once.
pub const JWT_SESSION_ID: &str = "jwt";
/// A token naming an unknown `kid` fetches the key set again at most this often.
pub const UNKNOWN_KID_REFRESH: Duration = Duration::from_secs(30);
/// A key set or discovery document larger than this is refused.
const MAX_DOCUMENT_BYTES: usize = 1 << 20;
/// One fetch (connect, TLS, answer) takes at most this long.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// While no key set was ever fetched, the next try comes after this, doubled
/// each time up to `jwks_refresh`.
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// Why a JWT got no principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OidcError {
    /// The token does not hold (a 401 of this reason).
    Refused(JwtError),
    /// No key set was ever fetched (a 503: the client did nothing wrong).
    NoKeySet,
}

/// The identity provider: its settings and its current key set.
pub struct Oidc {
    settings: OidcSettings,
    keys: ArcSwapOption<KeySet>,
    /// When a token's unknown `kid` last made us fetch; held while fetching,
    /// so tokens that arrive meanwhile wait for that one fetch.
    last_kid_refresh: Mutex<Option<Instant>>,
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    /// Where verified tokens are cached: dropped when a key leaves the set.
    cache: CachedKeyStore,
}

impl Oidc {
    /// The provider of `settings`, with no key set yet (see
    /// [`Oidc::spawn_refresh`]); its verified tokens are cached in `cache`.
    pub fn new(settings: OidcSettings, cache: CachedKeyStore) -> Result<Arc<Oidc>, String> {
        let client = Client::builder(TokioExecutor::new()).build(
            crate::tls::client::https_connector(settings.ca_file.as_deref(), FETCH_TIMEOUT)?,
        );
        Ok(Arc::new(Oidc {
            settings,
            keys: ArcSwapOption::empty(),
            last_kid_refresh: Mutex::new(None),
            client,
            cache,
        }))
    }

    /// The settings it was made with.
    pub fn settings(&self) -> &OidcSettings {
        &self.settings
    }

    /// Whether a key set is in use.
    pub fn has_key_set(&self) -> bool {
        self.keys.load().is_some()
    }

    /// Fetches the key set now, then every `jwks_refresh`; while none was
    /// ever fetched, sooner, backing off from [`FIRST_RETRY`]. Stops when
    /// the last other holder of `self` is gone.
    pub fn spawn_refresh(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut retry = FIRST_RETRY;
            loop {
                let Some(oidc) = weak.upgrade() else { return };
                let every = oidc.settings.jwks_refresh;
                let wait = match oidc.refresh().await {
                    Ok(()) => every,
                    Err(_) if !oidc.has_key_set() => {
                        let wait = retry.min(every);
                        retry = (retry * 2).min(every);
                        wait
                    }
                    Err(_) => every,
                };
                drop(oidc);
                tokio::time::sleep(wait).await;
            }
        })
    }

    /// Checks `token` at `now` (unix seconds). A `kid` the key set lacks
    /// fetches it again first, unless that was done in the last
    /// [`UNKNOWN_KID_REFRESH`]; still unknown, the token is invalid.
    pub async fn verify(&self, token: &str, now: i64) -> Result<Verified, OidcError> {
        let result = match self.verify_with_current(token, now) {
            Err(OidcError::Refused(JwtError::UnknownKid)) => {
                self.refresh_for_unknown_kid().await;
                match self.verify_with_current(token, now) {
                    Err(OidcError::Refused(JwtError::UnknownKid)) => {
                        Err(OidcError::Refused(JwtError::Invalid("unknown kid")))
                    }
                    other => other,
                }
            }
            other => other,
        };
        let outcome = match &result {
            Ok(_) => "ok",
            Err(OidcError::NoKeySet) => "no_key_set",
            Err(OidcError::Refused(JwtError::Malformed)) => "malformed",
            Err(OidcError::Refused(JwtError::Expired)) => "expired",
            Err(OidcError::Refused(JwtError::NotYetValid)) => "not_yet_valid",
            Err(OidcError::Refused(_)) => "invalid",
        };
        metrics::counter!(JWT_VERIFICATIONS, "outcome" => outcome).increment(1);
        if let Err(OidcError::Refused(JwtError::Invalid(why))) = &result {
            tracing::debug!(why, "JWT refused");
        }
        result
    }

    fn verify_with_current(&self, token: &str, now: i64) -> Result<Verified, OidcError> {
        let keys = self.keys.load();
        let keys = keys.as_ref().ok_or(OidcError::NoKeySet)?;
        keys.verify(token, &self.settings, now)
            .map_err(OidcError::Refused)
    }

    async fn refresh_for_unknown_kid(&self) {
        let started = Instant::now();
        let mut last = self.last_kid_refresh.lock().await;
        match *last {
            // Another token's fetch finished while this one waited.
            Some(at) if at >= started => {}
            Some(at) if at.elapsed() < UNKNOWN_KID_REFRESH => {}
            _ => {
                let _ = self.refresh().await;
                *last = Some(Instant::now());
            }
        }
    }

    /// Fetches the key set and puts it in use; on any failure the set in
    /// use stays, and the error is logged (naming what was wrong) and counted.
    pub async fn refresh(&self) -> Result<(), String> {
        // A span only when a request waits on the fetch (an unknown `kid`).
        let mut span = crate::trace::child("jwks.fetch", opentelemetry::trace::SpanKind::Client);
        let result = self.fetch_key_set().await;
        let outcome = match &result {
            Ok(keys) => {
                tracing::info!(keys = keys.len(), "identity provider's key set fetched");
                "ok"
            }
            Err(Fetch::Unreachable(e)) => {
                tracing::warn!(error = %e, kept = self.has_key_set(), "identity provider's key set could not be fetched");
                "error"
            }
            Err(Fetch::Refused(e)) => {
                tracing::error!(error = %e, kept = self.has_key_set(), "identity provider's key set refused");
                "invalid"
            }
        };
        metrics::counter!(JWKS_REFRESHES, "outcome" => outcome).increment(1);
        if let Some(span) = span.as_mut() {
            span.set("mpg.jwks.outcome", outcome);
            if outcome != "ok" {
                span.fail(format!("key set {outcome}"));
            }
        }
        match result {
            Ok(keys) => {
                let old = self.keys.swap(Some(Arc::new(keys)));
                let new = self.keys.load();
                if old.is_some_and(|old| new.as_ref().is_some_and(|new| new.drops_a_key_of(&old))) {
                    // A token of a key the provider withdrew stops serving now,
                    // not when its cache entry ages out.
                    self.cache.invalidate(&Change::Session {
                        id: JWT_SESSION_ID.into(),
                    });
                }
                Ok(())
            }
            Err(Fetch::Unreachable(e) | Fetch::Refused(e)) => Err(e),
        }
    }

    async fn fetch_key_set(&self) -> Result<KeySet, Fetch> {
        let url = match &self.settings.jwks_url {
            Some(url) => url.clone(),
            None => self.discover().await?,
        };
        let body = self.get(&url).await?;
        KeySet::parse(&body, &self.settings.algorithms)
            .map_err(|e| Fetch::Refused(format!("{url}: {e}")))
    }

    /// `jwks_uri` of the issuer's discovery document, which must name the
    /// configured issuer (OpenID Connect Discovery §4.3).
    async fn discover(&self) -> Result<String, Fetch> {
        let issuer = self.settings.issuer.trim_end_matches('/');
        let url = format!("{issuer}/.well-known/openid-configuration");
        let body = self.get(&url).await?;
        let doc: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| Fetch::Refused(format!("{url}: not JSON: {e}")))?;
        if doc.get("issuer").and_then(|v| v.as_str()) != Some(self.settings.issuer.as_str()) {
            return Err(Fetch::Refused(format!(
                "{url}: its issuer is not {:?}",
                self.settings.issuer
            )));
        }
        let jwks = doc
            .get("jwks_uri")
            .and_then(|v| v.as_str())
            .ok_or_else(|| Fetch::Refused(format!("{url}: no jwks_uri")))?;
        if let Some(problem) = crate::config::fetch_url_problem(jwks) {
            return Err(Fetch::Refused(format!(
                "{url}: jwks_uri {jwks:?}: {problem}"
            )));
        }
        Ok(jwks.to_owned())
    }

    /// The body of a 200 answer to `GET url`, at most [`MAX_DOCUMENT_BYTES`].
    async fn get(&self, url: &str) -> Result<Bytes, Fetch> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| Fetch::Refused(format!("{url}: {e}")))?;
        let req = http::Request::get(uri)
            .header(http::header::ACCEPT, "application/json")
            .body(Empty::new())
            .map_err(|e| Fetch::Refused(format!("{url}: {e}")))?;
        let fetch = async {
            let res = self
                .client
                .request(req)
                .await
                .map_err(|e| Fetch::Unreachable(format!("{url}: {}", error_chain(&e))))?;
            if res.status() != http::StatusCode::OK {
                return Err(Fetch::Unreachable(format!(
                    "{url}: status {}",
                    res.status()
                )));
            }
            Limited::new(res.into_body(), MAX_DOCUMENT_BYTES)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .map_err(|e| Fetch::Refused(format!("{url}: {e}")))
        };
        tokio::time::timeout(FETCH_TIMEOUT, fetch)
            .await
            .unwrap_or_else(|_| {
                Err(Fetch::Unreachable(format!(
                    "{url}: no answer in {FETCH_TIMEOUT:?}"
                )))
            })
    }
}

enum Fetch {
    /// The provider could not be reached, or did not answer 200.
    Unreachable(String),
    /// It answered with something we do not take.
    Refused(String),
}

impl From<Fetch> for String {
    fn from(f: Fetch) -> String {
        match f {
            Fetch::Unreachable(e) | Fetch::Refused(e) => e,
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
