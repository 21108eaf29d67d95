//! The one reader of everything a registry sends. Every request pinset makes to a registry, a
//! mirror, a token service or the storage a blob is redirected to goes through [`Http::send`],
//! which bounds it in time and in bytes:
//!
//! - an overall deadline per request — connecting, the headers, redirects and the whole body —
//!   so a registry that trickles one byte a second is cut when the deadline passes, not reset at
//!   every read;
//! - a cap per kind of answer ([`crate::limits`]), enforced while streaming: a `Content-Length`
//!   over the cap is refused before any byte is read, and a body without one (chunked, endless)
//!   is refused as soon as it passes the cap. Error bodies are read up to their own cap and cut;
//! - redirects followed (at most [`REDIRECTS`]), never from HTTPS to plain HTTP, and without the
//!   `Authorization` header once they leave the host that was asked.
//!
//! Nothing here reads a body whole before checking it: no library does the reading for pinset.
//!
//! Every request says it is pinset's ([`user_agent`]): a registry tells pre-pull traffic —
//! sizing, tags, release payloads, policy modules — from the runtime's pulls, and can count or
//! limit it (OpenKruise #1155 asks for this). The runtime's own pulls carry the runtime's.

use crate::limits::{CONNECT, ERROR_BODY, Limit, REDIRECTS};
use crate::mirrors::Tls;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
type Client = HyperClient<Connector, Full<Bytes>>;

/// Clients kept, one per TLS setting (a handful: the node's mirror files name them).
const CLIENTS: usize = 32;

/// A request to send.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: Method,
    pub url: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Request {
    pub fn get(url: impl Into<String>) -> Request {
        Request {
            method: Method::GET,
            url: url.into(),
            headers: HeaderMap::new(),
            body: Bytes::new(),
        }
    }

    /// This request with `name: value` set (a value that is not a header value is dropped).
    pub fn header(mut self, name: header::HeaderName, value: &str) -> Request {
        if let Ok(v) = http::HeaderValue::from_str(value) {
            self.headers.insert(name, v);
        }
        self
    }
}

/// An answer, its body read within its cap.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The URL that answered (after redirects).
    pub url: String,
}

impl Answer {
    pub fn header(&self, name: header::HeaderName) -> Option<&str> {
        self.headers.get(name)?.to_str().ok()
    }

    /// The start of the body, as text, for an error message.
    pub fn snippet(&self) -> String {
        let text = String::from_utf8_lossy(&self.body[..self.body.len().min(300)]);
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    }
}

/// Where a successful answer's body goes when it is not kept whole (a layer of hundreds of MiB):
/// each chunk as it arrives, still within the answer's cap and deadline.
pub trait Sink: Send {
    /// Take the next chunk of the body; an error stops the reading and refuses the answer.
    fn take(&mut self, chunk: &[u8]) -> Result<(), String>;
}

/// Why a request got no usable answer. [`HttpError::transient`] tells a registry that is away
/// (worth asking again later) from one that answered something pinset refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// No answer: refused, reset, a TLS failure, a name that does not resolve.
    #[error("{method} {url}: {why}")]
    Unreachable {
        method: String,
        url: String,
        why: String,
    },
    /// The whole request (redirects and body included) took longer than its deadline.
    #[error("{method} {url}: no complete answer within {} s", .after.as_secs_f64())]
    Deadline {
        method: String,
        url: String,
        after: Duration,
    },
    /// The answer is larger than pinset reads for its kind.
    #[error("{method} {url}: the {what} is larger than {max} bytes, the most pinset reads")]
    TooLarge {
        method: String,
        url: String,
        what: &'static str,
        max: u64,
    },
    /// A TLS request answered in plain HTTP: the registry is one without TLS, not marked
    /// insecure (no outage: asking again will not help). The message names the fix.
    #[error("{method} {url}: {why}")]
    PlainHttp {
        method: String,
        url: String,
        why: String,
    },
    /// An answer pinset will not follow (a redirect loop, a downgrade to plain HTTP, a bad URL).
    #[error("{method} {url}: {why}")]
    Refused {
        method: String,
        url: String,
        why: String,
    },
}

impl HttpError {
    /// A registry away or too slow: asking again later may succeed.
    pub fn transient(&self) -> bool {
        matches!(
            self,
            HttpError::Unreachable { .. } | HttpError::Deadline { .. }
        )
    }
}

