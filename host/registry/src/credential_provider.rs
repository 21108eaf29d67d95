//! The kubelet's image credential providers: the exec plugins cloud nodes get their registry
//! credentials from (ECR, ACR, Artifact Registry), where no `config.json` holds them.
//!
//! The node's own configuration is read as the kubelet reads it (`--image-credential-provider-
//! config`, a `CredentialProviderConfig` in YAML or JSON; `--image-credential-provider-bin-dir`,
//! where each provider's executable is named after it). For an image that one of a provider's
//! `matchImages` matches, the plugin is run with a `CredentialProviderRequest` on its standard
//! input and answers a `CredentialProviderResponse` on its standard output; its answer is kept
//! for its `cacheDuration` (else the provider's `defaultCacheDuration`) under the key its
//! `cacheKeyType` says: the image, its registry, or one for all.
//!
//! Matching is the kubelet's: an image and a pattern match when their hosts have as many
//! dot-separated parts and each part matches its glob (`*`, `?`, `[…]`, within one part), their
//! ports are the same (both absent, or equal), and the pattern's path is a prefix of the image's.
//! Of the credentials an answer holds, the most specific key that matches the image is used.
//!
//! A plugin is the node administrator's, but its answer is still read bounded: within
//! [`DEADLINE`] (killed then), [`RESPONSE_BYTES`] of answer, [`KEPT_STDERR`] of its error output
//! quoted. It runs once at a time for a registry, registries in parallel. A plugin that fails
//! gives no credential: the pull goes on without one, said at warn, and the plugin is not asked
//! again for that registry within [`RETRY_AFTER`].
//! Providers that need a pod's service-account token (`tokenAttributes`) cannot serve a node's
//! pre-pulls, for which there is no pod: they are skipped, said once when the file is read.

use crate::auth::Credential;
use pinset_core::decisions::Observer;
use pinset_core::input;
use pinset_core::yaml::{self, Fields};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a plugin may take to answer; it is killed then.
pub const DEADLINE: Duration = Duration::from_secs(30);
/// The most a plugin's answer may hold.
pub const RESPONSE_BYTES: u64 = 1 << 20;
/// How much of a plugin's standard error a failure quotes (the rest is read and dropped).
pub const KEPT_STDERR: u64 = 4096;
/// The most answers (and failures) kept per provider; past it, the expired ones are dropped,
/// else all.
const CACHED: usize = 1024;
/// The most bytes of answers (keys and credentials) kept per provider: [`CACHED`] answers of
/// [`RESPONSE_BYTES`] would be a gigabyte.
const CACHED_BYTES: usize = 16 << 20;
/// How long a plugin that failed for a registry is not asked again for it.
pub const RETRY_AFTER: Duration = Duration::from_secs(30);
/// The versions of the plugin protocol (`apiVersion` of a provider) the kubelet speaks.
const PROTOCOLS: [&str; 3] = [
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
];
/// The versions of the configuration file the kubelet reads.
const CONFIGS: [&str; 3] = [
    "kubelet.config.k8s.io/v1",
    "kubelet.config.k8s.io/v1beta1",
    "kubelet.config.k8s.io/v1alpha1",
];

/// A credential provider configuration that cannot be used, named by its file and place.
#[derive(Debug, thiserror::Error)]
#[error("image credential provider configuration {path}: {why}")]
pub struct ConfigError {
    pub path: PathBuf,
    pub why: String,
}

/// The providers of a node's configuration, with the answers they gave.
pub struct Providers {
    bin_dir: PathBuf,
    providers: Vec<Provider>,
    /// How long a plugin may take ([`DEADLINE`]).
    deadline: Duration,
    /// Told of each run (Prometheus in the agent), once given.
    observer: std::sync::OnceLock<Arc<dyn Observer>>,
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.providers.iter().map(|p| p.name.as_str()).collect();
        write!(
            f,
            "Providers({} in {})",
            names.join(", "),
            self.bin_dir.display()
        )
    }
}

