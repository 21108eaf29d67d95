//! The registry client: every request to a registry or mirror, authenticated as the registry
//! asks (`WWW-Authenticate`: a bearer token from its realm, or basic) with the credentials of the
//! endpoint's registry, read through [`crate::http`]. One challenge round per request: a registry
//! that answers 401 to its own token is refused, never asked again in a loop.
//!
//! **Credentials stay home.** The basic credentials of a registry go to the registry itself only
//! over HTTPS, or over plain HTTP when the registry is configured insecure; to a bearer realm
//! only when the realm is that registry's host or a host of the same domain (Docker Hub's
//! `auth.docker.io` for `registry-1.docker.io`), over HTTPS (plain HTTP: again only for a
//! registry configured insecure). Any other realm is asked for an anonymous token.

use crate::auth::{Credential, Credentials};
use crate::http::{Answer, Http, HttpError, Request, Sink, authority};
use crate::limits::{Limit, SMALL_REQUEST, TOKEN};
use crate::mirrors::{Endpoint, Scheme};
use base64::Engine;
use http::{StatusCode, header};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Tokens kept (per endpoint host, repository and actions); the table starts over when full.
const TOKENS: usize = 256;

/// Why a registry request failed. [`RegistryError::transient`] tells a registry that is away
/// or overloaded (ask again later) from an answer that will not change by asking again.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Http(#[from] HttpError),
    /// The registry has no such manifest or blob (404).
    #[error("{method} {url}: 404 not found")]
    NotFound { method: String, url: String },
    /// Another status than the one expected.
    #[error("{method} {url}: {status}{}", if .said.is_empty() { String::new() } else { format!(" ({})", .said) })]
    Status {
        method: String,
        url: String,
        status: u16,
        said: String,
    },
    /// An answer that is not what was asked for (another digest, not a manifest, no token…).
    #[error("{url}: {why}")]
    Answer { url: String, why: String },
}

impl RegistryError {
    /// Away, too slow or overloaded: a connection that failed, a deadline, 5xx, 429, 408.
    pub fn transient(&self) -> bool {
        match self {
            RegistryError::Http(e) => e.transient(),
            RegistryError::Status { status, .. } => {
                *status >= 500 || *status == 429 || *status == 408
            }
            RegistryError::NotFound { .. } | RegistryError::Answer { .. } => false,
        }
    }

    /// The status of an answer that was not a success, as an error.
    pub fn status(method: &str, answer: &Answer) -> RegistryError {
        if answer.status == StatusCode::NOT_FOUND {
            return RegistryError::NotFound {
                method: method.to_string(),
                url: answer.url.clone(),
            };
        }
        RegistryError::Status {
            method: method.to_string(),
            url: answer.url.clone(),
            status: answer.status.as_u16(),
            said: answer.snippet(),
        }
    }
}

/// What a 401 asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Challenge {
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
    Basic,
}

/// The client. Cheap to share (`Arc`); its tables are bounded.
pub struct Client {
    http: Http,
    credentials: Arc<Credentials>,
    /// Hosts spoken to over plain HTTP whatever the configuration says (`--insecure-registry`).
    insecure: Vec<String>,
    tokens: Mutex<HashMap<(String, String, String), String>>,
}

impl Client {
    pub fn new(insecure: Vec<String>, credentials: Arc<Credentials>) -> Client {
        Client {
            http: Http::default(),
            credentials,
            insecure,
            tokens: Mutex::default(),
        }
    }

    /// Whether `host` is configured insecure (plain HTTP).
    pub fn insecure(&self, host: &str) -> bool {
        self.insecure.iter().any(|h| h == host)
    }

