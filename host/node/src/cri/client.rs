//! CRI image service client over a unix socket.
//!
//! The channel connects lazily and reconnects by itself after the runtime restarts; every call
//! has its own deadline, and every error names the socket and the call.

use super::proto::{
    self, AuthConfig, FilesystemUsage, ImageFsInfoRequest, ImageSpec, ImageStatusRequest,
    ListImagesRequest, PullImageRequest, RemoveImageRequest, StatusRequest, VersionRequest,
    VersionResponse, image_service_client::ImageServiceClient,
    runtime_service_client::RuntimeServiceClient,
};
use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

pub const DEFAULT_ENDPOINT: &str = "unix:///run/crio/crio.sock";

/// The sockets a node's runtime listens on, probed in this order (as crictl does).
pub const STANDARD_ENDPOINTS: [&str; 2] = [
    "unix:///run/crio/crio.sock",
    "unix:///run/containerd/containerd.sock",
];

/// The first of `candidates` whose socket exists.
pub fn find_endpoint(candidates: &[&str]) -> Result<String, CriError> {
    candidates
        .iter()
        .find(|c| socket_path(c).is_ok_and(|p| p.exists()))
        .map(|c| c.to_string())
        .ok_or_else(|| CriError::NoRuntime {
            tried: candidates.iter().map(|c| c.to_string()).collect(),
        })
}

#[derive(Clone, Debug)]
pub struct CriConfig {
    /// `unix:///path/to.sock` or a plain path.
    pub endpoint: String,
    pub connect_timeout: Duration,
    /// Deadline of the quick calls (list, status, fs info, remove).
    pub call_timeout: Duration,
    /// Deadline of one pull.
    pub pull_timeout: Duration,
}

impl Default for CriConfig {
    fn default() -> Self {
        Self {
            endpoint: DEFAULT_ENDPOINT.into(),
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(30),
            pull_timeout: Duration::from_secs(600),
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum CriError {
    #[error("CRI endpoint {endpoint:?}: only unix:// sockets are supported")]
    Endpoint { endpoint: String },
    #[error("CRI {call} on {socket}: {code:?}: {message}")]
    Call {
        socket: PathBuf,
        call: &'static str,
        code: tonic::Code,
        message: String,
    },
    #[error("no container runtime socket found (tried {tried:?}); name one with --cri")]
    NoRuntime { tried: Vec<String> },
    #[error("CRI {call} on {socket}: no answer within {after:?}")]
    Timeout {
        socket: PathBuf,
        call: &'static str,
        after: Duration,
    },
}

impl CriError {
    /// The runtime ran out of disk: retrying cannot help.
    pub fn is_no_space(&self) -> bool {
        matches!(self, CriError::Call { message, .. } if message.to_ascii_lowercase().contains("no space left on device"))
    }

    /// Trying again cannot help: the image or its manifest does not exist, the reference is
    /// invalid, or the registry refused the request (with the credentials pinset has, or
    /// without any). Judged by the gRPC code and, as runtimes report registry errors as
    /// `Unknown`, by the registry's words in the message.
    pub fn is_permanent(&self) -> bool {
        let CriError::Call { code, message, .. } = self else {
            return false;
        };
        if matches!(
            code,
            tonic::Code::NotFound
                | tonic::Code::InvalidArgument
                | tonic::Code::PermissionDenied
                | tonic::Code::Unauthenticated
        ) {
            return true;
        }
        let m = message.to_ascii_lowercase();
        [
            "manifest unknown",
            ": not found",
            "name unknown",
            "invalid reference format",
            "unauthorized",
            "insufficient_scope",
            "denied:",
        ]
        .iter()
        .any(|w| m.contains(w))
    }

    /// The connection broke under the call (the runtime restarted): the channel reconnects for
    /// the next one.
    pub fn is_broken_connection(&self) -> bool {
        matches!(self, CriError::Call { code, message, .. }
            if *code == tonic::Code::Unavailable
                || (*code == tonic::Code::Unknown && message.contains("transport error")))
    }

    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            CriError::Call {
                code: tonic::Code::NotFound,
                ..
            }
        )
    }
}

/// A CRI image service client. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct CriClient {
    socket: PathBuf,
    config: CriConfig,
    inner: ImageServiceClient<Channel>,
    runtime: RuntimeServiceClient<Channel>,
}