struct Provider {
    name: String,
    match_images: Vec<String>,
    default_cache: Duration,
    protocol: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    cache: std::sync::Mutex<Cache>,
    /// One turn per registry, held while the plugin runs for it: one run at a time for a
    /// registry (a lookup that waited finds its answer, or its failure), registries in parallel.
    turns: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// What a provider answered, and the registries it failed for.
#[derive(Default)]
struct Cache {
    /// Answers by their cache key, until they expire.
    answers: HashMap<String, Kept>,
    /// Registries the plugin failed for: since when, and why. It is not asked again for them
    /// within [`RETRY_AFTER`]: a plugin that hangs must not hold each pull of a registry in turn.
    failures: HashMap<String, (Instant, String)>,
    /// What the kept answers hold, in bytes (keys and credentials).
    bytes: usize,
}

impl Cache {
    /// A kept answer for `image`, or its registry's recent failure.
    fn known(
        &self,
        image: &str,
        now: Instant,
    ) -> Option<Result<Vec<(String, Credential)>, String>> {
        for key in [image, registry_of(image), ""] {
            if let Some(kept) = self.answers.get(key).filter(|k| k.until > now) {
                return Some(Ok(kept.auth.clone()));
            }
        }
        let (at, why) = self.failures.get(registry_of(image))?;
        let ago = now.saturating_duration_since(*at);
        (ago < RETRY_AFTER).then(|| {
            Err(format!(
                "{why} ({}s ago, for this registry; asked again {}s after)",
                ago.as_secs(),
                RETRY_AFTER.as_secs()
            ))
        })
    }

    fn keep(&mut self, key: String, kept: Kept, now: Instant) {
        if kept.until <= now {
            return;
        }
        let bytes = kept.bytes();
        self.make_room(now, bytes);
        if let Some(replaced) = self.answers.insert(key, kept) {
            self.bytes -= replaced.bytes();
        }
        self.bytes += bytes;
    }

    fn failed(&mut self, registry: &str, why: &str, now: Instant) {
        self.make_room(now, 0);
        self.failures
            .insert(registry.to_string(), (now, why.to_string()));
    }

