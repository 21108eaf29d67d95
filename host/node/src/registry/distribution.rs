//! Manifests from registry endpoints (OCI distribution API): the one HTTP client behind sizing
//! and tag resolution. It speaks to an [`Endpoint`] as the runtime would — a mirror under its own
//! path and repository, HTTP or HTTPS, its TLS settings — and authenticates as registries ask
//! (`WWW-Authenticate`: a bearer token from the realm, or basic) with the credentials of the
//! endpoint's host. An endpoint that does not answer is skipped for [`DARK_FOR`], so one dark
//! mirror or source costs one timeout, not one per image.

use super::auth::Credentials;
use super::mirrors::{Endpoint, Scheme, Tls};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The largest manifest accepted (the distribution spec's limit for a manifest).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// How long an endpoint that did not answer is skipped.
pub const DARK_FOR: Duration = Duration::from_secs(60);
/// Connecting, and a whole request (manifests are small).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

pub const MANIFEST_TYPES: [&str; 4] = [
    oci_client::manifest::OCI_IMAGE_MEDIA_TYPE,
    oci_client::manifest::OCI_IMAGE_INDEX_MEDIA_TYPE,
    oci_client::manifest::IMAGE_MANIFEST_MEDIA_TYPE,
    oci_client::manifest::IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];

/// Why an endpoint gave no manifest.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// No answer (refused, timed out, TLS): the endpoint is skipped for a while.
    #[error("{endpoint}: unreachable: {why}")]
    Unreachable { endpoint: String, why: String },
    /// An answer that is not the manifest asked for.
    #[error("{endpoint}: {why}")]
    Answer { endpoint: String, why: String },
}

impl FetchError {
    pub fn unreachable(&self) -> bool {
        matches!(self, FetchError::Unreachable { .. })
    }
}

/// A manifest as served, with the digest of its bytes.
#[derive(Clone, Debug)]
pub struct Manifest {
    pub body: Vec<u8>,
    pub digest: String,
}

/// The HTTP side: clients by TLS settings, tokens by endpoint and repository, dark endpoints.
pub struct Distribution {
    credentials: Arc<Credentials>,
    /// Hosts spoken to over plain HTTP whatever the configuration says (`--insecure-registry`).
    insecure: Vec<String>,
    clients: Mutex<HashMap<Tls, reqwest::Client>>,
    tokens: Mutex<HashMap<(String, String), String>>,
    dark: Mutex<HashMap<String, Instant>>,
}

enum Challenge {
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
    Basic,
}

