//! The small HTTP endpoint of the long-running commands: `/metrics` (Prometheus text),
//! `/healthz` (the process serves) and `/readyz` (caches synced, work started).

use crate::metrics::Metrics;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// The most a connection buffers of a request: a GET of a path and a few headers fits in it.
pub const MAX_REQUEST_BUFFER: usize = 16 << 10;

/// What one peer can take of the endpoint. It is reachable from the pod network: a client that
/// opens connections and sends nothing, or sends a byte a minute, must cost the process neither
/// its memory nor its descriptors, nor the probes their answers.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Connections served at once (Prometheus and the kubelet's probes hold one or two); one
    /// more is closed as it is accepted. With [`MAX_REQUEST_BUFFER`] each, the most they hold
    /// is 8 MiB; a peer needs that many sockets, each renewed every `header_timeout`, to keep a
    /// probe out.
    pub connections: usize,
    /// A request's headers must arrive within this, the wait for the next request on a kept
    /// connection included: an idle or trickling client is cut.
    pub header_timeout: Duration,
    /// A connection lasts at most this long, whatever it does (a scrape takes milliseconds).
    pub connection_deadline: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            connections: 512,
            header_timeout: Duration::from_secs(5),
            connection_deadline: Duration::from_secs(60),
        }
    }
}

/// Bind `addr` and serve until `shutdown`, within the default [`Bounds`]. Returns the bound
/// address (port 0 picks one).
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    ready: Arc<AtomicBool>,
    shutdown: CancellationToken,
) -> std::io::Result<SocketAddr> {
    serve_within(addr, metrics, ready, shutdown, Bounds::default()).await
}

/// [`serve`] within `bounds`.
pub async fn serve_within(
    addr: SocketAddr,
    metrics: Metrics,
    ready: Arc<AtomicBool>,
    shutdown: CancellationToken,
    bounds: Bounds,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let slots = Arc::new(Semaphore::new(bounds.connections));
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics endpoint: accept failed");
                        continue;
                    }
                },
            };
            // Over the bound: closed at once (dropped), never queued.
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                continue;
            };
            let (metrics, ready) = (metrics.clone(), ready.clone());
            tokio::spawn(async move {
                let _slot = slot;
                let _ = tokio::time::timeout(
                    bounds.connection_deadline,
                    connection(stream, metrics, ready, bounds.header_timeout),
                )
                .await;
            });
        }
    });
    Ok(bound)
}

/// Serve one connection: its requests answered until it closes or its headers are late.
async fn connection(
    stream: TcpStream,
    metrics: Metrics,
    ready: Arc<AtomicBool>,
    header_timeout: Duration,
) {
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let response = respond(req.uri().path(), &metrics, &ready);
        async move { Ok::<_, std::convert::Infallible>(response) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(MAX_REQUEST_BUFFER)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

fn respond(path: &str, metrics: &Metrics, ready: &AtomicBool) -> Response<Full<Bytes>> {
    let (code, content_type, body) = match path {
        "/metrics" => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        "/healthz" | "/livez" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        "/readyz" if ready.load(Ordering::Relaxed) => {
            (StatusCode::OK, "text/plain", "ready\n".to_string())
        }
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready: caches not synced yet\n".to_string(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_string(),
        ),
    };
    Response::builder()
        .status(code)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("a static response builds")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Whether the server closed `stream` (EOF or reset) within `within`, reading what it sent.
    async fn closed(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
        let mut got = Vec::new();
        let read = tokio::time::timeout(within, stream.read_to_end(&mut got)).await;
        read.is_ok().then_some(got)
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let got = closed(&mut s, Duration::from_secs(10))
            .await
            .expect("answered");
        String::from_utf8_lossy(&got).into_owned()
    }

    /// Idle and trickling peers hold a connection at most the header timeout, one over the
    /// bound is closed as accepted, and the probes are answered once they are gone.
    #[tokio::test]
    async fn a_peer_cannot_hold_the_endpoint() {
        let bounds = Bounds {
            connections: 3,
            header_timeout: Duration::from_millis(300),
            connection_deadline: Duration::from_secs(30),
        };
        let ready = Arc::new(AtomicBool::new(true));
        let shutdown = CancellationToken::new();
        let any = "127.0.0.1:0".parse().unwrap();
        let addr = serve_within(any, Metrics::new(), ready, shutdown.clone(), bounds)
            .await
            .unwrap();
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        let mut idle = TcpStream::connect(addr).await.unwrap();
        let mut trickling = TcpStream::connect(addr).await.unwrap();
        trickling
            .write_all(b"GET /metrics HTTP/1.1\r\n")
            .await
            .unwrap();
        let mut third = TcpStream::connect(addr).await.unwrap();
        let mut over = TcpStream::connect(addr).await.unwrap();
        let none = Duration::from_secs(10);
        assert_eq!(
            closed(&mut over, none).await,
            Some(vec![]),
            "over the bound"
        );
        for (what, s) in [("idle", &mut idle), ("trickling", &mut trickling)] {
            assert!(
                closed(s, none).await.is_some(),
                "{what}: cut at the header timeout"
            );
        }
        assert!(closed(&mut third, none).await.is_some());
        let mut huge = TcpStream::connect(addr).await.unwrap();
        let header = format!(
            "GET / HTTP/1.1\r\nx: {}\r\n",
            "a".repeat(MAX_REQUEST_BUFFER)
        );
        let _ = huge.write_all(header.as_bytes()).await;
        let answer = closed(&mut huge, none).await.expect("refused");
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
            "{answer}"
        );
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        shutdown.cancel();
    }

    #[test]
    fn endpoints() {
        let metrics = Metrics::new();
        metrics.count_api_write("pool_spec");
        let ready = AtomicBool::new(false);
        assert_eq!(
            respond("/healthz", &metrics, &ready).status(),
            StatusCode::OK
        );
        assert_eq!(
            respond("/readyz", &metrics, &ready).status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready before the caches are synced"
        );
        ready.store(true, Ordering::Relaxed);
        assert_eq!(
            respond("/readyz", &metrics, &ready).status(),
            StatusCode::OK
        );
        let m = respond("/metrics", &metrics, &ready);
        assert_eq!(m.status(), StatusCode::OK);
        assert!(
            m.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/openmetrics-text")
        );
        assert_eq!(
            respond("/nope", &metrics, &ready).status(),
            StatusCode::NOT_FOUND
        );
    }
}