impl CriClient {
    /// A client that connects on first use and reconnects when the connection breaks.
    pub fn new(config: CriConfig) -> Result<Self, CriError> {
        let socket = socket_path(&config.endpoint)?;
        let channel = unix_channel(&socket, config.connect_timeout);
        let inner = ImageServiceClient::new(channel.clone()).max_decoding_message_size(64 << 20);
        Ok(Self {
            socket,
            config,
            inner,
            runtime: RuntimeServiceClient::new(channel),
        })
    }

    /// The runtime's name and version (`runtime_name`: `cri-o`, `containerd`).
    pub async fn version(&self) -> Result<VersionResponse, CriError> {
        let v1 = |mut c: RuntimeServiceClient<Channel>| async move {
            c.version(VersionRequest {
                version: "v1".into(),
            })
            .await
        };
        self.read("Version", &self.runtime, v1).await
    }

    /// The directory of `hosts.toml` files the runtime reports it reads (containerd's CRI
    /// `Status` with `verbose`: `registry.configPath` of a JSON `info` entry); `None` when it
    /// reports none (CRI-O, containerd without `config_path`) or cannot be asked.
    pub async fn registry_config_path(&self) -> Option<PathBuf> {
        let mut c = self.runtime.clone();
        let info = self
            .call(
                "Status",
                self.config.call_timeout,
                c.status(StatusRequest { verbose: true }),
            )
            .await
            .inspect_err(|e| tracing::debug!(error = %e, "the runtime's configuration is unknown"))
            .ok()?
            .info;
        info.values().find_map(|json| {
            let value: serde_json::Value = serde_json::from_str(json).ok()?;
            let path = value.pointer("/registry/configPath")?.as_str()?;
            (!path.is_empty()).then(|| PathBuf::from(path))
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn call<T>(
        &self,
        call: &'static str,
        after: Duration,
        fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CriError> {
        match tokio::time::timeout(after, fut).await {
            Err(_) => Err(CriError::Timeout {
                socket: self.socket.clone(),
                call,
                after,
            }),
            Ok(Err(status)) => Err(CriError::Call {
                socket: self.socket.clone(),
                call,
                code: status.code(),
                message: status.message().to_string(),
            }),
            Ok(Ok(response)) => Ok(response.into_inner()),
        }
    }

    /// A read: `ask` on a clone of `client`, within the call timeout, asked again once when the
    /// connection had broken ([`read_again_once`]).
    async fn read<C, T, Fut>(
        &self,
        call: &'static str,
        client: &C,
        ask: impl Fn(C) -> Fut,
    ) -> Result<T, CriError>
    where
        C: Clone,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let once = || self.call(call, self.config.call_timeout, ask(client.clone()));
        read_again_once(once).await
    }

    /// Every image in the runtime's store: one call, however many images.
    pub async fn list_images(&self) -> Result<Vec<proto::Image>, CriError> {
        let listed = self.read("ListImages", &self.inner, |mut c| async move {
            c.list_images(ListImagesRequest { filter: None }).await
        });
        Ok(listed.await?.images)
    }

    /// One image's status; `None` when it is not present.
    pub async fn image_status(&self, image: &str) -> Result<Option<proto::Image>, CriError> {
        let mut c = self.inner.clone();
        let req = ImageStatusRequest {
            image: Some(spec(image)),
            verbose: false,
        };
        let r = self
            .call("ImageStatus", self.config.call_timeout, c.image_status(req))
            .await?;
        Ok(r.image)
    }

    /// Pull `image`; returns the runtime's image reference (its id).
    pub async fn pull_image(
        &self,
        image: &str,
        auth: Option<AuthConfig>,
    ) -> Result<String, CriError> {
        let mut c = self.inner.clone();
        let req = PullImageRequest {
            image: Some(spec(image)),
            auth,
            sandbox_config: None,
        };
        let r = self
            .call("PullImage", self.config.pull_timeout, c.pull_image(req))
            .await?;
        Ok(r.image_ref)
    }

    pub async fn remove_image(&self, image: &str) -> Result<(), CriError> {
        let mut c = self.inner.clone();
        let req = RemoveImageRequest {
            image: Some(spec(image)),
        };
        self.call("RemoveImage", self.config.call_timeout, c.remove_image(req))
            .await?;
        Ok(())
    }

    /// Usage of the filesystems that hold images.
    pub async fn image_fs_info(&self) -> Result<Vec<FilesystemUsage>, CriError> {
        let info = self.read("ImageFsInfo", &self.inner, |mut c| async move {
            c.image_fs_info(ImageFsInfoRequest {}).await
        });
        Ok(info.await?.image_filesystems)
    }
}

/// A read asked again, once, when it failed on a connection the runtime closed (it restarted):
/// the channel has reconnected by then. Reads change nothing, so asking twice is safe.
async fn read_again_once<T, F, Fut>(ask: F) -> Result<T, CriError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, CriError>>,
{
    match ask().await {
        Err(e) if e.is_broken_connection() => ask().await,
        other => other,
    }
}

/// A gRPC channel to a unix socket that connects on first use and reconnects when the connection
/// breaks.
pub fn unix_channel(socket: &Path, connect_timeout: Duration) -> Channel {
    let path = socket.to_path_buf();
    // The URI is required by the HTTP/2 layer but never resolved: the connector always dials
    // the unix socket.
    Endpoint::from_static("http://unix.invalid")
        .connect_timeout(connect_timeout)
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
}

fn spec(image: &str) -> ImageSpec {
    ImageSpec {
        image: image.to_string(),
        ..Default::default()
    }
}

pub fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    if let Some(path) = endpoint.strip_prefix("unix://") {
        if path.starts_with('/') {
            return Ok(PathBuf::from(path));
        }
    } else if endpoint.starts_with('/') {
        return Ok(PathBuf::from(endpoint));
    }
    Err(CriError::Endpoint {
        endpoint: endpoint.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            socket_path("unix:///run/crio/crio.sock").unwrap(),
            PathBuf::from("/run/crio/crio.sock")
        );
        assert_eq!(
            socket_path("/tmp/x.sock").unwrap(),
            PathBuf::from("/tmp/x.sock")
        );
        assert!(socket_path("tcp://127.0.0.1:1").is_err());
        assert!(socket_path("unix://relative").is_err());
    }

    #[test]
    fn no_space_is_recognised() {
        let e = CriError::Call {
            socket: "/s".into(),
            call: "PullImage",
            code: tonic::Code::Unknown,
            message: "write /var/lib/x: No space left on device".into(),
        };
        assert!(e.is_no_space());
        assert!(e.to_string().contains("PullImage on /s"));
    }

    #[test]
    fn the_first_standard_socket_that_exists_is_the_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let crio = dir.path().join("crio.sock");
        let containerd = dir.path().join("containerd.sock");
        let candidates = [
            format!("unix://{}", crio.display()),
            format!("unix://{}", containerd.display()),
        ];
        let c: Vec<&str> = candidates.iter().map(String::as_str).collect();
        let e = find_endpoint(&c).unwrap_err().to_string();
        assert!(
            e.contains("crio.sock") && e.contains("containerd.sock") && e.contains("--cri"),
            "{e}"
        );
        let _listener = std::os::unix::net::UnixListener::bind(&containerd).unwrap();
        assert_eq!(find_endpoint(&c).unwrap(), candidates[1]);
        let _other = std::os::unix::net::UnixListener::bind(&crio).unwrap();
        assert_eq!(
            find_endpoint(&c).unwrap(),
            candidates[0],
            "CRI-O first, as crictl"
        );
    }

    #[test]
    fn permanent_pull_errors_are_told_from_transient_ones() {
        let call = |code, message: &str| CriError::Call {
            socket: "/s".into(),
            call: "PullImage",
            code,
            message: message.into(),
        };
        for permanent in [
            call(tonic::Code::NotFound, "image not found"),
            call(
                tonic::Code::Unknown,
                "failed to pull and unpack image \"r/a@sha256:00\": failed to resolve reference \"r/a@sha256:00\": r/a@sha256:00: not found",
            ),
            call(tonic::Code::Unknown, "manifest unknown: manifest unknown"),
            call(
                tonic::Code::Unknown,
                "pulling from host r: 401 Unauthorized",
            ),
            call(tonic::Code::InvalidArgument, "invalid reference format"),
        ] {
            assert!(permanent.is_permanent(), "{permanent}");
        }
        for transient in [
            call(tonic::Code::Unavailable, "connection refused"),
            call(tonic::Code::Unknown, "unexpected EOF"),
            call(tonic::Code::Unknown, "503 Service Unavailable"),
            call(tonic::Code::Unknown, "429 Too Many Requests"),
        ] {
            assert!(!transient.is_permanent(), "{transient}");
        }
        let timeout = CriError::Timeout {
            socket: "/s".into(),
            call: "PullImage",
            after: Duration::from_secs(1),
        };
        assert!(!timeout.is_permanent());
    }
}
