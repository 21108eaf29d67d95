//! The gRPC side of the simulated runtime: its CRI services routed by hand. The CRI bindings are
//! generated for clients only (pinset is a CRI client; this test runtime is the one server), so
//! each service here is a table from a method's name to the runtime's handler, one function
//! ([`unary`]) decodes a request, calls the handler and encodes its answer with tonic, and
//! [`serve`] answers HTTP/2 connections with hyper (tonic's own server would bring its router,
//! axum, into the build for two fixed routes).

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::{Request, Response, Status};
use tonic_prost::prost::Message;

/// What a routed answer is.
pub(crate) type Answer = BoxFuture<http::Response<Body>, Infallible>;

/// One CRI service: its gRPC name and its methods.
pub(crate) trait Served: Send + Sync + 'static {
    /// `package.Service`, as a request's path starts with it.
    const NAME: &'static str;
    /// The answer to `method` (the last part of the path), or `None` when there is no such
    /// method.
    fn route(self: Arc<Self>, method: &str, request: http::Request<Body>) -> Option<Answer>;
}

/// A [`Served`] service as a tower service.
pub(crate) struct Routed<S>(pub Arc<S>);

impl<S> Clone for Routed<S> {
    fn clone(&self) -> Self {
        Routed(self.0.clone())
    }
}

impl<S: Served> Service<http::Request<Body>> for Routed<S> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Answer {
        let path = request.uri().path().to_string();
        let method = path.rsplit('/').next().unwrap_or_default();
        match self.0.clone().route(method, request) {
            Some(answer) => answer,
            None => {
                let status = Status::unimplemented(format!("{path}: no such method"));
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

/// The two services of the simulated runtime, each answering the requests under its name.
pub(crate) struct Routes<A, B>(pub Routed<A>, pub Routed<B>);

impl<A: Served, B: Served> Routes<A, B> {
    fn call(&self, request: http::Request<Body>) -> Answer {
        let path = request.uri().path();
        // `/package.Service/Method`
        let service = path.strip_prefix('/').and_then(|p| p.split_once('/'));
        match service.map(|(service, _)| service) {
            Some(service) if service == A::NAME => self.0.clone().call(request),
            Some(service) if service == B::NAME => self.1.clone().call(request),
            _ => {
                let status = Status::unimplemented(format!("{path}: no such service"));
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

/// Answer gRPC (HTTP/2) connections on `listener` with `routes` until `stop` fires or the
/// listener fails; the connections end with it.
pub(crate) async fn serve<A: Served, B: Served>(
    listener: UnixListener,
    routes: Routes<A, B>,
    mut stop: oneshot::Receiver<()>,
) {
    let routes = Arc::new(routes);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let stream = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => return,
            },
        };
        // Connections that ended leave the set here, not only when it is dropped.
        while connections.try_join_next().is_some() {}
        let routes = routes.clone();
        let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
            routes.call(request.map(Body::new))
        });
        connections.spawn(async move {
            let http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
            let _ = http2.serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// One unary call: `request` decoded as `Req`, `handler` asked with `served`, its answer
/// encoded (or its status returned), as tonic's generated servers do.
pub(crate) fn unary<S, Req, Resp, F, Fut>(
    served: Arc<S>,
    request: http::Request<Body>,
    handler: F,
) -> Answer
where
    S: Send + Sync + 'static,
    Req: Message + Default + Send + 'static,
    Resp: Message + Send + 'static,
    F: Fn(Arc<S>, Request<Req>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Response<Resp>, Status>> + Send + 'static,
{
    Box::pin(async move {
        let codec = tonic_prost::ProstCodec::<Resp, Req>::default();
        let mut grpc = tonic::server::Grpc::new(codec);
        Ok(grpc.unary(Handler { served, handler }, request).await)
    })
}

/// A handler with the service it answers for, as tonic calls a unary method.
struct Handler<S, F> {
    served: Arc<S>,
    handler: F,
}

impl<S, Req, Resp, F, Fut> Service<Request<Req>> for Handler<S, F>
where
    F: Fn(Arc<S>, Request<Req>) -> Fut,
    Fut: Future<Output = Result<Response<Resp>, Status>>,
{
    type Response = Response<Resp>;
    type Error = Status;
    type Future = Fut;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Req>) -> Fut {
        (self.handler)(self.served.clone(), request)
    }
}