/// The HTTP side of every registry request: a client per TLS setting, built once.
#[derive(Default)]
pub struct Http {
    clients: Mutex<HashMap<Tls, Client>>,
}

impl Http {
    /// Send `request` and read its answer — the body within `limit` — all within `deadline`.
    pub async fn send(
        &self,
        tls: &Tls,
        request: Request,
        limit: Limit,
        deadline: Duration,
    ) -> Result<Answer, HttpError> {
        self.send_to(tls, request, limit, deadline, None).await
    }

    /// [`Http::send`], a successful answer's body given to `sink` chunk by chunk (the
    /// answer's `body` is then empty) instead of kept.
    pub async fn send_to(
        &self,
        tls: &Tls,
        request: Request,
        limit: Limit,
        deadline: Duration,
        sink: Option<&mut dyn Sink>,
    ) -> Result<Answer, HttpError> {
        let (method, url) = (request.method.to_string(), request.url.clone());
        let started = std::time::Instant::now();
        let followed = self.follow(tls, request, limit, sink);
        let result = match tokio::time::timeout(deadline, followed).await {
            Ok(answer) => answer,
            Err(_) => Err(HttpError::Deadline {
                method: method.clone(),
                url: url.clone(),
                after: deadline,
            }),
        };
        match &result {
            Ok(a) => {
                tracing::debug!(%method, %url, status = a.status.as_u16(), bytes = a.body.len(), took = ?started.elapsed(), "registry answered")
            }
            Err(e) => {
                tracing::debug!(%method, %url, error = %e, took = ?started.elapsed(), "registry request failed")
            }
        }
        result
    }

    /// Send, following redirects; read the final answer's body.
    async fn follow(
        &self,
        tls: &Tls,
        mut request: Request,
        limit: Limit,
        sink: Option<&mut dyn Sink>,
    ) -> Result<Answer, HttpError> {
        let origin = authority(&request.url);
        for _ in 0..=REDIRECTS {
            // A redirect elsewhere is verified against the system's roots only.
            let settings = match authority(&request.url) == origin {
                true => tls.clone(),
                false => Tls::default(),
            };
            let response = self.once(&settings, &request).await?;
            if let Some(next) = redirected(&request, &response)? {
                request = next;
                continue;
            }
            return read(response, &request, limit, sink).await;
        }
        Err(refused(
            &request,
            format!("more than {REDIRECTS} redirects"),
        ))
    }

    /// One request, headers only.
    async fn once(
        &self,
        tls: &Tls,
        request: &Request,
    ) -> Result<hyper::Response<hyper::body::Incoming>, HttpError> {
        let client = self.client(tls).map_err(|why| refused(request, why))?;
        let mut builder = hyper::Request::builder()
            .method(request.method.clone())
            .uri(&request.url)
            .header(header::USER_AGENT, user_agent());
        for (name, value) in &request.headers {
            builder = builder.header(name, value);
        }
        let built = builder
            .body(Full::new(request.body.clone()))
            .map_err(|e| refused(request, format!("not a request: {e}")))?;
        client
            .request(built)
            .await
            .map_err(|e| unreachable(request, crate::causes(&e)))
    }

    /// The client for these TLS settings.
    fn client(&self, tls: &Tls) -> Result<Client, String> {
        let mut clients = self.clients.lock().expect("http clients");
        if let Some(client) = clients.get(tls) {
            return Ok(client.clone());
        }
        let config = tls_config(tls)?;
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(CONNECT));
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = HyperClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(4)
            .build(https);
        if clients.len() >= CLIENTS {
            clients.clear();
        }
        clients.insert(tls.clone(), client.clone());
        Ok(client)
    }
}

static COMMAND: OnceLock<String> = OnceLock::new();

/// Name the command this process runs (`agent`, `set from-release`), for [`user_agent`]; once.
pub fn identify(command: &str) {
    let _ = COMMAND.set(format!("pinset/{} ({command})", env!("CARGO_PKG_VERSION")));
}

/// The `User-Agent` of every request: `pinset/VERSION (COMMAND)`, or `pinset/VERSION` before
/// [`identify`].
pub fn user_agent() -> &'static str {
    (COMMAND.get().map(String::as_str)).unwrap_or(concat!("pinset/", env!("CARGO_PKG_VERSION")))
}