    /// The URL schemes to try for `endpoint`, in order.
    pub fn schemes(&self, endpoint: &Endpoint) -> &'static [&'static str] {
        match endpoint.scheme {
            _ if self.insecure(&endpoint.host) => &["http"],
            Scheme::Http => &["http"],
            Scheme::Https => &["https"],
            Scheme::HttpsThenHttp => &["https", "http"],
        }
    }

    /// Send `request` — a URL on `endpoint` — for `actions` (`pull`, `pull,push`) on its
    /// repository, authenticating once if the registry asks; the answer whatever its status,
    /// a successful answer's body streamed to `sink` when there is one ([`Http::send_to`]).
    pub async fn send(
        &self,
        endpoint: &Endpoint,
        request: Request,
        actions: &str,
        limit: Limit,
        deadline: Duration,
        mut sink: Option<&mut dyn Sink>,
    ) -> Result<Answer, RegistryError> {
        let key = (
            endpoint.host.clone(),
            endpoint.repository.clone(),
            actions.to_string(),
        );
        let cached = self.tokens.lock().expect("tokens").get(&key).cloned();
        let first = match &cached {
            Some(token) => bearer(request.clone(), token),
            None => request.clone(),
        };
        let answer = self
            .http
            .send_to(
                &endpoint.tls,
                first,
                limit,
                deadline,
                sink.as_mut().map(|s| &mut **s as &mut dyn Sink),
            )
            .await?;
        if answer.status != StatusCode::UNAUTHORIZED {
            return Ok(answer);
        }
        let retry = match challenge(&answer) {
            Some(Challenge::Bearer {
                realm,
                service,
                scope,
            }) => {
                let scope = scope
                    .unwrap_or_else(|| format!("repository:{}:{actions}", endpoint.repository));
                let token = self
                    .token(endpoint, &realm, service.as_deref(), &scope)
                    .await?;
                self.remember(key, &token);
                bearer(request, &token)
            }
            Some(Challenge::Basic) => match self.basic_credential(endpoint, &answer.url).await {
                Some(c) => basic(request, &c),
                None => return Ok(answer),
            },
            None => return Ok(answer),
        };
        Ok(self
            .http
            .send_to(&endpoint.tls, retry, limit, deadline, sink)
            .await?)
    }

    fn remember(&self, key: (String, String, String), token: &str) {
        let mut tokens = self.tokens.lock().expect("tokens");
        if tokens.len() >= TOKENS {
            tokens.clear();
        }
        tokens.insert(key, token.to_string());
    }

    /// The endpoint registry's credential, when it may be sent to `url` as basic auth: over
    /// HTTPS, or plain HTTP to a registry configured insecure.
    async fn basic_credential(&self, endpoint: &Endpoint, url: &str) -> Option<Credential> {
        let plain = url.starts_with("http://");
        if plain && !self.plain_allowed(endpoint) {
            return None;
        }
        self.credential(endpoint).await
    }

    /// The credential of the endpoint's registry: the credentials file's, else an image
    /// credential provider's.
    async fn credential(&self, endpoint: &Endpoint) -> Option<Credential> {
        let image = format!("{}/{}", endpoint.auth_host, endpoint.repository);
        // A provider's failure is said where it failed; the request goes on without one.
        let resolved = self
            .credentials
            .resolve(&endpoint.auth_host, &endpoint.repository, &image);
        resolved.await.ok().flatten()
    }

    fn plain_allowed(&self, endpoint: &Endpoint) -> bool {
        self.insecure(&endpoint.host) || endpoint.scheme != Scheme::Https
    }

    /// A token from `realm`, with the registry's credentials where they may go there.
    async fn token(
        &self,
        endpoint: &Endpoint,
        realm: &str,
        service: Option<&str>,
        scope: &str,
    ) -> Result<String, RegistryError> {
        if !(realm.starts_with("https://") || realm.starts_with("http://")) {
            return Err(RegistryError::Answer {
                url: realm.to_string(),
                why: "a token realm that is not an HTTP(S) URL".into(),
            });
        }
        let mut query = vec![("scope", scope)];
        query.extend(service.map(|s| ("service", s)));
        let mut request = Request::get(with_query(realm, &query));
        let credential = self.credential(endpoint).await;
        if let Some(c) = &credential
            && self.realm_trusted(endpoint, realm)
        {
            request = basic(request, c);
        } else if credential.is_some() {
            tracing::warn!(registry = %endpoint.auth_host, %realm, "the registry's token realm is not its own host: asking it for an anonymous token");
        }
        let tls = match authority(realm) == authority(&format!("https://{}", endpoint.host)) {
            true => endpoint.tls.clone(),
            false => Default::default(),
        };
        let answer = self.http.send(&tls, request, TOKEN, SMALL_REQUEST).await?;
        if !answer.status.is_success() {
            let said = match answer.snippet() {
                s if s.is_empty() => String::new(),
                s => format!(" ({s})"),
            };
            return Err(RegistryError::Answer {
                url: answer.url.clone(),
                why: format!(
                    "authenticating: the token service answered {}{said}",
                    answer.status
                ),
            });
        }
        token_of(&answer)
    }

    /// May the registry's credentials go to `realm`?
    fn realm_trusted(&self, endpoint: &Endpoint, realm: &str) -> bool {
        let scheme_ok = realm.starts_with("https://") || self.plain_allowed(endpoint);
        let realm_host = host_of(realm);
        let registry_host = endpoint.host.split(':').next().unwrap_or("");
        scheme_ok && (realm_host == registry_host || same_domain(&realm_host, registry_host))
    }
}

