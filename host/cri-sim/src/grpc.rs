//! The gRPC side of the simulated runtime: its CRI services routed by hand. The CRI bindings are
//! generated for clients only (pinset is a CRI client; this test runtime is the one server), so
//! each service here is a table from a method's name to the runtime's handler, and one function
//! ([`unary`]) decodes a request, calls the handler and encodes its answer with tonic.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;
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

/// A [`Served`] service as tonic's router serves it.
pub(crate) struct Routed<S>(pub Arc<S>);

impl<S> Clone for Routed<S> {
    fn clone(&self) -> Self {
        Routed(self.0.clone())
    }
}

impl<S: Served> NamedService for Routed<S> {
    const NAME: &'static str = S::NAME;
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