    /// Room for an answer of `bytes`: at most [`CACHED`] answers of [`CACHED_BYTES`] in all, and
    /// [`CACHED`] failures; past either, what expired goes, else all.
    fn make_room(&mut self, now: Instant, bytes: usize) {
        let full = |c: &Cache| c.answers.len() >= CACHED || c.bytes + bytes > CACHED_BYTES;
        if full(self) {
            self.answers.retain(|_, k| k.until > now);
            self.bytes = self.answers.values().map(Kept::bytes).sum();
            if full(self) {
                self.answers.clear();
                self.bytes = 0;
            }
        }
        if self.failures.len() >= CACHED {
            self.failures.clear();
        }
    }
}

/// An answer, until it expires: its credentials, the most specific key first.
#[derive(Clone)]
struct Kept {
    until: Instant,
    auth: Vec<(String, Credential)>,
}

impl Kept {
    fn bytes(&self) -> usize {
        let each =
            |(key, c): &(String, Credential)| key.len() + c.username.len() + c.password.len();
        self.auth.iter().map(each).sum()
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfigFile {
    api_version: String,
    kind: String,
    providers: Vec<ProviderSpec>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProviderSpec {
    name: String,
    match_images: Vec<String>,
    default_cache_duration: String,
    api_version: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
    token_attributes: Option<serde_json::Value>,
}

#[derive(serde::Deserialize)]
struct EnvVar {
    name: String,
    value: String,
}

impl Providers {
    /// The providers `config` declares, their executables in `bin_dir`.
    pub fn load(config: &Path, bin_dir: &Path) -> Result<Providers, ConfigError> {
        let err = |why: String| ConfigError {
            path: config.into(),
            why,
        };
        let text = input::text(config, input::CONFIG).map_err(|e| err(e.to_string()))?;
        let (file, _) =
            yaml::from_str::<ConfigFile>(&text, Fields::Strict).map_err(|e| err(e.to_string()))?;
        let providers = Self::checked(file).map_err(err)?;
        Ok(Providers {
            bin_dir: bin_dir.into(),
            providers,
            deadline: DEADLINE,
            observer: Default::default(),
        })
    }

    /// Tell `observer` of each plugin run from now on (the first observer given stays).
    pub fn observe(&self, observer: Arc<dyn Observer>) {
        let _ = self.observer.set(observer);
    }

    /// These providers, each run given `deadline` to answer.
    pub fn with_deadline(self, deadline: Duration) -> Self {
        Providers { deadline, ..self }
    }

    /// The file's providers, checked as the kubelet checks them; those that need a pod's token
    /// left out.
    fn checked(file: ConfigFile) -> Result<Vec<Provider>, String> {
        if !CONFIGS.contains(&file.api_version.as_str()) || file.kind != "CredentialProviderConfig"
        {
            return Err(format!(
                "{} {}: not a CredentialProviderConfig of {}",
                file.api_version,
                file.kind,
                CONFIGS.join(", ")
            ));
        }
        let mut names = Vec::new();
        let mut providers = Vec::new();
        for (i, spec) in file.providers.into_iter().enumerate() {
            let at = |why: String| format!("providers[{i}] ({}): {why}", spec.name);
            let provider = Provider::from_spec(&spec).map_err(at)?;
            if names.contains(&provider.name) {
                return Err(at("a second provider of this name".into()));
            }
            names.push(provider.name.clone());
            if spec.token_attributes.is_some() {
                tracing::warn!(provider = %spec.name, "this image credential provider wants a pod's service-account token (tokenAttributes): a node's pre-pulls have no pod, so pinset does not ask it");
                continue;
            }
            providers.push(provider);
        }
        Ok(providers)
    }

    /// The credential a provider gives for `image` (`host[:port]/path…`), asking them in the
    /// file's order; `None` when none matches or answers with one; the first failure when a
    /// provider that matches failed and none gave one.
    pub async fn credential(&self, image: &str) -> Result<Option<Credential>, String> {
        let mut failed = None;
        for provider in &self.providers {
            if !provider.match_images.iter().any(|p| matches(p, image)) {
                continue;
            }
            match provider.answer(self, image).await {
                Ok(auth) => {
                    if let Some((_, c)) = auth.into_iter().find(|(key, _)| matches(key, image)) {
                        return Ok(Some(c));
                    }
                }
                Err(why) => {
                    failed.get_or_insert(why);
                }
            }
        }
        failed.map_or(Ok(None), Err)
    }
}

impl Provider {
    fn from_spec(spec: &ProviderSpec) -> Result<Provider, String> {
        let name = &spec.name;
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err("a name must be the plugin's file name in the bin directory".into());
        }
        if spec.match_images.is_empty() {
            return Err("matchImages is empty".into());
        }
        for pattern in &spec.match_images {
            check_pattern(pattern).map_err(|why| format!("matchImages {pattern:?}: {why}"))?;
        }
        if !PROTOCOLS.contains(&spec.api_version.as_str()) {
            return Err(format!(
                "apiVersion {:?}: one of {} expected",
                spec.api_version,
                PROTOCOLS.join(", ")
            ));
        }
        let default_cache = go_duration(&spec.default_cache_duration)
            .map_err(|why| format!("defaultCacheDuration: {why}"))?;
        Ok(Provider {
            name: name.clone(),
            match_images: spec.match_images.clone(),
            default_cache,
            protocol: spec.api_version.clone(),
            args: spec.args.clone(),
            env: spec
                .env
                .iter()
                .map(|e| (e.name.clone(), e.value.clone()))
                .collect(),
            cache: Default::default(),
            turns: Default::default(),
        })
    }

    /// The credentials this provider gives for `image`: kept, or asked for.
    async fn answer(
        &self,
        providers: &Providers,
        image: &str,
    ) -> Result<Vec<(String, Credential)>, String> {
        if let Some(known) = self.known(image) {
            return known;
        }
        let turn = self.turn(registry_of(image));
        let _turn = turn.lock().await;
        if let Some(known) = self.known(image) {
            return known;
        }
        let answer = match self.run(providers, image).await {
            Ok(response) => self.keep(response, image),
            Err(why) => Err(why),
        };
        if let Some(observer) = providers.observer.get() {
            observer.credential_provider_run(&self.name, answer.is_ok());
        }
        let now = Instant::now();
        let mut cache = self.cache.lock().expect("credential cache");
        match answer {
            Ok((key, kept)) => {
                cache.keep(key, kept.clone(), now);
                Ok(kept.auth)
            }
            Err(why) => {
                let exe = providers.bin_dir.join(&self.name);
                let why = format!("{}: {why}", exe.display());
                tracing::warn!(provider = %self.name, %image, error = %why, "the image credential provider failed: going on without its credential (it is asked again for this registry in {}s)", RETRY_AFTER.as_secs());
                cache.failed(registry_of(image), &why, now);
                Err(why)
            }
        }
    }

    /// What is known for `image` now: a kept answer, or its registry's recent failure.
    fn known(&self, image: &str) -> Option<Result<Vec<(String, Credential)>, String>> {
        let cache = self.cache.lock().expect("credential cache");
        cache.known(image, Instant::now())
    }

    /// The turn of `registry` (at most [`CACHED`] kept; a turn taken stays valid when cleared).
    fn turn(&self, registry: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = self.turns.lock().expect("credential provider turns");
        if turns.len() >= CACHED {
            turns.clear();
        }
        turns.entry(registry.to_string()).or_default().clone()
    }

    /// The answer checked, its cache key and how long it is kept.
    fn keep(&self, response: Response, image: &str) -> Result<(String, Kept), String> {
        if response.kind != "CredentialProviderResponse" || response.api_version != self.protocol {
            return Err(format!(
                "answered a {} {}, not a CredentialProviderResponse of {}",
                response.api_version, response.kind, self.protocol
            ));
        }
        let key = match response.cache_key_type.as_str() {
            "Image" => image.to_string(),
            "Registry" => registry_of(image).to_string(),
            "Global" => String::new(),
            other => {
                return Err(format!(
                    "cacheKeyType {other:?}: Image, Registry or Global expected"
                ));
            }
        };
        let lasts = match &response.cache_duration {
            Some(d) => go_duration(d).map_err(|why| format!("cacheDuration: {why}"))?,
            None => self.default_cache,
        };
        let mut auth = Vec::new();
        for (pattern, c) in response.auth {
            check_pattern(&pattern).map_err(|why| format!("auth key {pattern:?}: {why}"))?;
            let credential = Credential {
                username: c.username,
                password: c.password,
            };
            auth.push((pattern, credential));
        }
        // The most specific key first: the longest.
        auth.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        let until = Instant::now().checked_add(lasts).unwrap_or_else(far_future);
        Ok((key, Kept { until, auth }))
    }

    /// Run the plugin for `image`: its answer, or why there is none (the caller names the plugin).
    async fn run(&self, providers: &Providers, image: &str) -> Result<Response, String> {
        let request = serde_json::json!({
            "apiVersion": self.protocol,
            "kind": "CredentialProviderRequest",
            "image": image,
        });
        let mut command = tokio::process::Command::new(providers.bin_dir.join(&self.name));
        command.args(&self.args).envs(self.env.iter().cloned());
        let request = request.to_string().into_bytes();
        let out = run_bounded(command, request, providers.deadline).await?;
        serde_json::from_slice(&out).map_err(|e| format!("not a CredentialProviderResponse: {e}"))
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Response {
    api_version: String,
    kind: String,
    cache_key_type: String,
    cache_duration: Option<String>,
    #[serde(default)]
    auth: BTreeMap<String, ResponseAuth>,
}

#[derive(serde::Deserialize)]
struct ResponseAuth {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

/// Run `command` with `stdin` as its input, within `deadline`: its output, at most
/// [`RESPONSE_BYTES`], when it succeeds; else its status and the start of its error output.
async fn run_bounded(
    mut command: tokio::process::Command,
    stdin: Vec<u8>,
    deadline: Duration,
) -> Result<Vec<u8>, String> {
    use tokio::io::AsyncWriteExt;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run: {e}"))?;
    let (mut input, output, errors) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let ran = async {
        let feed = async {
            if let Some(input) = input.as_mut() {
                // A plugin that does not read its request is not an error here: its answer says.
                let _ = input.write_all(&stdin).await;
            }
            drop(input);
        };
        let ((), out, err) = tokio::join!(
            feed,
            read_bounded(output, RESPONSE_BYTES + 1, false),
            read_bounded(errors, KEPT_STDERR, true)
        );
        Ok::<_, std::io::Error>((child.wait().await?, out?, err?))
    };
    match tokio::time::timeout(deadline, ran).await {
        // Dropped with the future: killed (`kill_on_drop`).
        Err(_) => Err(format!("did not answer within {deadline:?}: killed")),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok((_, out, _))) if out.len() as u64 > RESPONSE_BYTES => {
            Err(format!("answered more than {RESPONSE_BYTES} bytes"))
        }
        Ok(Ok((status, _, err))) if !status.success() => Err(format!(
            "{status}: {}",
            String::from_utf8_lossy(&err).trim()
        )),
        Ok(Ok((_, out, _))) => Ok(out),
    }
}

/// The first `max` bytes of `from`; the rest read and dropped when `drain`, else left unread and
/// the pipe closed, so that a writer past the bound ends (EPIPE) rather than waits.
async fn read_bounded(
    from: Option<impl tokio::io::AsyncRead + Unpin>,
    max: u64,
    drain: bool,
) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut kept = Vec::new();
    if let Some(mut from) = from {
        (&mut from).take(max).read_to_end(&mut kept).await?;
        if drain {
            tokio::io::copy(&mut from, &mut tokio::io::sink()).await?;
        }
    }
    Ok(kept)
}

/// The registry (`host[:port]`) of an image reference.
fn registry_of(image: &str) -> &str {
    image.split('/').next().unwrap_or(image)
}

/// An image or pattern split as the kubelet splits it: host parts, port, path.
fn split(reference: &str) -> (Vec<&str>, &str, &str) {
    let (authority, path) = match reference.find('/') {
        Some(i) => reference.split_at(i),
        None => (reference, ""),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => (host, port),
        _ => (authority, ""),
    };
    (host.split('.').collect(), port, path)
}

/// Whether `pattern` (a `matchImages` entry, or a key of an answer's `auth`) matches `image`.
pub fn matches(pattern: &str, image: &str) -> bool {
    let (globs, glob_port, glob_path) = split(pattern);
    let (parts, port, path) = split(image);
    glob_port == port
        && globs.len() == parts.len()
        && path.starts_with(glob_path)
        && globs
            .iter()
            .zip(&parts)
            .all(|(g, p)| glob(g.as_bytes(), p.as_bytes()))
}

/// A pattern is well-formed: not empty, every glob of its host closes its classes and escapes.
fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("empty".into());
    }
    let (globs, _, _) = split(pattern);
    match globs.iter().all(|g| well_formed(g.as_bytes())) {
        true => Ok(()),
        false => Err("a malformed glob (an unclosed [ or a trailing \\)".into()),
    }
}

fn well_formed(mut pattern: &[u8]) -> bool {
    while let Some((&c, rest)) = pattern.split_first() {
        pattern = match c {
            b'[' => match class(rest, None) {
                Some((_, after)) => after,
                None => return false,
            },
            _ => match literal(pattern) {
                Some((_, after)) => after,
                None => return false,
            },
        };
    }
    true
}

/// Whether `text` matches the glob `pattern` (`*` any run, `?` one character, `[…]` a class,
/// `[^…]` its complement, `\` escapes), as Go's `filepath.Match` within one host part. A
/// malformed pattern matches nothing.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|skip| glob(rest, &text[skip..])),
        Some((b'?', rest)) => !text.is_empty() && glob(rest, &text[1..]),
        Some((b'[', rest)) => match class(rest, text.first().copied()) {
            Some((true, after)) => glob(after, &text[1..]),
            _ => false,
        },
        Some(_) => match literal(pattern) {
            Some((c, after)) => text.first() == Some(&c) && glob(after, &text[1..]),
            None => false,
        },
    }
}

