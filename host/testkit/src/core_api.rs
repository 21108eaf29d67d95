//! The core API's Nodes for tests, in front of the test API server (which serves none): an
//! HTTPS endpoint on loopback, with the server's own certificate, that answers `/api/v1/nodes` —
//! get, list and watch, a field selector on `metadata.name` honoured, and JSON merge patches
//! (the resource version they name checked) — from Nodes a test writes
//! ([`CoreApi::apply`]), and forwards every other request to the real API server as one client's
//! identity (kube's [`kube::Client::send`]). Node requests are decided by the bed's RBAC
//! authorizer, as the real server decides the rest; each decision is recorded with the others.
//!
//! A component pointed at it (its kubeconfig naming this URL instead, [`CoreApi::kubeconfig`])
//! runs as in a cluster, over TLS: its Node from the API, watched, everything else from the real
//! server.

use crate::rbac::{Authorizer, Request as Review};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

/// The largest request body forwarded (the API server's own limit is 3 MiB).
const REQUEST_LIMIT: usize = 3 << 20;

/// The endpoint; it serves until the test's runtime ends.
pub struct CoreApi {
    pub url: String,
    pub addr: std::net::SocketAddr,
    /// The real server's URL, which the identity's kubeconfig names.
    upstream_url: String,
    state: Arc<State>,
}

/// Who the forwarded requests are sent as, and who decides the Node requests.
pub struct Identity {
    /// A client of the real API server with the identity's credentials.
    pub upstream: kube::Client,
    pub user: String,
    pub groups: Vec<String>,
    /// Decides the Node requests; `None`: every one is allowed, as by a server without one.
    pub authorizer: Option<Authorizer>,
}

struct State {
    identity: Identity,
    nodes: Mutex<Nodes>,
    events: broadcast::Sender<Change>,
    /// The statuses the next patches fail with ([`CoreApi::fail_patches`]).
    failing_patches: Mutex<std::collections::VecDeque<StatusCode>>,
}

/// The Nodes, their resource version, and every change (what a watch from a version replays).
#[derive(Default)]
struct Nodes {
    version: u64,
    objects: BTreeMap<String, Value>,
    history: Vec<Change>,
}

#[derive(Clone)]
struct Change {
    version: u64,
    kind: &'static str,
    object: Value,
}

