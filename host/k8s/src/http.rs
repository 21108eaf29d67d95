//! The small HTTP endpoint of the long-running commands: `/metrics` (Prometheus text),
//! `/healthz` (the process serves) and `/readyz` (caches synced, work started).

use crate::metrics::Metrics;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Bind `addr` and serve until `shutdown`. Returns the bound address (port 0 picks one).
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    ready: Arc<AtomicBool>,
    shutdown: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
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
            let (metrics, ready) = (metrics.clone(), ready.clone());
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let response = respond(req.uri().path(), &metrics, &ready);
                        async move { Ok::<_, std::convert::Infallible>(response) }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(bound)
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
