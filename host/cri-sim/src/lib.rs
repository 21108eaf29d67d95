//! An in-process CRI image service: a real gRPC server on a unix socket, simulating a registry
//! (images with sizes, pulled at a given bandwidth) and a disk of a given size.
//!
//! It serves `pinset demo` and the tests that need faults a real runtime cannot be asked for:
//! injected pull errors, pulls that hang until cancelled, a full disk. It records every call and
//! every pull, including pulls abandoned by the client, and reports `pinned` for images matched
//! by a CRI-O pin drop-in when given one, as CRI-O does after a reload.
//!
//! May depend on: `pinset-node` for the CRI protocol and the drop-in format it serves, tokio,
//! tonic. Nothing of pinset depends on it but the `pinset` binary (`pinset demo`) and tests.

use pinset_node::cri::proto::{
    self, FilesystemIdentifier, FilesystemUsage, ImageFsInfoRequest, ImageFsInfoResponse,
    ImageStatusRequest, ImageStatusResponse, ListImagesRequest, ListImagesResponse,
    PullImageRequest, PullImageResponse, RemoveImageRequest, RemoveImageResponse, StatusRequest,
    StatusResponse, UInt64Value, VersionRequest, VersionResponse,
};
use pinset_node::pin::crio;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

mod grpc;
use grpc::{Answer, Routed, Routes, Served, unary};
use tonic::codegen::http;

/// The pins of a drop-in: exact names, and glob patterns.
#[derive(Default)]
struct Patterns {
    exact: std::collections::HashSet<String>,
    globs: Vec<String>,
}

/// An image the simulated registry can serve.
#[derive(Clone, Debug)]
pub struct SimImage {
    pub reference: String,
    pub size: u64,
}

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub registry: Vec<SimImage>,
    /// Bytes per second of one pull.
    pub bandwidth: u64,
    /// Size of the image filesystem.
    pub disk_capacity: u64,
    /// A CRI-O drop-in whose `pinned_images` patterns decide `Image.pinned`.
    pub pin_drop_in: Option<PathBuf>,
}

impl SimConfig {
    /// A registry of `references`, `size` bytes each, pulled at 1 GiB/s onto a 1 TiB disk, pins
    /// read from the CRI-O drop-in at `pin_drop_in`.
    pub fn uniform(references: &[String], size: u64, pin_drop_in: PathBuf) -> Self {
        Self {
            registry: references
                .iter()
                .map(|r| SimImage {
                    reference: r.clone(),
                    size,
                })
                .collect(),
            bandwidth: 1 << 30,
            disk_capacity: 1 << 40,
            pin_drop_in: Some(pin_drop_in),
        }
    }
}

/// A scripted fault for the next pull(s) of one image.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Fail with this gRPC code and message.
    Fail(tonic::Code, String),
    /// Never finish (until the client abandons the call).
    Hang,
}

#[derive(Clone, Debug)]
pub struct PullRecord {
    pub reference: String,
    pub started: Instant,
    pub ended: Option<Instant>,
    /// `None` while running or when abandoned; `Some(Ok)` pulled; `Some(Err)` failed.
    pub result: Option<Result<(), String>>,
    /// The client went away before the pull ended.
    pub abandoned: bool,
}

#[derive(Clone, Debug, Default)]
pub struct SimStats {
    pub calls: BTreeMap<&'static str, u64>,
    pub in_flight: u32,
    pub max_in_flight: u32,
    pub pulls: Vec<PullRecord>,
}

impl SimStats {
    pub fn calls(&self, name: &str) -> u64 {
        self.calls.get(name).copied().unwrap_or(0)
    }
}

struct Stored {
    id: String,
    reference: String,
    size: u64,
}

#[derive(Default)]
struct State {
    store: BTreeMap<String, Stored>,
    used: u64,
    faults: HashMap<String, VecDeque<Fault>>,
    stats: SimStats,
}

struct Shared {
    config: SimConfig,
    registry: HashMap<String, u64>,
    state: Mutex<State>,
    /// The drop-in as last parsed, by the file's identity (inode, modification time, length):
    /// read again when it changes, as CRI-O re-reads it on reload — not on every call.
    pins: Mutex<Option<(FileStamp, Arc<Patterns>)>>,
}

/// What tells one version of a file from another.
type FileStamp = (u64, Option<std::time::SystemTime>, u64);

/// The simulated runtime. Cheap to clone.
#[derive(Clone)]
pub struct SimulatedRuntime {
    shared: Arc<Shared>,
}

fn image_id(reference: &str) -> String {
    reference
        .rsplit_once('@')
        .map_or_else(|| reference.to_string(), |(_, d)| d.to_string())
}