fn bearer(request: Request, token: &str) -> Request {
    request.header(header::AUTHORIZATION, &format!("Bearer {token}"))
}

fn basic(request: Request, c: &Credential) -> Request {
    let pair =
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", c.username, c.password));
    request.header(header::AUTHORIZATION, &format!("Basic {pair}"))
}

/// The token of a token service's answer (`token` or `access_token`).
fn token_of(answer: &Answer) -> Result<String, RegistryError> {
    #[derive(serde::Deserialize)]
    struct Token {
        token: Option<String>,
        access_token: Option<String>,
    }
    let refuse = |why: &str| RegistryError::Answer {
        url: answer.url.clone(),
        why: why.to_string(),
    };
    let token: Token =
        serde_json::from_slice(&answer.body).map_err(|_| refuse("the token answer is not JSON"))?;
    let token = token
        .token
        .or(token.access_token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| refuse("the token answer holds no token"))?;
    if http::HeaderValue::from_str(&token).is_err() {
        return Err(refuse("the token is not a header value"));
    }
    Ok(token)
}

/// The host of a URL, without port.
fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    host.split(':').next().unwrap_or("").to_ascii_lowercase()
}

/// Two DNS names under the same domain: their last two labels agree (not for IP addresses).
fn same_domain(a: &str, b: &str) -> bool {
    let domain = |h: &str| {
        if h.parse::<std::net::IpAddr>().is_ok() || !h.contains('.') {
            return None;
        }
        let labels: Vec<&str> = h.rsplit('.').take(2).collect();
        Some(labels.join("."))
    };
    matches!((domain(a), domain(b)), (Some(x), Some(y)) if x == y)
}

/// `url` with `query` appended, its values percent-encoded.
pub fn with_query(url: &str, query: &[(&str, &str)]) -> String {
    let mut out = url.to_string();
    for (i, (key, value)) in query.iter().enumerate() {
        let sep = if i == 0 && !url.contains('?') {
            '?'
        } else {
            '&'
        };
        out.push(sep);
        out.push_str(key);
        out.push('=');
        out.push_str(&percent_encode(value));
    }
    out
}

fn percent_encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The first challenge of a 401 answer.
fn challenge(answer: &Answer) -> Option<Challenge> {
    let header = answer.header(header::WWW_AUTHENTICATE)?;
    let (kind, params) = header.split_once(' ').unwrap_or((header, ""));
    if kind.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !kind.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut realm = None;
    let (mut service, mut scope) = (None, None);
    for (key, value) in parameters(params) {
        match key.as_str() {
            "realm" => realm = Some(value),
            "service" => service = Some(value),
            "scope" => scope = Some(value),
            _ => {}
        }
    }
    Some(Challenge::Bearer {
        realm: realm?,
        service,
        scope,
    })
}