/// `scheme://host[:port]` of a URL (empty when it has none).
pub fn authority(url: &str) -> String {
    match url.parse::<Uri>() {
        Ok(uri) => format!(
            "{}://{}",
            uri.scheme_str().unwrap_or(""),
            uri.authority().map(|a| a.as_str()).unwrap_or("")
        ),
        Err(_) => String::new(),
    }
}

fn refused(request: &Request, why: String) -> HttpError {
    HttpError::Refused {
        method: request.method.to_string(),
        url: request.url.clone(),
        why,
    }
}

/// The request a redirect asks for, or `None` when `response` is not one.
fn redirected(
    request: &Request,
    response: &hyper::Response<hyper::body::Incoming>,
) -> Result<Option<Request>, HttpError> {
    let status = response.status();
    if !status.is_redirection() || status == StatusCode::NOT_MODIFIED {
        return Ok(None);
    }
    let location = response
        .headers()
        .get(header::LOCATION)
        .and_then(|l| l.to_str().ok())
        .ok_or_else(|| refused(request, format!("{status} without a Location")))?;
    let url = absolute(&request.url, location);
    if request.url.starts_with("https://") && !url.starts_with("https://") {
        return Err(refused(
            request,
            format!("{status} to {url}: a redirect from HTTPS to plain HTTP is not followed"),
        ));
    }
    let mut next = request.clone();
    if authority(&url) != authority(&request.url) {
        next.headers.remove(header::AUTHORIZATION);
    }
    if status == StatusCode::SEE_OTHER {
        next.method = Method::GET;
        next.body = Bytes::new();
    }
    next.url = url;
    Ok(Some(next))
}

/// `location` made absolute against `base` (absolute, or a path on the same host).
fn absolute(base: &str, location: &str) -> String {
    if location.contains("://") {
        location.to_string()
    } else if location.starts_with('/') {
        format!("{}{location}", authority(base))
    } else {
        let dir = base.rsplit_once('/').map_or(base, |(dir, _)| dir);
        format!("{dir}/{location}")
    }
}

/// The answer with its body: a success within `limit` (given to `sink` when there is one),
/// anything else cut at its own cap.
async fn read(
    response: hyper::Response<hyper::body::Incoming>,
    request: &Request,
    limit: Limit,
    mut sink: Option<&mut dyn Sink>,
) -> Result<Answer, HttpError> {
    let (parts, mut body) = response.into_parts();
    let success = parts.status.is_success();
    let cap = if success { limit } else { ERROR_BODY };
    let too_large = || HttpError::TooLarge {
        method: request.method.to_string(),
        url: request.url.clone(),
        what: cap.what,
        max: cap.max_bytes,
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if success && declared.is_some_and(|n| n > cap.max_bytes) {
        return Err(too_large());
    }
    let mut out = BytesMut::new();
    let mut read: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| HttpError::Unreachable {
            method: request.method.to_string(),
            url: request.url.clone(),
            why: format!("reading the answer: {}", crate::causes(&e)),
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if success && let Some(sink) = sink.as_deref_mut() {
            read += data.len() as u64;
            if read > cap.max_bytes {
                return Err(too_large());
            }
            sink.take(&data)
                .map_err(|why| refused(request, format!("its body: {why}")))?;
            continue;
        }
        let room = (cap.max_bytes as usize).saturating_sub(out.len());
        if data.len() > room {
            if success {
                return Err(too_large());
            }
            out.extend_from_slice(&data[..room]);
            break;
        }
        out.extend_from_slice(&data);
    }
    Ok(Answer {
        status: parts.status,
        headers: parts.headers,
        body: out.freeze(),
        url: request.url.clone(),
    })
}

/// The system's trusted roots (`SSL_CERT_FILE` / `SSL_CERT_DIR` honoured), read once.
fn native_roots() -> &'static [rustls::pki_types::CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<rustls::pki_types::CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        if found.certs.is_empty() {
            tracing::warn!(errors = ?found.errors, "no trusted root certificates found: HTTPS registries will be refused");
        }
        found.certs
    })
}

/// The TLS client configuration for `tls`: the system's roots and the extra CA files, or no
/// verification at all (`skip_verify`, `insecure`).
fn tls_config(tls: &Tls) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    if tls.skip_verify {
        let verifier = Arc::new(danger::AcceptAny(provider));
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth());
    }
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(native_roots().iter().cloned());
    for file in &tls.ca {
        let certs: Vec<CertificateDer> = CertificateDer::pem_file_iter(file)
            .and_then(|certs| certs.collect())
            .map_err(|e| format!("CA certificate {}: {e}", file.display()))?;
        if certs.is_empty() {
            return Err(format!("CA certificate {}: no certificate", file.display()));
        }
        roots.add_parsable_certificates(certs);
    }
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