impl SimulatedRuntime {
    pub fn new(config: SimConfig) -> Self {
        let registry = config
            .registry
            .iter()
            .map(|i| (i.reference.clone(), i.size))
            .collect();
        Self {
            shared: Arc::new(Shared {
                config,
                registry,
                state: Mutex::new(State::default()),
                pins: Mutex::new(None),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().expect("sim state lock")
    }

    /// Put an image in the store as if pulled earlier.
    pub fn preload(&self, reference: &str) {
        let size = self.shared.registry.get(reference).copied().unwrap_or(0);
        let mut st = self.state();
        st.used += size;
        st.store.insert(
            reference.to_string(),
            Stored {
                id: image_id(reference),
                reference: reference.into(),
                size,
            },
        );
    }

    /// The next pulls of `reference` meet these faults, in order.
    pub fn inject(&self, reference: &str, faults: impl IntoIterator<Item = Fault>) {
        self.state()
            .faults
            .entry(reference.to_string())
            .or_default()
            .extend(faults);
    }

    pub fn stats(&self) -> SimStats {
        self.state().stats.clone()
    }

    pub fn reset_stats(&self) {
        self.state().stats = SimStats::default();
    }

    pub fn used_bytes(&self) -> u64 {
        self.state().used
    }

    fn count(&self, call: &'static str) {
        *self.state().stats.calls.entry(call).or_default() += 1;
    }

    fn pinned_patterns(&self) -> Arc<Patterns> {
        let Some(path) = &self.shared.config.pin_drop_in else {
            return Arc::default();
        };
        use std::os::unix::fs::MetadataExt;
        let stamp: FileStamp = match std::fs::metadata(path) {
            Ok(m) => (m.ino(), m.modified().ok(), m.len()),
            Err(_) => return Arc::default(),
        };
        let mut cache = self.shared.pins.lock().expect("pin cache");
        if let Some((seen, patterns)) = cache.as_ref()
            && *seen == stamp
        {
            return patterns.clone();
        }
        let patterns = Arc::new(Self::parse_patterns(path));
        *cache = Some((stamp, patterns.clone()));
        patterns
    }

    fn parse_patterns(path: &Path) -> Patterns {
        let all = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| crio::parse(&s).ok())
            .unwrap_or_default();
        // As CRI-O does: exact names looked up, only globs matched one by one.
        let (globs, exact): (Vec<String>, Vec<String>) =
            all.into_iter().partition(|p| p.contains('*'));
        Patterns {
            exact: exact.into_iter().collect(),
            globs,
        }
    }

    fn to_proto(stored: &Stored, patterns: &Patterns) -> proto::Image {
        proto::Image {
            id: stored.id.clone(),
            repo_tags: Vec::new(),
            repo_digests: vec![stored.reference.clone()],
            size: stored.size,
            pinned: patterns.exact.contains(&stored.reference)
                || patterns
                    .globs
                    .iter()
                    .any(|p| crio::pattern_matches(p, &stored.reference)),
            ..Default::default()
        }
    }

    /// Serve on a unix socket until the returned handle is dropped or shut down.
    pub async fn serve(&self, socket: &Path) -> std::io::Result<SimServer> {
        let _ = std::fs::remove_file(socket);
        let listener = tokio::net::UnixListener::bind(socket)?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let routes = Routes(
            Routed(Arc::new(self.clone())),
            Routed(Arc::new(RuntimeInfo)),
        );
        let task = tokio::spawn(grpc::serve(listener, routes, rx));
        Ok(SimServer {
            socket: socket.to_path_buf(),
            stop: Some(tx),
            task: Some(task),
        })
    }
}

/// The runtime service's `Version`: the simulated runtime pins as CRI-O does (from its
/// drop-in), so it says it is CRI-O.
struct RuntimeInfo;

/// The name the simulated runtime reports, as CRI-O does.
pub const RUNTIME_NAME: &str = "cri-o";

impl Served for RuntimeInfo {
    const NAME: &'static str = "runtime.v1.RuntimeService";

    fn route(
        self: Arc<Self>,
        method: &str,
        request: http::Request<tonic::body::Body>,
    ) -> Option<Answer> {
        Some(match method {
            "Version" => unary(self, request, |s, r| async move { s.version(r).await }),
            "Status" => unary(self, request, |s, r| async move { s.status(r).await }),
            _ => return None,
        })
    }
}

impl RuntimeInfo {
    async fn version(
        &self,
        _request: Request<VersionRequest>,
    ) -> Result<Response<VersionResponse>, Status> {
        Ok(Response::new(VersionResponse {
            version: "0.1.0".into(),
            runtime_name: RUNTIME_NAME.into(),
            runtime_version: "simulated".into(),
            runtime_api_version: "v1".into(),
        }))
    }

    /// No configuration to tell: the simulated runtime has no registry configuration.
    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(StatusResponse::default()))
    }
}