/// One character of a pattern, `\` escaping it, and what follows.
fn literal(pattern: &[u8]) -> Option<(u8, &[u8])> {
    match pattern {
        [b'\\', rest @ ..] => rest.split_first().map(|(&c, rest)| (c, rest)),
        [c, rest @ ..] => Some((*c, rest)),
        [] => None,
    }
}

/// A character class after its `[`: whether `c` is in it (false for no character) and the
/// pattern after its `]`; `None` when it does not close.
fn class(pattern: &[u8], c: Option<u8>) -> Option<(bool, &[u8])> {
    let (negated, mut rest) = match pattern.split_first() {
        Some((b'^', rest)) => (true, rest),
        _ => (false, pattern),
    };
    let mut found = false;
    loop {
        if let [b']', after @ ..] = rest {
            return Some((c.is_some() && found != negated, after));
        }
        let (lo, after) = literal(rest)?;
        rest = after;
        let hi = match rest {
            [b'-', tail @ ..] if tail.first() != Some(&b']') => {
                let (hi, after) = literal(tail)?;
                rest = after;
                hi
            }
            _ => lo,
        };
        found |= c.is_some_and(|c| lo <= c && c <= hi);
    }
}

/// A Go duration (`12h`, `1h30m`, `90s`, `0`, `1.5h`): what the kubelet's configuration and
/// plugins write. Negative durations are refused.
pub fn go_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?}: a duration such as 12h, 10m or 90s expected");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..number_end].parse().map_err(|_| bad())?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * seconds;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_match_patterns_as_the_kubelet_matches_them() {
        let cases = [
            (
                "123456789.dkr.ecr.us-east-1.amazonaws.com",
                "123456789.dkr.ecr.us-east-1.amazonaws.com/app@sha256:00",
                true,
            ),
            (
                "*.dkr.ecr.*.amazonaws.com",
                "123456789.dkr.ecr.us-east-1.amazonaws.com/app:v1",
                true,
            ),
            ("*.azurecr.io", "team.azurecr.io/x", true),
            // A glob is one part: `*.io` does not match a host of three parts.
            ("*.io", "team.azurecr.io/x", false),
            ("gcr.io", "gcr.io/p/img", true),
            ("gcr.io", "eu.gcr.io/p/img", false),
            ("*.*.registry.io", "a.b.registry.io/x", true),
            ("app*.k8s.io", "apps.k8s.io/x", true),
            ("k8s.*", "k8s.io/x", true),
            ("[a-c]z.io", "bz.io/x", true),
            ("[^a-c]z.io", "bz.io/x", false),
            ("r?.io", "rx.io/x", true),
            // The port must be the same: both absent, or equal.
            ("registry.io:8080/path", "registry.io:8080/path/img", true),
            ("registry.io:8080", "registry.io/img", false),
            ("registry.io", "registry.io:8080/img", false),
            ("127.0.0.1:5000", "127.0.0.1:5000/a/b@sha256:00", true),
            // The pattern's path is a prefix of the image's (as a string, as for the kubelet).
            ("registry.io/team", "registry.io/team/img", true),
            ("registry.io/team", "registry.io/other/img", false),
            ("registry.io/team", "registry.io/teamwork/img", true),
        ];
        for (pattern, image, expected) in cases {
            assert_eq!(matches(pattern, image), expected, "{pattern} ~ {image}");
        }
    }

    #[test]
    fn malformed_patterns_are_refused() {
        assert!(check_pattern("*.azurecr.io").is_ok());
        assert!(check_pattern("a\\*b.io").is_ok());
        for bad in ["", "[a-.io", "a\\"] {
            assert!(check_pattern(bad).is_err(), "{bad:?}");
        }
        assert!(!matches("[a-.io", "a.io"));
    }

    #[test]
    fn go_durations() {
        let d = |s: &str| go_duration(s).unwrap();
        assert_eq!(d("12h"), Duration::from_secs(12 * 3600));
        assert_eq!(d("1h30m"), Duration::from_secs(5400));
        assert_eq!(d("10m0s"), Duration::from_secs(600));
        assert_eq!(d("1.5s"), Duration::from_millis(1500));
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert_eq!(d("0"), Duration::ZERO);
        assert_eq!(d("0s"), Duration::ZERO);
        for bad in ["", "12", "-1h", "1d", "h", "1.2.3s"] {
            assert!(go_duration(bad).is_err(), "{bad:?}");
        }
    }

    /// A bin directory with `plugin`, a link to the shell: each test's provider runs `script`
    /// (`-c`), reading the request on its standard input. (A link, not a written script: an
    /// executable just written may be held open by another test's fork: "text file busy".)
    fn bed(provider: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink("/bin/sh", bin.join("plugin")).unwrap();
        let config = dir.path().join("providers.yaml");
        std::fs::write(&config, provider).unwrap();
        (dir, config)
    }

    fn provider(script: &str, extra: &str) -> String {
        format!(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
             - name: plugin\n  matchImages: ['*.registry.test', 'registry.test:5000']\n  \
             defaultCacheDuration: 1h\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n  \
             args: ['-c', {script:?}]\n{extra}"
        )
    }

    /// A plugin answering for every registry it is asked about, counting its runs in `runs`.
    fn answering(runs: &Path, key_type: &str, duration: &str) -> String {
        format!(
            "cat > {dir}/request; echo run >> {runs}; \
             printf '%s' '{{\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\
             \"kind\":\"CredentialProviderResponse\",\"cacheKeyType\":\"{key_type}\",{duration}\
             \"auth\":{{\"*.registry.test\":{{\"username\":\"any\",\"password\":\"p1\"}},\
             \"eu.registry.test/team\":{{\"username\":\"team\",\"password\":\"p2\"}}}}}}'",
            dir = runs.parent().unwrap().display(),
            runs = runs.display(),
        )
    }

    fn runs(path: &Path) -> usize {
        std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
    }

    #[tokio::test]
    async fn a_plugin_is_asked_what_it_matches_and_its_answer_kept_by_its_cache_key() {
        let scratch = tempfile::tempdir().unwrap();
        let count = scratch.path().join("runs");
        let (dir, config) = bed(&provider(&answering(&count, "Registry", ""), ""));
        let providers = Providers::load(&config, &dir.path().join("bin")).unwrap();
        let team = providers
            .credential("eu.registry.test/team/app@sha256:00")
            .await;
        assert_eq!(
            team.unwrap().unwrap().username,
            "team",
            "the most specific key"
        );
        let request: serde_json::Value =
            serde_json::from_slice(&std::fs::read(scratch.path().join("request")).unwrap())
                .unwrap();
        assert_eq!(
            request,
            serde_json::json!({
                "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
                "kind": "CredentialProviderRequest",
                "image": "eu.registry.test/team/app@sha256:00",
            })
        );
        let other = providers
            .credential("eu.registry.test/other/app")
            .await
            .unwrap();
        assert_eq!(other.unwrap().username, "any");
        assert_eq!(runs(&count), 1, "kept for the registry");
        providers
            .credential("us.registry.test/x")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(runs(&count), 2, "another registry asks again");
        assert_eq!(providers.credential("quay.io/x").await, Ok(None));
        assert!(
            providers.credential("registry.test/x").await == Ok(None),
            "no port"
        );
        assert_eq!(runs(&count), 2, "what no pattern matches is not asked");
    }

    #[tokio::test]
    async fn an_answer_kept_for_no_time_is_asked_again_and_image_keys_are_per_image() {
        let scratch = tempfile::tempdir().unwrap();
        let count = scratch.path().join("runs");
        let script = answering(&count, "Registry", "\"cacheDuration\":\"0s\",");
        let (dir, config) = bed(&provider(&script, ""));
        let providers = Providers::load(&config, &dir.path().join("bin")).unwrap();
        for _ in 0..2 {
            providers
                .credential("eu.registry.test/x")
                .await
                .unwrap()
                .unwrap();
        }
        assert_eq!(runs(&count), 2);

        let per_image = answering(&count, "Image", "");
        let (dir, config) = bed(&provider(&per_image, ""));
        let providers = Providers::load(&config, &dir.path().join("bin")).unwrap();
        for image in [
            "eu.registry.test/x",
            "eu.registry.test/x",
            "eu.registry.test/y",
        ] {
            providers.credential(image).await.unwrap().unwrap();
        }
        assert_eq!(runs(&count), 4, "x once, y once");
    }

    /// Every way a plugin can fail gives no credential and a reason naming the plugin, within
    /// the deadline: it hangs, floods its answer, says nonsense, speaks another version, fails.
    #[tokio::test]
    async fn a_plugin_that_misbehaves_gives_no_credential_and_says_why() {
        let response = |version: &str| {
            format!(
                "printf '%s' '{{\"apiVersion\":\"{version}\",\"kind\":\"CredentialProviderResponse\",\
                 \"cacheKeyType\":\"Global\",\"auth\":{{}}}}'"
            )
        };
        let cases = [
            ("sleep 60", "did not answer within 1s: killed".to_string()),
            ("yes", format!("answered more than {RESPONSE_BYTES} bytes")),
            (
                "echo '{not json'",
                "not a CredentialProviderResponse".into(),
            ),
            (
                &response("credentialprovider.kubelet.k8s.io/v1beta1") as &str,
                "not a CredentialProviderResponse of credentialprovider.kubelet.k8s.io/v1".into(),
            ),
            (
                "echo denied >&2; head -c 100000 /dev/zero >&2; exit 3",
                "exit status: 3: denied".into(),
            ),
        ];
        for (script, why) in cases {
            let (dir, config) = bed(&provider(script, ""));
            let providers = Providers::load(&config, &dir.path().join("bin"))
                .unwrap()
                .with_deadline(Duration::from_secs(1));
            let started = Instant::now();
            let err = providers.providers[0]
                .answer(&providers, "eu.registry.test/x")
                .await
                .err()
                .unwrap_or_else(|| panic!("{script}: answered"));
            assert!(
                err.contains(&why) && err.contains("bin/plugin"),
                "{script}: {err}"
            );
            assert!(
                err.len() < 5000,
                "{script}: the error output quoted in part"
            );
            assert!(started.elapsed() < Duration::from_secs(10), "{script}");
            // Not asked again for the registry at once: the failure is said again, at once.
            let again = Instant::now();
            let held = providers.providers[0]
                .answer(&providers, "eu.registry.test/y")
                .await
                .unwrap_err();
            assert!(
                held.contains(&why) && held.contains("ago, for this registry"),
                "{held}"
            );
            assert!(again.elapsed() < Duration::from_millis(500), "{script}");
            assert!(
                providers
                    .credential("eu.registry.test/z")
                    .await
                    .unwrap_err()
                    .contains(&why)
            );
            let other = providers.providers[0]
                .answer(&providers, "us.registry.test/x")
                .await;
            assert!(
                !other.unwrap_err().contains("for this registry"),
                "another registry is asked"
            );
        }
    }

    /// One registry's run does not wait for another's: the plugin asked for `a.registry.test`
    /// answers only once it has been asked for `b.registry.test` meanwhile (else it is killed at
    /// the deadline, and gives nothing).
    #[tokio::test]
    async fn registries_are_asked_in_parallel() {
        let scratch = tempfile::tempdir().unwrap();
        let b = scratch.path().join("b-asked");
        let answer = "printf '%s' '{\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\
                      \"kind\":\"CredentialProviderResponse\",\"cacheKeyType\":\"Registry\",\
                      \"auth\":{\"*.registry.test\":{\"username\":\"u\",\"password\":\"p\"}}}'";
        let script = format!(
            "request=$(cat); case \"$request\" in *a.registry.test*) \
             until [ -e {b} ]; do sleep 0.05; done;; *) touch {b};; esac; {answer}",
            b = b.display()
        );
        let (dir, config) = bed(&provider(&script, ""));
        let providers = Providers::load(&config, &dir.path().join("bin"))
            .unwrap()
            .with_deadline(Duration::from_secs(10));
        let (a, b) = tokio::join!(
            providers.credential("a.registry.test/x"),
            providers.credential("b.registry.test/x")
        );
        assert!(
            matches!((&a, &b), (Ok(Some(_)), Ok(Some(_)))),
            "{a:?} {b:?}"
        );
    }

    /// Answers as large as a plugin may give (700 KB each), one per image: what is kept stays
    /// within its bound, the latest answer among it.
    #[tokio::test]
    async fn what_is_kept_is_bounded_in_bytes() {
        let script = r#"cat >/dev/null; printf '%s' '{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Image","auth":{"*.registry.test":{"username":"u","password":"'; head -c 700000 /dev/zero | tr '\0' a; printf '"}}}'"#;
        let (dir, config) = bed(&provider(script, ""));
        let providers = Providers::load(&config, &dir.path().join("bin")).unwrap();
        for i in 0..40 {
            let image = format!("eu.registry.test/image{i}");
            let c = providers.credential(&image).await.unwrap().unwrap();
            assert_eq!(c.password.len(), 700_000);
            let cache = providers.providers[0].cache.lock().unwrap();
            assert!(
                cache.bytes <= CACHED_BYTES,
                "{} kept at image {i}",
                cache.bytes
            );
            let counted: usize = cache.answers.values().map(Kept::bytes).sum();
            assert_eq!(cache.bytes, counted);
            assert!(cache.answers.contains_key(&image));
        }
    }

    /// Each run is told to the observer, with its provider and whether it answered; kept
    /// answers and held failures are not runs.
    #[tokio::test]
    async fn each_run_is_told_to_the_observer() {
        #[derive(Default)]
        struct Told(std::sync::Mutex<Vec<(String, bool)>>);
        impl Observer for Told {
            fn credential_provider_run(&self, provider: &str, ok: bool) {
                self.0.lock().unwrap().push((provider.to_string(), ok));
            }
        }
        let scratch = tempfile::tempdir().unwrap();
        let answer = answering(&scratch.path().join("runs"), "Registry", "");
        let script = format!(
            "request=$(cat); case \"$request\" in *bad.registry.test*) exit 1;; esac; \
             echo \"$request\" | {answer}"
        );
        let (dir, config) = bed(&provider(&script, ""));
        let providers = Providers::load(&config, &dir.path().join("bin")).unwrap();
        let told = Arc::new(Told::default());
        providers.observe(told.clone());
        for image in [
            "eu.registry.test/a",
            "eu.registry.test/b",
            "bad.registry.test/a",
        ] {
            let _ = providers.credential(image).await;
        }
        assert!(providers.credential("bad.registry.test/b").await.is_err());
        let runs = told.0.lock().unwrap().clone();
        assert_eq!(
            runs,
            [("plugin".to_string(), true), ("plugin".to_string(), false)]
        );
    }

    #[test]
    fn a_configuration_is_checked_as_the_kubelet_checks_it_naming_the_place() {
        let load = |text: &str| {
            let (dir, config) = bed(text);
            Providers::load(&config, &dir.path().join("bin")).map(|p| p.providers.len())
        };
        let good = provider("true", "");
        assert_eq!(load(&good).unwrap(), 1);
        let tokens = provider(
            "true",
            "  tokenAttributes: {serviceAccountTokenAudience: x}\n",
        );
        assert_eq!(
            load(&tokens).unwrap(),
            0,
            "a provider wanting a pod's token is left out"
        );
        let cases = [
            (
                good.replace("kind: CredentialProviderConfig", "kind: Other"),
                "not a CredentialProviderConfig",
            ),
            (
                good.replace("name: plugin", "name: ../plugin"),
                "providers[0] (../plugin): a name must be",
            ),
            (
                good.replace("defaultCacheDuration: 1h", "defaultCacheDuration: 1d"),
                "defaultCacheDuration: \"1d\"",
            ),
            (
                good.replace("'*.registry.test'", "'[a.registry.test'"),
                "matchImages \"[a.registry.test\"",
            ),
            (
                good.replace("credentialprovider.kubelet.k8s.io/v1", "v9"),
                "apiVersion \"v9\"",
            ),
            (good.replace("matchImages", "matchImage"), "unknown field"),
            (
                format!("{good}{}", &good[good.find("- name").unwrap()..]),
                "providers[1] (plugin): a second provider",
            ),
        ];
        for (text, why) in cases {
            let err = load(&text).unwrap_err().to_string();
            assert!(
                err.contains("providers.yaml") && err.contains(why),
                "{why}: {err}"
            );
        }
    }
}