/// `skip_verify`: any certificate is accepted (the handshake's signatures are still checked).
mod danger {
    use rustls::DigitallySignedStruct;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use std::sync::Arc;

    #[derive(Debug)]
    pub struct AcceptAny(pub Arc<CryptoProvider>);

    impl ServerCertVerifier for AcceptAny {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
}

/// A request that got no answer. A registry that answers TLS in plain HTTP is no outage
/// ([`HttpError::PlainHttp`]), named with what marks it insecure.
fn unreachable(request: &Request, why: String) -> HttpError {
    let plain = [
        "InvalidContentType",
        "corrupt message",
        "wrong version number",
    ];
    let host = request
        .url
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.authority().map(|a| a.to_string()));
    match host {
        Some(host) if plain.iter().any(|p| why.contains(p)) => HttpError::PlainHttp {
            method: request.method.to_string(),
            url: request.url.clone(),
            why: format!(
                "{why}: {host} answers in plain HTTP, not TLS; if that registry is meant to be reached so, mark it insecure: {}",
                crate::sources::Sources::fix_for(&host)
            ),
        },
        _ => HttpError::Unreachable {
            method: request.method.to_string(),
            url: request.url.clone(),
            why,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MANIFEST;
    use pinset_testkit::hostile::{Hostile, Misbehaviour};
    use std::time::Instant;

    async fn get(hostile: &Hostile, deadline: Duration) -> Result<Answer, HttpError> {
        let url = format!("http://{}/v2/a/manifests/x", hostile.addr);
        Http::default()
            .send(&Tls::default(), Request::get(url), MANIFEST, deadline)
            .await
    }

    /// A request that must fail: its error, and how long it took to.
    async fn failed(hostile: &Hostile, deadline: Duration) -> (HttpError, Duration) {
        let started = Instant::now();
        let e = get(hostile, deadline).await.unwrap_err();
        (e, started.elapsed())
    }

    #[tokio::test]
    async fn an_endless_body_is_cut_at_its_cap_whatever_its_length_says() {
        for how in [Misbehaviour::EndlessBody, Misbehaviour::HugeLength] {
            let hostile = Hostile::start(how);
            let (e, took) = failed(&hostile, Duration::from_secs(10)).await;
            assert!(
                matches!(e, HttpError::TooLarge { what: "manifest", max, .. } if max == 4 << 20),
                "{e}"
            );
            assert!(!e.transient());
            assert!(took < Duration::from_secs(5), "{took:?}");
        }
    }

    #[tokio::test]
    async fn a_trickle_is_cut_by_the_request_deadline_not_reset_by_each_byte() {
        let hostile = Hostile::start(Misbehaviour::Trickle);
        let (e, took) = failed(&hostile, Duration::from_secs(2)).await;
        assert!(matches!(e, HttpError::Deadline { .. }), "{e}");
        assert!(e.transient());
        assert!(took < Duration::from_secs(3), "{took:?}");
    }

    #[tokio::test]
    async fn a_redirect_loop_is_followed_five_times_then_refused() {
        let hostile = Hostile::start(Misbehaviour::RedirectLoop);
        let e = get(&hostile, Duration::from_secs(10)).await.unwrap_err();
        assert!(e.to_string().contains("more than 5 redirects"), "{e}");
        assert_eq!(hostile.seen().len(), 6);
        // Each one says it is pinset's.
        let agents: Vec<Option<String>> =
            hostile.seen().into_iter().map(|s| s.user_agent).collect();
        let pinset = Some(format!("pinset/{}", env!("CARGO_PKG_VERSION")));
        assert_eq!(agents, vec![pinset; 6]);
    }

    #[test]
    fn redirects_resolve_against_the_url_that_answered() {
        assert_eq!(
            absolute("http://a:1/v2/x/blobs/d", "/store/d"),
            "http://a:1/store/d"
        );
        assert_eq!(
            absolute("http://a:1/v2/x/blobs/d", "https://s3/d?sig"),
            "https://s3/d?sig"
        );
        assert_eq!(authority("https://r.io:5000/v2/"), "https://r.io:5000");
    }
}
