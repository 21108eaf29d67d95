//! A real Kubernetes API server for tests: etcd 3.4 (Debian) and the real
//! `apiextensions-apiserver` (built by `tests/bed/fetch-apiserver.sh`), on loopback ports, with a
//! CA, a serving certificate and an admin client certificate made here with openssl. Stopped by
//! PID when dropped. It serves CRDs and custom resources (CEL validation, status subresource,
//! server-side apply, watch), not the core API.

use super::{free_port, skip_or_fail};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn apiserver_binary() -> Option<PathBuf> {
    [
        std::env::var_os("PINSET_APISERVER").map(PathBuf::from),
        Some(PathBuf::from(
            "/opt/pinset-bed/apiserver/bin/apiextensions-apiserver",
        )),
    ]
    .into_iter()
    .flatten()
    .find(|p| p.exists())
}

pub struct ApiServer {
    pub kubeconfig: PathBuf,
    pub url: String,
    etcd: Child,
    /// The API server's process; `None` while stopped (etcd keeps the data).
    server: std::sync::Mutex<Option<Child>>,
    /// How to start it again, on the same port.
    command: (PathBuf, Vec<String>),
    dir: tempfile::TempDir,
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The client certificate's extensions: X.509 v3, client authentication.
const CLIENT_EXT: &str = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n";

/// `NAME.key` and `NAME.crt` in `d`: a new key, its certificate for `subject` with the
/// extensions `ext`, signed by the CA of `d`.
fn leaf(d: &Path, name: &str, subject: &str, ext: &str) {
    let p = |f: &str| d.join(f).to_str().unwrap().to_string();
    std::fs::write(d.join(format!("{name}.ext")), ext).unwrap();
    run(Command::new("openssl").args([
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        subject,
        "-keyout",
        &p(&format!("{name}.key")),
        "-out",
        &p(&format!("{name}.csr")),
    ]));
    run(Command::new("openssl").args([
        "x509",
        "-req",
        "-in",
        &p(&format!("{name}.csr")),
        "-CA",
        &p("ca.crt"),
        "-CAkey",
        &p("ca.key"),
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        &p(&format!("{name}.crt")),
        "-extfile",
        &p(&format!("{name}.ext")),
    ]));
}

/// A CA, a serving certificate for 127.0.0.1 and a `system:masters` client certificate, all
/// X.509 v3 (rustls refuses v1).
fn certificates(d: &Path) {
    let p = |f: &str| d.join(f).to_str().unwrap().to_string();
    run(Command::new("openssl").args([
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=pinset-test-ca",
        "-keyout",
        &p("ca.key"),
        "-out",
        &p("ca.crt"),
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]));
    leaf(
        d,
        "server",
        "/CN=127.0.0.1",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
    );
    leaf(d, "admin", "/O=system:masters/CN=admin", CLIENT_EXT);
}

fn b64(path: &Path) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(std::fs::read(path).unwrap())
}

/// etcd on loopback ports with its data in `d`: the process and its client port.
fn start_etcd(bin: &Path, d: &Path) -> (Child, u16) {
    let (client_port, peer_port) = (free_port(), free_port());
    let child = Command::new(bin)
        .args([
            "--name",
            "pinset-test",
            "--data-dir",
            d.join("etcd").to_str().unwrap(),
            "--listen-client-urls",
            &format!("http://127.0.0.1:{client_port}"),
            "--advertise-client-urls",
            &format!("http://127.0.0.1:{client_port}"),
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{peer_port}"),
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer_port}"),
            "--initial-cluster",
            &format!("pinset-test=http://127.0.0.1:{peer_port}"),
            "--unsafe-no-fsync",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(d.join("etcd.log")).unwrap())
        .spawn()
        .expect("start etcd");
    (child, client_port)
}

/// A kubeconfig for the server at `url`, authenticating with the
/// certificate `NAME.crt`/`NAME.key` of `d`, written to `path`.
fn write_kubeconfig_for(d: &Path, url: &str, name: &str, path: &Path) {
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\nusers:\n- name: {name}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: test\n  context: {{cluster: test, user: {name}}}\ncurrent-context: test\n",
            ca = b64(&d.join("ca.crt")),
            cert = b64(&d.join(format!("{name}.crt"))),
            key = b64(&d.join(format!("{name}.key"))),
        ),
    )
    .unwrap();
}

/// An admin kubeconfig for the server at `url`, from the certificates in `d`.
fn write_kubeconfig(d: &Path, url: &str) -> PathBuf {
    let kubeconfig = d.join("kubeconfig");
    write_kubeconfig_for(d, url, "admin", &kubeconfig);
    kubeconfig
}

impl ApiServer {
    /// Start etcd and the API server and wait until it serves; `None` (after a loud message)
    /// when the bed is not installed and `PINSET_SKIP_BED` asked to skip.
    pub async fn start() -> Option<ApiServer> {
        Self::start_with(None).await
    }