impl Distribution {
    pub fn new(insecure: Vec<String>, credentials: Arc<Credentials>) -> Self {
        // The TLS stack needs a process-wide crypto provider; a second install is a no-op.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Self {
            credentials,
            insecure,
            clients: Mutex::default(),
            tokens: Mutex::default(),
            dark: Mutex::default(),
        }
    }

    /// The manifest `reference` (a digest or a tag) at `endpoint`. A digest is checked against
    /// the bytes served: a registry or mirror cannot answer with another manifest.
    pub async fn manifest(
        &self,
        endpoint: &Endpoint,
        reference: &str,
    ) -> Result<Manifest, FetchError> {
        let name = endpoint.name();
        if let Some(since) = self.dark_since(&endpoint.host) {
            return Err(FetchError::Unreachable {
                endpoint: name,
                why: format!(
                    "skipped: it did not answer {} s ago",
                    since.elapsed().as_secs()
                ),
            });
        }
        let client = self
            .client(&endpoint.tls)
            .map_err(|why| FetchError::Answer {
                endpoint: name.clone(),
                why,
            })?;
        let schemes: &[&str] = match endpoint.scheme {
            _ if self.insecure.contains(&endpoint.host) => &["http"],
            Scheme::Http => &["http"],
            Scheme::Https => &["https"],
            Scheme::HttpsThenHttp => &["https", "http"],
        };
        // Dropped before an answer (a sizing budget ran out): the endpoint counts as dark.
        let mut waiting = Waiting {
            dark: &self.dark,
            host: &endpoint.host,
            answered: false,
        };
        let mut last = None;
        for scheme in schemes {
            let url = endpoint.manifest_url(scheme, reference);
            match self.get(&client, endpoint, &url).await {
                Ok(response) => {
                    waiting.answered = true;
                    return read(response, &url, reference, &name).await;
                }
                Err(e) => last = Some(format!("GET {url}: {}", super::causes(&e))),
            }
        }
        Err(FetchError::Unreachable {
            endpoint: name,
            why: last.unwrap_or_default(),
        })
    }

    fn dark_since(&self, host: &str) -> Option<Instant> {
        let mut dark = self.dark.lock().expect("dark");
        match dark.get(host) {
            Some(since) if since.elapsed() < DARK_FOR => Some(*since),
            Some(_) => {
                dark.remove(host);
                None
            }
            None => None,
        }
    }

    /// The client for these TLS settings (built once).
    fn client(&self, tls: &Tls) -> Result<reqwest::Client, String> {
        if let Some(client) = self.clients.lock().expect("clients").get(tls) {
            return Ok(client.clone());
        }
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .tls_danger_accept_invalid_certs(tls.skip_verify);
        for file in &tls.ca {
            let pem = std::fs::read(file)
                .map_err(|e| format!("CA certificate {}: {e}", file.display()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("CA certificate {}: {e}", file.display()))?;
            builder = builder.tls_certs_merge(certs);
        }
        let client = builder
            .build()
            .map_err(|e| format!("HTTP client: {}", super::causes(&e)))?;
        self.clients
            .lock()
            .expect("clients")
            .insert(tls.clone(), client.clone());
        Ok(client)
    }

    /// GET with the token this endpoint and repository last got; on a challenge, authenticate
    /// as asked and ask again once. Transport errors only: statuses are the caller's to read.
    async fn get(
        &self,
        client: &reqwest::Client,
        endpoint: &Endpoint,
        url: &str,
    ) -> Result<reqwest::Response, reqwest::Error> {
        let key = (endpoint.host.clone(), endpoint.repository.clone());
        let request = || {
            client
                .get(url)
                .header(reqwest::header::ACCEPT, MANIFEST_TYPES.join(", "))
        };
        let token = self.tokens.lock().expect("tokens").get(&key).cloned();
        let first = match &token {
            Some(token) => request().bearer_auth(token),
            None => request(),
        };
        let response = first.send().await?;
        if response.status() != reqwest::StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        let credential = self
            .credentials
            .lookup(&endpoint.auth_host, &endpoint.repository)
            .cloned();
        match challenge(&response) {
            Some(Challenge::Bearer {
                realm,
                service,
                scope,
            }) => {
                let scope =
                    scope.unwrap_or_else(|| format!("repository:{}:pull", endpoint.repository));
                let mut ask = client.get(&realm).query(&[("scope", scope.as_str())]);
                if let Some(service) = &service {
                    ask = ask.query(&[("service", service.as_str())]);
                }
                if let Some(c) = &credential {
                    ask = ask.basic_auth(&c.username, Some(&c.password));
                }
                let Some(token) = token_of(ask.send().await?).await else {
                    return Ok(response);
                };
                self.tokens
                    .lock()
                    .expect("tokens")
                    .insert(key, token.clone());
                request().bearer_auth(token).send().await
            }
            Some(Challenge::Basic) if credential.is_some() => {
                let c = credential.expect("checked");
                request()
                    .basic_auth(&c.username, Some(&c.password))
                    .send()
                    .await
            }
            _ => Ok(response),
        }
    }
}

/// The token of a token service's answer (`token` or `access_token`), if it gave one.
async fn token_of(answer: reqwest::Response) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Token {
        token: Option<String>,
        access_token: Option<String>,
    }
    if !answer.status().is_success() {
        return None;
    }
    let token: Token = answer.json().await.ok()?;
    token.token.or(token.access_token).filter(|t| !t.is_empty())
}

/// A request under way to `host`: unless it is answered, the host is dark from its end (a
/// failure, or the request dropped by a deadline).
struct Waiting<'a> {
    dark: &'a Mutex<HashMap<String, Instant>>,
    host: &'a str,
    answered: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.answered
            && let Ok(mut dark) = self.dark.lock()
        {
            dark.insert(self.host.to_string(), Instant::now());
        }
    }
}