/// A running simulated server.
pub struct SimServer {
    socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl SimServer {
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// Stop serving (as a runtime that goes down) and wait for the server task.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Marks a pull abandoned when the server drops its future before it ended.
struct PullGuard {
    sim: SimulatedRuntime,
    index: usize,
    done: bool,
}

impl Drop for PullGuard {
    fn drop(&mut self) {
        let mut st = self.sim.state();
        st.stats.in_flight -= 1;
        if !self.done {
            let rec = &mut st.stats.pulls[self.index];
            rec.abandoned = true;
            rec.ended = Some(Instant::now());
        }
    }
}

impl SimulatedRuntime {
    async fn pull(&self, reference: String) -> Result<String, Status> {
        let index = {
            let mut st = self.state();
            st.stats.in_flight += 1;
            st.stats.max_in_flight = st.stats.max_in_flight.max(st.stats.in_flight);
            st.stats.pulls.push(PullRecord {
                reference: reference.clone(),
                started: Instant::now(),
                ended: None,
                result: None,
                abandoned: false,
            });
            st.stats.pulls.len() - 1
        };
        let mut guard = PullGuard {
            sim: self.clone(),
            index,
            done: false,
        };
        let result = self.pull_inner(&reference).await;
        guard.done = true;
        let mut st = self.state();
        let rec = &mut st.stats.pulls[index];
        rec.ended = Some(Instant::now());
        rec.result = Some(
            result
                .as_ref()
                .map(|_| ())
                .map_err(|s| s.message().to_string()),
        );
        result
    }

    async fn pull_inner(&self, reference: &str) -> Result<String, Status> {
        let fault = self
            .state()
            .faults
            .get_mut(reference)
            .and_then(VecDeque::pop_front);
        match fault {
            Some(Fault::Fail(code, message)) => return Err(Status::new(code, message)),
            Some(Fault::Hang) => std::future::pending::<()>().await,
            None => {}
        }
        let Some(&size) = self.shared.registry.get(reference) else {
            return Err(Status::not_found(format!(
                "failed to resolve reference {reference:?}: {reference}: not found"
            )));
        };
        if let Some(existing) = self.state().store.get(reference) {
            return Ok(existing.id.clone());
        }
        let bandwidth = self.shared.config.bandwidth.max(1);
        let secs = size as f64 / bandwidth as f64;
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        let mut st = self.state();
        if st.store.contains_key(reference) {
            return Ok(image_id(reference));
        }
        if st.used + size > self.shared.config.disk_capacity {
            return Err(Status::unknown(format!(
                "failed to pull and unpack image {reference:?}: write /var/lib/containers/storage: no space left on device"
            )));
        }
        st.used += size;
        let id = image_id(reference);
        st.store.insert(
            reference.to_string(),
            Stored {
                id: id.clone(),
                reference: reference.into(),
                size,
            },
        );
        Ok(id)
    }

    fn find<'a>(st: &'a State, image: &str) -> Option<&'a Stored> {
        st.store
            .get(image)
            .or_else(|| st.store.values().find(|s| s.id == image))
    }
}

impl Served for SimulatedRuntime {
    const NAME: &'static str = "runtime.v1.ImageService";

    fn route(
        self: Arc<Self>,
        method: &str,
        request: http::Request<tonic::body::Body>,
    ) -> Option<Answer> {
        let r = request;
        Some(match method {
            "ListImages" => unary(self, r, |s, r| async move { s.list_images(r).await }),
            "ImageStatus" => unary(self, r, |s, r| async move { s.image_status(r).await }),
            "PullImage" => unary(self, r, |s, r| async move { s.pull_image(r).await }),
            "RemoveImage" => unary(self, r, |s, r| async move { s.remove_image(r).await }),
            "ImageFsInfo" => unary(self, r, |s, r| async move { s.image_fs_info(r).await }),
            _ => return None,
        })
    }
}

/// The reference an `ImageSpec` names (empty when there is none).
fn image_of(spec: Option<proto::ImageSpec>) -> String {
    spec.map(|s| s.image).unwrap_or_default()
}