/// `key="value", key=value` pairs (values may hold commas inside quotes).
fn parameters(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text.trim();
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq]
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_lowercase();
        let after = &rest[eq + 1..];
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => match quoted.find('"') {
                Some(end) => (&quoted[..end], &quoted[end + 1..]),
                None => (quoted, ""),
            },
            None => match after.find(',') {
                Some(comma) => (&after[..comma], &after[comma..]),
                None => (after, ""),
            },
        };
        out.push((key, value.trim().to_string()));
        rest = next.trim_start_matches([',', ' ']);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_read_with_quoted_commas() {
        let p = parameters(
            r#"realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(
            p,
            [
                (
                    "realm".to_string(),
                    "https://auth.example/token".to_string()
                ),
                ("service".into(), "registry.example".into()),
                ("scope".into(), "repository:a/b:pull,push".into()),
            ]
        );
        assert_eq!(
            parameters("realm=x, service=y"),
            [
                ("realm".to_string(), "x".to_string()),
                ("service".into(), "y".into())
            ]
        );
    }

    fn endpoint(host: &str, scheme: Scheme) -> Endpoint {
        let mut e = Endpoint::source(host, "a/b");
        e.scheme = scheme;
        e
    }

    #[test]
    fn credentials_go_to_the_registry_s_own_realm_over_https_only() {
        let c = Client::new(vec!["10.0.0.1:5000".into()], Arc::default());
        let hub = endpoint("registry-1.docker.io", Scheme::Https);
        assert!(c.realm_trusted(&hub, "https://auth.docker.io/token"));
        assert!(
            !c.realm_trusted(&hub, "http://auth.docker.io/token"),
            "plain HTTP"
        );
        assert!(
            !c.realm_trusted(&hub, "https://evil.example/token"),
            "another domain"
        );
        let quay = endpoint("quay.io", Scheme::Https);
        assert!(c.realm_trusted(&quay, "https://quay.io/v2/auth"));
        assert!(!c.realm_trusted(&quay, "https://quay.io.evil.example/v2/auth"));
        // A registry configured insecure may take them over plain HTTP, on its own host.
        let local = endpoint("10.0.0.1:5000", Scheme::Https);
        assert!(c.realm_trusted(&local, "http://10.0.0.1:5001/token"));
        assert!(
            !c.realm_trusted(&local, "http://10.0.0.2/token"),
            "another address"
        );
    }

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            with_query(
                "https://a/t",
                &[("scope", "repository:x/y:pull,push"), ("service", "a b")]
            ),
            "https://a/t?scope=repository%3Ax%2Fy%3Apull%2Cpush&service=a%20b"
        );
        assert_eq!(
            with_query("https://a/t?x=1", &[("s", "v")]),
            "https://a/t?x=1&s=v"
        );
        assert_eq!(host_of("https://user@Auth.Example:443/t?x"), "auth.example");
    }
}

#[cfg(test)]
mod hostile {
    use super::*;
    use crate::limits::MANIFEST;
    use pinset_testkit::hostile::{Hostile, Misbehaviour};

    async fn ask(hostile: &Hostile) -> Result<Answer, RegistryError> {
        let client = Client::new(vec![hostile.addr.clone()], Arc::default());
        let endpoint = Endpoint::source(&hostile.addr, "a/b");
        let url = endpoint.manifest_url("http", "v1");
        client
            .send(
                &endpoint,
                Request::get(url),
                "pull",
                MANIFEST,
                Duration::from_secs(10),
                None,
            )
            .await
    }

    #[tokio::test]
    async fn a_registry_refusing_its_own_token_is_asked_once_not_in_a_loop() {
        let hostile = Hostile::start(Misbehaviour::AuthLoop);
        let answer = ask(&hostile).await.unwrap();
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
        let paths: Vec<String> = hostile.seen().into_iter().map(|s| s.path).collect();
        assert_eq!(
            paths.len(),
            3,
            "the request, the token, the request again: {paths:?}"
        );
        assert!(
            paths[1].starts_with("/token?scope=repository%3Aa%2Fb%3Apull"),
            "{paths:?}"
        );
    }

    #[tokio::test]
    async fn an_endless_token_is_cut_at_the_token_cap() {
        let hostile = Hostile::start(Misbehaviour::HugeToken);
        let e = ask(&hostile).await.unwrap_err();
        assert!(
            e.to_string().contains("token is larger than 65536 bytes"),
            "{e}"
        );
        assert!(!e.transient());
    }
}