    /// An API server that asks `authorizer` (answering SubjectAccessReviews) to decide every
    /// request of a client outside `system:masters`, without caching its answers.
    pub async fn start_authorized(authorizer: &crate::rbac::Authorizer) -> Option<ApiServer> {
        Self::start_with(Some(authorizer)).await
    }

    async fn start_with(authorizer: Option<&crate::rbac::Authorizer>) -> Option<ApiServer> {
        let Some(binary) = apiserver_binary() else {
            skip_or_fail("apiextensions-apiserver is not built (tests/bed/fetch-apiserver.sh)");
            return None;
        };
        let Some(etcd_bin) = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
        else {
            skip_or_fail("etcd is not installed (apt-get install etcd-server)");
            return None;
        };
        let dir = crate::scratch_dir("pinset-apiserver-");
        let d = dir.path();
        certificates(d);
        let port = free_port();
        let (etcd, client_port) = start_etcd(&etcd_bin, d);
        let url = format!("https://127.0.0.1:{port}");
        let kubeconfig = write_kubeconfig(d, &url);
        let kc = kubeconfig.to_str().unwrap();
        let authorization = match authorizer {
            Some(a) => a.kubeconfig(d).display().to_string(),
            None => kc.to_string(),
        };
        let mut args: Vec<String> = [
            format!("--etcd-servers=http://127.0.0.1:{client_port}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", d.join("certs").display()),
            format!("--tls-cert-file={}", d.join("server.crt").display()),
            format!("--tls-private-key-file={}", d.join("server.key").display()),
            format!("--client-ca-file={}", d.join("ca.crt").display()),
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={authorization}"),
            "--authentication-skip-lookup".into(),
            "--enable-priority-and-fairness=false".into(),
            "--disable-admission-plugins=NamespaceLifecycle,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,MutatingAdmissionPolicy".into(),
        ]
        .into();
        if authorizer.is_some() {
            args.push("--authorization-webhook-cache-authorized-ttl=0s".into());
            args.push("--authorization-webhook-cache-unauthorized-ttl=0s".into());
        }
        let s = ApiServer {
            kubeconfig: kubeconfig.clone(),
            url,
            etcd,
            server: std::sync::Mutex::new(None),
            command: (binary, args),
            dir,
        };
        s.spawn();
        s.wait_ready().await;
        Some(s)
    }

    fn spawn(&self) {
        let (binary, args) = &self.command;
        let log = self.dir.path().join("apiserver.log");
        let child = crate::spawn_logged(Command::new(binary).args(args), &log);
        *self.server.lock().unwrap() = Some(child);
    }

    /// A kubeconfig for a client authenticated as `user` in `groups` (a client certificate
    /// signed by the server's CA: CN = user, O = each group), as Kubernetes names a service
    /// account (`system:serviceaccount:NS:NAME`, groups `system:serviceaccounts` and
    /// `system:serviceaccounts:NS`).
    pub fn kubeconfig_as(&self, user: &str, groups: &[&str]) -> PathBuf {
        let d = self.dir.path();
        let name = user.replace([':', '/'], "-");
        let subject: String = groups
            .iter()
            .map(|g| format!("/O={g}"))
            .chain(std::iter::once(format!("/CN={user}")))
            .collect();
        leaf(d, &name, &subject, CLIENT_EXT);
        let path = d.join(format!("{name}.kubeconfig"));
        write_kubeconfig_for(d, &self.url, &name, &path);
        path
    }

