//! What a registry may send pinset, per kind of answer, and how long it may take: every answer
//! is read through [`crate::http`], which enforces both while streaming — whether or not the
//! registry sends a `Content-Length`, whatever pace it sends at. The README's security section
//! states this table.

use std::time::Duration;

/// A cap on one kind of answer: its name (said in a refusal) and its largest body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub what: &'static str,
    pub max_bytes: u64,
}

impl Limit {
    const fn new(what: &'static str, max_bytes: u64) -> Limit {
        Limit { what, max_bytes }
    }

    /// The same kind of answer with another cap (a module's, set by the operator).
    pub const fn at_most(self, max_bytes: u64) -> Limit {
        Limit::new(self.what, max_bytes)
    }
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// An image manifest or index (the distribution spec's limit for a manifest).
pub const MANIFEST: Limit = Limit::new("manifest", 4 * MIB);
/// An image's or an artifact's config blob.
pub const CONFIG: Limit = Limit::new("config", 4 * MIB);
/// A token service's answer (a JSON object holding a token; real ones are a few KiB).
pub const TOKEN: Limit = Limit::new("token", 64 * KIB);
/// A cosign signature's payload (simple signing JSON, a few hundred bytes).
pub const SIGNATURE_PAYLOAD: Limit = Limit::new("signature payload", 64 * KIB);
/// The body of an error answer (read to say what the registry said).
pub const ERROR_BODY: Limit = Limit::new("error body", 64 * KIB);
/// A policy module, unless the operator sets another cap (`--policy-max-module-mib`).
pub const MODULE: Limit = Limit::new("module", 16 * MIB);
/// What an upload answers (a location, an empty body).
pub const UPLOAD_ANSWER: Limit = Limit::new("upload answer", 64 * KIB);

/// A layer of a release payload, streamed (never held): the most read of one. Real ones are
/// tens of MiB; the release files in them are far smaller ([`RELEASE_FILE`]).
pub const LAYER: Limit = Limit::new("layer", 1 << 30);
/// A file read out of a release layer (`image-references`: ~200 KiB for ~200 images).
pub const RELEASE_FILE: Limit = Limit::new("release file", 16 * MIB);

/// Connecting (TCP and TLS) to an endpoint.
pub const CONNECT: Duration = Duration::from_secs(3);
/// One request whose answer is small (a manifest, a token, a config, a signature), headers and
/// body together: a registry that trickles is cut here, not at each read.
pub const SMALL_REQUEST: Duration = Duration::from_secs(10);
/// One request carrying or returning a module (up to [`MODULE`]).
pub const MODULE_REQUEST: Duration = Duration::from_secs(60);
/// One release layer, streamed (up to [`LAYER`]): cut past this whatever the pace.
pub const LAYER_REQUEST: Duration = Duration::from_secs(300);
/// Redirects followed for one request (blobs are often served from storage elsewhere).
pub const REDIRECTS: usize = 5;
/// A whole policy fetch — manifest, token, module, signature — in the agent or the controller:
/// past it the fetch is given up (a transient failure) and retried later.
pub const POLICY_FETCH: Duration = Duration::from_secs(120);