impl CoreApi {
    /// Serve on a free loopback port in front of `server`, as `identity`, with the server's
    /// certificate.
    pub async fn start(server: &crate::apiserver::ApiServer, identity: Identity) -> CoreApi {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let url = format!("https://{addr}");
        let tls = tls_acceptor(&server.serving_certificate());
        let state = Arc::new(State {
            identity,
            nodes: Mutex::default(),
            events: broadcast::channel(256).0,
            failing_patches: Default::default(),
        });
        let served = state.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (state, tls) = (served.clone(), tls.clone());
                // As Go's servers do: a watch event is a small write, which Nagle's algorithm
                // would hold for the client's delayed acknowledgement (40-200 ms).
                let _ = stream.set_nodelay(true);
                tokio::spawn(async move {
                    let Ok(stream) = tls.accept(stream).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, std::convert::Infallible>(state.answer(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        CoreApi {
            url,
            addr,
            upstream_url: server.url.clone(),
            state,
        }
    }

    /// Create or replace Node `node` (its uid kept from the one it replaces, else made up): the
    /// watches see it.
    pub fn apply(&self, mut node: Value) {
        let mut nodes = self.state.nodes.lock().unwrap();
        let name = node["metadata"]["name"].as_str().unwrap().to_string();
        let uid = (nodes.objects.get(&name))
            .map(|old| old["metadata"]["uid"].clone())
            .unwrap_or_else(|| {
                json!(format!(
                    "{:08x}-0000-4000-8000-{:012x}",
                    nodes.version + 1,
                    1
                ))
            });
        node["metadata"]["uid"] = uid;
        node["apiVersion"] = json!("v1");
        node["kind"] = json!("Node");
        self.state.commit(&mut nodes, node);
    }

    /// Fail the next patches of Nodes with these statuses, in turn: `500` as a server in
    /// trouble answers, `409` as for a Node changed since it was read.
    pub fn fail_patches(&self, statuses: &[u16]) {
        let statuses = statuses.iter().map(|s| StatusCode::from_u16(*s).unwrap());
        *self.state.failing_patches.lock().unwrap() = statuses.collect();
    }

    /// Node `name` as served now.
    pub fn node(&self, name: &str) -> Option<Value> {
        self.state.nodes.lock().unwrap().objects.get(name).cloned()
    }

    /// The identity's kubeconfig `identity`, naming this endpoint instead of the real server
    /// (its certificate authority and credentials kept), written as `NAME.kubeconfig` in `dir`.
    pub fn kubeconfig(&self, identity: &Path, dir: &Path, name: &str) -> PathBuf {
        let text = std::fs::read_to_string(identity).unwrap();
        let from = format!("server: {}\n", self.upstream_url);
        assert!(
            text.contains(&from),
            "{} names {}",
            identity.display(),
            self.upstream_url
        );
        let path = dir.join(format!("{name}.kubeconfig"));
        std::fs::write(
            &path,
            text.replace(&from, &format!("server: {}\n", self.url)),
        )
        .unwrap();
        path
    }
}

/// A TLS acceptor with the certificate and key files `(cert, key)`, HTTP/1.1 only.
fn tls_acceptor((cert, key): &(PathBuf, PathBuf)) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<_> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

impl State {
    async fn answer(&self, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path();
        if let Some(name) = path.strip_prefix("/api/v1/nodes/")
            && req.method() == Method::PATCH
        {
            let name = name.to_string();
            return self.patch(&name, req).await;
        }
        if path == "/api/v1/nodes" || path.starts_with("/api/v1/nodes/") {
            return self.nodes(&req);
        }
        match self.forward(req).await {
            Ok(response) => response,
            Err(e) => status(StatusCode::BAD_GATEWAY, "BadGateway", &e.to_string()),
        }
    }

    /// A request to the real server, as the identity; its answer as it streams.
    async fn forward(&self, req: Request<Incoming>) -> Result<Response<Body>, BoxError> {
        let (parts, body) = req.into_parts();
        // A component's request: an object or a patch, never near this bound.
        let bytes = http_body_util::Limited::new(body, REQUEST_LIMIT)
            .collect()
            .await?
            .to_bytes();
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut out = Request::builder().method(parts.method).uri(target);
        for (name, value) in &parts.headers {
            // The endpoint sends as the identity: the client's own credentials (a service
            // account's token) are not the real server's to judge.
            let hop = matches!(name.as_str(), "host" | "connection" | "content-length");
            if !hop && name != http::header::AUTHORIZATION {
                out = out.header(name, value);
            }
        }
        let out = out.body(kube::client::Body::from(bytes))?;
        let response = self.identity.upstream.send(out).await?;
        Ok(response.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed_unsync()))
    }

    fn nodes(&self, req: &Request<Incoming>) -> Response<Body> {
        let name = req.uri().path().strip_prefix("/api/v1/nodes/");
        let query = query(req.uri().query().unwrap_or(""));
        let verb = match (name, query.get("watch").map(String::as_str)) {
            _ if req.method() != Method::GET => {
                return status(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    "nodes are read and merge-patched only here",
                );
            }
            (Some(_), _) => "get",
            (None, Some("true" | "1")) => "watch",
            (None, _) => "list",
        };
        if !self.allowed(verb, name.unwrap_or("")) {
            return self.forbidden(verb, "nodes");
        }
        let selected = query
            .get("fieldSelector")
            .and_then(|s| s.strip_prefix("metadata.name="));
        let nodes = self.nodes.lock().unwrap();
        match (verb, name) {
            ("get", Some(name)) => match nodes.objects.get(name) {
                Some(node) => json_response(node),
                None => status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("nodes \"{name}\" not found"),
                ),
            },
            ("list", _) => {
                let items: Vec<&Value> = nodes
                    .objects
                    .values()
                    .filter(|n| selects(selected, n))
                    .collect();
                let version = nodes.version.to_string();
                let meta = json!({"resourceVersion": version});
                let mut list = json!({"apiVersion": "v1", "kind": "NodeList", "metadata": meta});
                list["items"] = json!(items);
                json_response(&list)
            }
            _ => {
                let from = query
                    .get("resourceVersion")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let selected = selected.map(str::to_string);
                self.watch(&nodes, from, selected)
            }
        }
    }

    /// A JSON merge patch (RFC 7386) of Node `name`, as the API server applies one: refused
    /// with 409 when it names a resource version the Node is no longer at.
    async fn patch(&self, name: &str, req: Request<Incoming>) -> Response<Body> {
        if let Some(refusal) = self.refused_patch(name) {
            return refusal;
        }
        let patch = match merge_patch_of(req).await {
            Ok(patch) => patch,
            Err(refusal) => return refusal,
        };
        let mut nodes = self.nodes.lock().unwrap();
        let Some(node) = nodes.objects.get(name) else {
            let why = format!("nodes \"{name}\" not found");
            return status(StatusCode::NOT_FOUND, "NotFound", &why);
        };
        let at = &patch["metadata"]["resourceVersion"];
        if !at.is_null() && *at != node["metadata"]["resourceVersion"] {
            return conflict(name);
        }
        let mut node = node.clone();
        merge_patch(&mut node, &patch);
        json_response(&self.commit(&mut nodes, node))
    }

    /// `node` stored at the next resource version, and the change sent to the watches: as it
    /// is now served.
    fn commit(&self, nodes: &mut Nodes, mut node: Value) -> Value {
        let name = node["metadata"]["name"].as_str().unwrap().to_string();
        nodes.version += 1;
        node["metadata"]["resourceVersion"] = json!(nodes.version.to_string());
        let kind = match nodes.objects.insert(name, node.clone()) {
            Some(_) => "MODIFIED",
            None => "ADDED",
        };
        let change = Change {
            version: nodes.version,
            kind,
            object: node.clone(),
        };
        nodes.history.push(change.clone());
        let _ = self.events.send(change);
        node
    }

    /// The refusal of a patch of Node `name`: by RBAC, or one of the failures asked for.
    fn refused_patch(&self, name: &str) -> Option<Response<Body>> {
        if !self.allowed("patch", name) {
            return Some(self.forbidden("patch", &format!("nodes \"{name}\"")));
        }
        let failing = self.failing_patches.lock().unwrap().pop_front()?;
        Some(match failing {
            StatusCode::CONFLICT => conflict(name),
            _ => status(failing, "InternalError", "etcdserver: request timed out"),
        })
    }

    /// The API server's 403 for the identity's `verb` on `what` (`nodes`, `nodes "w-0"`).
    fn forbidden(&self, verb: &str, what: &str) -> Response<Body> {
        let user = &self.identity.user;
        let why = format!(
            "{what} is forbidden: User \"{user}\" cannot {verb} resource \"nodes\" in API group \
             \"\" at the cluster scope"
        );
        status(StatusCode::FORBIDDEN, "Forbidden", &why)
    }

    fn allowed(&self, verb: &str, name: &str) -> bool {
        let review = Review {
            user: self.identity.user.clone(),
            groups: self.identity.groups.clone(),
            verb: verb.into(),
            resource: "nodes".into(),
            name: name.into(),
            ..Default::default()
        };
        (self.identity.authorizer.as_ref()).is_none_or(|a| a.decide(review))
    }

    /// The changes after version `from`, then each new one, of the Nodes `selected` names (all
    /// when `None`): one JSON event a line, as the API server streams them.
    fn watch(&self, nodes: &Nodes, from: u64, selected: Option<String>) -> Response<Body> {
        let past: Vec<Change> = nodes
            .history
            .iter()
            .filter(|c| c.version > from)
            .cloned()
            .collect();
        // Subscribed under the lock that the past was read under: no change falls between.
        let live = self.events.subscribe();
        let stream =
            futures::stream::unfold((past.into_iter(), live), move |(mut past, mut live)| {
                let selected = selected.clone();
                async move {
                    loop {
                        let change = match past.next() {
                            Some(c) => c,
                            None => match live.recv().await {
                                Ok(c) => c,
                                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                                Err(broadcast::error::RecvError::Closed) => return None,
                            },
                        };
                        if selects(selected.as_deref(), &change.object) {
                            let mut line =
                                json!({"type": change.kind, "object": change.object}).to_string();
                            line.push('\n');
                            let frame: Result<Frame<Bytes>, BoxError> =
                                Ok(Frame::data(Bytes::from(line)));
                            return Some((frame, (past, live)));
                        }
                    }
                }
            });
        Response::builder()
            .header("content-type", "application/json")
            .body(StreamBody::new(stream).boxed_unsync())
            .unwrap()
    }
}

/// The API server's 409 for a write to Node `name` at a resource version it is no longer at.
fn conflict(name: &str) -> Response<Body> {
    let why = format!(
        "Operation cannot be fulfilled on nodes \"{name}\": the object has been modified; please \
         apply your changes to the latest version and try again"
    );
    status(StatusCode::CONFLICT, "Conflict", &why)
}

/// The JSON merge patch a request carries; any other body is refused (415).
async fn merge_patch_of(req: Request<Incoming>) -> Result<Value, Response<Body>> {
    let merge = req.headers().get(http::header::CONTENT_TYPE)
        == Some(&http::HeaderValue::from_static(
            "application/merge-patch+json",
        ));
    let body = http_body_util::Limited::new(req.into_body(), REQUEST_LIMIT);
    let bytes = body.collect().await.map(|b| b.to_bytes());
    match bytes.map(|b| serde_json::from_slice::<Value>(&b)) {
        Ok(Ok(patch)) if merge => Ok(patch),
        _ => Err(status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            "a JSON merge patch only",
        )),
    }
}

/// `patch` merged into `target` (RFC 7386): an object's members merged in turn, `null`
/// removing one, anything else replacing what was there.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(members) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let object = target.as_object_mut().expect("made an object");
    for (key, value) in members {
        match value {
            Value::Null => {
                object.remove(key);
            }
            _ => merge_patch(object.entry(key.clone()).or_insert(Value::Null), value),
        }
    }
}

fn selects(name: Option<&str>, node: &Value) -> bool {
    name.is_none_or(|n| node["metadata"]["name"] == n)
}

/// A query string's parameters, decoded as kube's client encodes them.
fn query(q: &str) -> BTreeMap<String, String> {
    form_urlencoded::parse(q.as_bytes()).into_owned().collect()
}

fn json_response(value: &Value) -> Response<Body> {
    Response::builder()
        .header("content-type", "application/json")
        .body(full(value.to_string()))
        .unwrap()
}

/// A `Status` answer, as the API server gives for an error.
fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    let body = json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16()
    });
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(full(body.to_string()))
        .unwrap()
}

fn full(text: String) -> Body {
    Full::new(Bytes::from(text))
        .map_err(|e| match e {})
        .boxed_unsync()
}