/// The image service's methods, as CRI defines them.
impl SimulatedRuntime {
    async fn list_images(
        &self,
        _request: Request<ListImagesRequest>,
    ) -> Result<Response<ListImagesResponse>, Status> {
        self.count("ListImages");
        let patterns = self.pinned_patterns();
        let st = self.state();
        let images = st
            .store
            .values()
            .map(|s| Self::to_proto(s, &patterns))
            .collect();
        Ok(Response::new(ListImagesResponse { images }))
    }

    async fn image_status(
        &self,
        request: Request<ImageStatusRequest>,
    ) -> Result<Response<ImageStatusResponse>, Status> {
        self.count("ImageStatus");
        let image = image_of(request.into_inner().image);
        let patterns = self.pinned_patterns();
        let st = self.state();
        let found = Self::find(&st, &image).map(|s| Self::to_proto(s, &patterns));
        Ok(Response::new(ImageStatusResponse {
            image: found,
            info: HashMap::new(),
        }))
    }

    async fn pull_image(
        &self,
        request: Request<PullImageRequest>,
    ) -> Result<Response<PullImageResponse>, Status> {
        self.count("PullImage");
        let image = image_of(request.into_inner().image);
        let image_ref = self.pull(image).await?;
        Ok(Response::new(PullImageResponse { image_ref }))
    }

    async fn remove_image(
        &self,
        request: Request<RemoveImageRequest>,
    ) -> Result<Response<RemoveImageResponse>, Status> {
        self.count("RemoveImage");
        let image = image_of(request.into_inner().image);
        let mut st = self.state();
        let key = Self::find(&st, &image).map(|s| s.reference.clone());
        if let Some(key) = key
            && let Some(s) = st.store.remove(&key)
        {
            st.used -= s.size;
        }
        Ok(Response::new(RemoveImageResponse {}))
    }

    async fn image_fs_info(
        &self,
        _request: Request<ImageFsInfoRequest>,
    ) -> Result<Response<ImageFsInfoResponse>, Status> {
        self.count("ImageFsInfo");
        let used = self.state().used;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0);
        Ok(Response::new(ImageFsInfoResponse {
            image_filesystems: vec![FilesystemUsage {
                timestamp: now,
                fs_id: Some(FilesystemIdentifier {
                    mountpoint: "/var/lib/containers/storage".into(),
                }),
                used_bytes: Some(UInt64Value { value: used }),
                inodes_used: None,
            }],
            container_filesystems: Vec::new(),
        }))
    }
}

impl SimulatedRuntime {
    pub fn capacity(&self) -> u64 {
        self.shared.config.disk_capacity
    }

    /// Compressed size of `reference` in the simulated registry.
    pub fn registry_size(&self, reference: &str) -> Option<u64> {
        self.shared.registry.get(reference).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinset_node::cri::client::{CriClient, CriConfig};

    fn digest(n: u8) -> String {
        format!(
            "registry.sim/app/{n}@sha256:{}",
            format!("{n:02x}").repeat(32)
        )
    }

    #[tokio::test]
    async fn serves_the_cri_image_api_over_a_unix_socket() {
        let dir = tempfile::tempdir().unwrap();
        let sim = SimulatedRuntime::new(SimConfig {
            registry: vec![
                SimImage {
                    reference: digest(1),
                    size: 1000,
                },
                SimImage {
                    reference: digest(2),
                    size: 500,
                },
            ],
            bandwidth: 1 << 30,
            disk_capacity: 1200,
            pin_drop_in: None,
        });
        let server = sim.serve(&dir.path().join("cri.sock")).await.unwrap();
        let client = CriClient::new(CriConfig {
            endpoint: server.endpoint(),
            ..Default::default()
        })
        .unwrap();
        assert!(client.list_images().await.unwrap().is_empty());
        let id = client.pull_image(&digest(1), None).await.unwrap();
        assert_eq!(id, format!("sha256:{}", "01".repeat(32)));
        assert!(client.image_status(&digest(1)).await.unwrap().is_some());
        assert!(
            client.image_status(&id).await.unwrap().is_some(),
            "found by id too"
        );
        let full = client.pull_image(&digest(2), None).await.unwrap_err();
        assert!(full.is_no_space(), "{full}");
        let missing = client
            .pull_image("registry.sim/none@sha256:00", None)
            .await
            .unwrap_err();
        assert!(missing.is_not_found(), "{missing}");
        let fs = client.image_fs_info().await.unwrap();
        assert_eq!(fs[0].used_bytes.as_ref().unwrap().value, 1000);
        client.remove_image(&digest(1)).await.unwrap();
        assert_eq!(sim.used_bytes(), 0);
        assert_eq!(sim.stats().calls("PullImage"), 3);
        server.shutdown().await;
    }
}