    /// The certificate authority every certificate of the server's is signed by.
    pub fn ca_certificate(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The server's certificate and key files (for 127.0.0.1, signed by the CA every kubeconfig
    /// trusts): what an endpoint in front of it serves with.
    pub fn serving_certificate(&self) -> (PathBuf, PathBuf) {
        let d = self.dir.path();
        (d.join("server.crt"), d.join("server.key"))
    }

    /// A client from a kubeconfig file (another identity than the admin's).
    pub async fn client_from(&self, kubeconfig: &Path) -> kube::Client {
        let config = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
        let options = kube::config::KubeConfigOptions::default();
        let config = kube::Config::from_custom_kubeconfig(config, &options)
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    /// Stop the API server (etcd and its data stay): clients see connections refused.
    pub fn stop(&self) {
        if let Some(mut child) = self.server.lock().unwrap().take() {
            crate::reap(&mut child);
        }
    }

    /// Start the API server again on the same address, and wait until it answers.
    pub async fn restart(&self) {
        self.stop();
        self.spawn();
        self.wait_ready().await;
    }

    /// CPU time used so far by the API server (while running) and etcd.
    pub fn cpu(&self) -> std::time::Duration {
        let server = self.server.lock().unwrap().as_ref().map(|c| c.id());
        server
            .into_iter()
            .chain([self.etcd.id()])
            .map(crate::procfs::cpu)
            .sum()
    }

    pub async fn client(&self) -> kube::Client {
        pinset_k8s::client(Some(&self.kubeconfig))
            .await
            .expect("client")
    }

    async fn wait_ready(&self) {
        let client = self.client().await;
        // /readyz never turns ready on this server (no Services to watch): the API group
        // answering is the sign.
        let serves = || async {
            let req = http::Request::get("/apis/apiextensions.k8s.io/v1")
                .body(Vec::new())
                .unwrap();
            client.request_text(req).await.map_err(|e| e.to_string())
        };
        let (within, every) = (Duration::from_secs(60), Duration::from_millis(200));
        let log = || self.log();
        crate::poll_until("the API server serves", within, every, &log, serves).await;
    }

    pub fn log(&self) -> String {
        let tail = |f: &str| {
            let t = std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
            t.lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        };
        format!(
            "--- etcd ---\n{}\n--- apiserver ---\n{}",
            tail("etcd.log"),
            tail("apiserver.log")
        )
    }

    /// Apply pinset's CRDs (server-side apply) and wait until each is Established.
    pub async fn install_crds(&self) {
        self.install(pinset_k8s::api::crds()).await
    }

    /// Serve `events.k8s.io/v1` Events, which this API server (apiextensions-apiserver, no core
    /// API) lacks, through a CRD of the same group, version and kind with an open schema: the
    /// events pinset records are then created and listed through the real API machinery.
    pub async fn install_events(&self) {
        let crd = serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {
                "name": "events.events.k8s.io",
                "annotations": {"api-approved.kubernetes.io": "unapproved, pinset's test bed only"}
            },
            "spec": {
                "group": "events.k8s.io",
                "names": {"kind": "Event", "listKind": "EventList", "plural": "events", "singular": "event"},
                "scope": "Namespaced",
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
                }]
            }
        }))
        .expect("the Events CRD");
        self.install(vec![crd]).await;
    }

    /// Apply `crds` (server-side apply) and wait until each is Established.
    pub async fn install(
        &self,
        crds: Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>,
    ) {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        use kube::api::{Api, Patch, PatchParams};
        let api: Api<CustomResourceDefinition> = Api::all(self.client().await);
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap();
            api.patch(
                &name,
                &PatchParams::apply("pinset-test").force(),
                &Patch::Apply(&crd),
            )
            .await
            .unwrap_or_else(|e| panic!("apply CRD {name}: {e}"));
            let deadline = Instant::now() + Duration::from_secs(30);
            let established = || async {
                let c = api.get(&name).await.map_err(|e| e.to_string())?;
                let conditions = c.status.and_then(|s| s.conditions).unwrap_or_default();
                let yes = conditions
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                yes.then_some(()).ok_or(format!("{conditions:?}"))
            };
            crate::wait_for(
                &format!("CRD {name} Established"),
                Duration::from_secs(30),
                established,
            )
            .await;
            self.wait_served(&crd, deadline).await;
        }
    }

    /// Wait until every served version of `crd` answers a list: Established says the CRD is
    /// accepted, not that its resource's handler is installed yet (a request in between meets
    /// 404, and a first Event written then would be lost).
    async fn wait_served(
        &self,
        crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        deadline: Instant,
    ) {
        use kube::api::{Api, DynamicObject};
        use kube::core::{ApiResource, GroupVersionKind};
        let client = self.client().await;
        for version in crd.spec.versions.iter().filter(|v| v.served) {
            let gvk = GroupVersionKind::gvk(&crd.spec.group, &version.name, &crd.spec.names.kind);
            let resource = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            while let Err(e) = api.list(&Default::default()).await {
                assert!(
                    Instant::now() < deadline,
                    "{}/{} not served: {e}",
                    crd.spec.group,
                    version.name
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
        crate::reap(&mut self.etcd);
    }
}

/// Apply the PolicyConfiguration `cluster` with `spec` (server-side apply, owning every field),
/// as field manager `manager`.
pub async fn configure_policies(
    client: &kube::Client,
    manager: &str,
    spec: serde_json::Value,
) -> Result<(), kube::Error> {
    use kube::api::{Api, Patch, PatchParams};
    let api: Api<pinset_k8s::api::PolicyConfiguration> = Api::all(client.clone());
    let object = serde_json::json!({
        "apiVersion": "pinset.io/v1alpha1", "kind": "PolicyConfiguration",
        "metadata": {"name": "cluster"}, "spec": spec
    });
    let ssa = PatchParams::apply(manager).force();
    api.patch("cluster", &ssa, &Patch::Apply(&object)).await?;
    Ok(())
}