/// The first challenge of a 401 answer.
fn challenge(response: &reqwest::Response) -> Option<Challenge> {
    let header = response
        .headers()
        .get(reqwest::header::WWW_AUTHENTICATE)?
        .to_str()
        .ok()?;
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

/// The manifest of an answer: a success, within the size limit, with the digest asked for.
async fn read(
    response: reqwest::Response,
    url: &str,
    reference: &str,
    endpoint: &str,
) -> Result<Manifest, FetchError> {
    let answer = |why: String| FetchError::Answer {
        endpoint: endpoint.to_string(),
        why: format!("GET {url}: {why}"),
    };
    let status = response.status();
    if !status.is_success() {
        return Err(answer(status.to_string()));
    }
    if response
        .content_length()
        .is_some_and(|n| n > MAX_MANIFEST_BYTES as u64)
    {
        return Err(answer(format!(
            "a manifest over {MAX_MANIFEST_BYTES} bytes"
        )));
    }
    let body = response
        .bytes()
        .await
        .map_err(|e| answer(super::causes(&e)))?;
    if body.len() > MAX_MANIFEST_BYTES {
        return Err(answer(format!(
            "a manifest over {MAX_MANIFEST_BYTES} bytes"
        )));
    }
    // The digest is the manifest's identity: a registry cannot answer with another one.
    let digest = format!("sha256:{:x}", <sha2::Sha256 as sha2::Digest>::digest(&body));
    if reference.starts_with("sha256:") && digest != reference {
        return Err(answer(format!(
            "the manifest's digest is {digest}, not the one asked for"
        )));
    }
    Ok(Manifest {
        body: body.to_vec(),
        digest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(addr: &str) -> Endpoint {
        let mut e = Endpoint::source(addr, "a/b");
        e.scheme = Scheme::Http;
        e
    }

    const D: &str = "sha256:86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504";

    #[tokio::test]
    async fn an_unreachable_endpoint_is_named_with_the_cause_and_skipped_after() {
        let addr = format!("127.0.0.1:{}", pinset_testkit::free_port());
        let d = Distribution::new(Vec::new(), Arc::default());
        let e = d.manifest(&endpoint(&addr), D).await.unwrap_err();
        assert!(e.unreachable(), "{e}");
        let text = e.to_string();
        assert!(
            text.contains(&format!("GET http://{addr}/v2/a/b/manifests/{D}")),
            "{text}"
        );
        assert!(text.to_lowercase().contains("refused"), "{text}");
        let again = d.manifest(&endpoint(&addr), D).await.unwrap_err();
        assert!(
            again.to_string().contains("skipped: it did not answer"),
            "{again}"
        );
    }

    /// A port that accepts and never answers, and a request given up by its caller's deadline:
    /// the endpoint is skipped after, so a dark registry costs one deadline, not one per round.
    #[tokio::test]
    async fn a_request_given_up_unanswered_makes_its_endpoint_dark() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let d = Distribution::new(Vec::new(), Arc::default());
        let dark = endpoint(&addr);
        let asked = d.manifest(&dark, D);
        let given_up = tokio::time::timeout(Duration::from_millis(300), asked).await;
        assert!(given_up.is_err(), "the port never answers");
        let e = d.manifest(&endpoint(&addr), D).await.unwrap_err();
        assert!(e.unreachable() && e.to_string().contains("skipped"), "{e}");
        drop(listener);
    }

    #[tokio::test]
    async fn a_manifest_that_is_not_the_digest_asked_for_is_refused() {
        let addr = pinset_testkit::answering(
            "200 OK",
            "application/vnd.oci.image.manifest.v1+json",
            r#"{"schemaVersion":2,"layers":[]}"#,
        );
        let d = Distribution::new(Vec::new(), Arc::default());
        let e = d.manifest(&endpoint(&addr), D).await.unwrap_err();
        assert!(!e.unreachable());
        assert!(
            e.to_string().contains("the manifest's digest is sha256:"),
            "{e}"
        );
        // By tag, the digest is the bytes'.
        let m = d.manifest(&endpoint(&addr), "v1").await.unwrap();
        assert_eq!(m.digest.len(), 71);
    }

    #[tokio::test]
    async fn an_error_status_is_an_answer_not_a_dark_endpoint() {
        let addr = pinset_testkit::answering("500 Internal Server Error", "text/plain", "");
        let d = Distribution::new(Vec::new(), Arc::default());
        let e = d.manifest(&endpoint(&addr), D).await.unwrap_err();
        assert!(!e.unreachable() && e.to_string().contains("500"), "{e}");
        let again = d.manifest(&endpoint(&addr), D).await.unwrap_err();
        assert!(again.to_string().contains("500"), "asked again: {again}");
    }

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
}
