//! `pinset policy push | pull | sign | verify | keygen`: policy modules shipped as OCI artifacts
//! (the layout `wkg oci push` writes) and signed in cosign's format.

use anyhow::{Context, Result};
use pinset_registry::artifact::{ArtifactRef, Artifacts, ComponentWorld, WasmConfig};
use pinset_registry::signature::SigningKey;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// How these commands reach a registry: credentials as for images; the registries spoken to
/// over plain HTTP are `--insecure-registry` and the registries file's.
#[derive(clap::Args, Clone, Debug)]
pub struct OciOpts {
    /// Registry credentials (a `config.json`: `auths.<registry>.auth`); default: the registries
    /// file's `auth`.
    #[arg(long, value_name = "FILE")]
    pub auth: Option<PathBuf>,
}

impl OciOpts {
    fn artifacts(&self) -> Result<Artifacts> {
        let sources = super::sources::get();
        let credentials = super::sources::credentials(self.auth.as_deref())?;
        Ok(Artifacts::new(
            sources.insecure_registries.clone(),
            credentials,
        ))
    }
}

#[derive(clap::Args, Debug)]
pub struct PushArgs {
    /// The module (a WebAssembly component implementing a pinset contract).
    #[arg(value_name = "FILE.wasm")]
    pub module: PathBuf,
    /// Where to push it: REGISTRY/REPOSITORY:TAG (or @sha256:HEX).
    #[arg(value_name = "REF")]
    pub reference: String,
    /// Recorded as the artifact's author.
    #[arg(long)]
    pub author: Option<String>,
    #[command(flatten)]
    pub oci: OciOpts,
    /// Largest module accepted, in MiB.
    #[arg(long, default_value_t = 16, value_name = "MIB")]
    pub max_module_mib: u64,
}

#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// REGISTRY/REPOSITORY:TAG or @sha256:HEX (`oci://` optional).
    #[arg(value_name = "REF")]
    pub reference: String,
    /// The file to write (replaced whole, or left untouched on error).
    #[arg(long, short = 'o', value_name = "FILE.wasm")]
    pub output: PathBuf,
    #[command(flatten)]
    pub oci: OciOpts,
    /// Largest module accepted, in MiB.
    #[arg(long, default_value_t = 16, value_name = "MIB")]
    pub max_module_mib: u64,
}

#[derive(clap::Args, Debug)]
pub struct SignArgs {
    /// The pushed module: REGISTRY/REPOSITORY@sha256:HEX (a tag is resolved to its digest).
    #[arg(value_name = "REF")]
    pub reference: String,
    /// cosign's private key (`cosign.key`; its password in $COSIGN_PASSWORD, else asked on the
    /// terminal).
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,
    #[command(flatten)]
    pub oci: OciOpts,
}

#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// The pushed module: REGISTRY/REPOSITORY@sha256:HEX (a tag is resolved to its digest).
    #[arg(value_name = "REF")]
    pub reference: String,
    /// A trusted public key (`cosign.pub`); repeatable, one verifying is enough.
    #[arg(long, value_name = "FILE", required = true)]
    pub key: Vec<PathBuf>,
    #[command(flatten)]
    pub oci: OciOpts,
}

#[derive(clap::Args, Debug)]
pub struct KeygenArgs {
    /// Write PREFIX.key and PREFIX.pub.
    #[arg(long, default_value = "cosign", value_name = "PREFIX")]
    pub output_key_prefix: PathBuf,
    /// Write the private key with an empty password. Without it, the password is
    /// $COSIGN_PASSWORD or asked on the terminal, and an empty one is refused (as cosign does).
    #[arg(long)]
    pub allow_empty_password: bool,
}

fn rt() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// The artifact's config for `bytes`: the module must load as at least one pinset contract.
fn config_for(name: &str, bytes: &[u8], author: Option<String>, max: u64) -> Result<WasmConfig> {
    let runtime = pinset_policy::WasmRuntime::new().context("starting the Wasm runtime")?;
    let limits = pinset_policy::Limits {
        max_module_bytes: usize::try_from(max).unwrap_or(usize::MAX),
        ..Default::default()
    };
    let compiled = runtime.compile_module(name, bytes, None, limits)?;
    runtime.bind_all(&compiled)?;
    let (exports, imports) = runtime.world(&compiled);
    Ok(WasmConfig {
        created: pinset_registry::artifact::created(),
        author,
        architecture: "wasm".into(),
        os: "wasip2".into(),
        layer_digests: vec![],
        component: Some(ComponentWorld {
            exports,
            imports,
            target: None,
        }),
    })
}

/// `policy push`
pub fn push(args: &PushArgs) -> Result<ExitCode> {
    let reference = ArtifactRef::parse(&args.reference)?;
    let max = args.max_module_mib << 20;
    use pinset_core::input;
    let shown = args.module.display();
    let bytes =
        input::bytes(&args.module, input::module(max)).map_err(|e| match input::refused(&e) {
            Some(r) => anyhow::anyhow!(
                "{shown}: {}over the limit of {max} bytes (--max-module-mib)",
                input::size_said(r.size)
            ),
            None => anyhow::Error::new(e).context(format!("reading {shown}")),
        })?;
    let name = args.module.display().to_string();
    let config = config_for(&name, &bytes, args.author.clone(), max)?;
    let artifacts = args.oci.artifacts()?;
    let title = args.module.file_name().and_then(|n| n.to_str());
    let pushed = rt()?.block_on(artifacts.push(&reference, &bytes, config, title))?;
    eprintln!(
        "pushed {name} ({} bytes, module {}) as {reference}",
        bytes.len(),
        pinset_registry::artifact::sha256_digest(&bytes)
    );
    println!("{pushed}");
    Ok(ExitCode::SUCCESS)
}

/// `policy pull`
pub fn pull(args: &PullArgs) -> Result<ExitCode> {
    let reference = ArtifactRef::parse(&args.reference)?;
    let artifacts = args.oci.artifacts()?;
    let pulled = rt()?.block_on(artifacts.pull(&reference, args.max_module_mib << 20))?;
    write_whole(&args.output, &pulled.module)?;
    eprintln!(
        "pulled {} ({} bytes, module {}) into {}",
        pulled.reference,
        pulled.module.len(),
        pulled.layer_digest,
        args.output.display()
    );
    println!("{}", pulled.reference);
    Ok(ExitCode::SUCCESS)
}

/// Write `bytes` to `path` whole: on any error `path` is as it was.
fn write_whole(path: &Path, bytes: &[u8]) -> Result<()> {
    pinset_node::os::write_atomic(path, bytes)
        .with_context(|| format!("writing {}", path.display()))
}

/// The private key's password, as cosign takes it: `$COSIGN_PASSWORD` when it is set (even
/// empty), else asked on the terminal (`/dev/tty`, not echoed), else none (`None`).
fn password(prompt: &str, confirm: bool) -> Result<Option<Vec<u8>>> {
    if let Ok(p) = std::env::var("COSIGN_PASSWORD") {
        return Ok(Some(p.into_bytes()));
    }
    let Some(tty) = super::terminal::Tty::open() else {
        return Ok(None);
    };
    let first = tty.ask_hidden(prompt)?;
    if confirm && tty.ask_hidden("Enter password for private key again: ")? != first {
        anyhow::bail!("the passwords differ");
    }
    Ok(Some(first.into_bytes()))
}

/// `keygen`'s password: an empty one only when asked for (`--allow-empty-password`), as cosign.
fn new_password(allow_empty: bool) -> Result<Vec<u8>> {
    let password = password("Enter password for private key: ", true)?;
    match password {
        Some(p) if !p.is_empty() => Ok(p),
        _ if allow_empty => Ok(Vec::new()),
        Some(_) => anyhow::bail!(
            "the password is empty: a private key is written encrypted; give a password \
             ($COSIGN_PASSWORD or the terminal's prompt), or --allow-empty-password"
        ),
        None => anyhow::bail!(
            "no password: $COSIGN_PASSWORD is unset and there is no terminal to ask on; set it, \
             or pass --allow-empty-password for a key without one"
        ),
    }
}

/// `sign`'s key, decrypted with its password; the error says where the password came from.
fn signing_key(path: &Path) -> Result<SigningKey> {
    let text = pinset_core::input::text(path, pinset_core::input::CONFIG)
        .with_context(|| format!("reading {}", path.display()))?;
    let password = password("Enter password for private key: ", false)?;
    let tried = password.clone().unwrap_or_default();
    SigningKey::from_pem(&text, &tried).with_context(|| match password {
        Some(_) => format!("private key {}", path.display()),
        None => format!(
            "private key {} (tried an empty password: $COSIGN_PASSWORD is unset and there is \
             no terminal to ask on)",
            path.display()
        ),
    })
}

/// `policy sign`
pub fn sign(args: &SignArgs) -> Result<ExitCode> {
    let reference = ArtifactRef::parse(&args.reference)?;
    let key = signing_key(&args.key)?;
    let artifacts = args.oci.artifacts()?;
    let signature = rt()?.block_on(artifacts.sign(&reference, &key))?;
    eprintln!("signed {reference} with {}", key.public().fingerprint());
    println!("{signature}");
    Ok(ExitCode::SUCCESS)
}

/// `policy verify`
pub fn verify(args: &VerifyArgs) -> Result<ExitCode> {
    let reference = ArtifactRef::parse(&args.reference)?;
    let keys = super::verifying_keys(&args.key)?;
    let artifacts = args.oci.artifacts()?;
    let verified = rt()?.block_on(async {
        let at = artifacts.resolve(&reference).await?;
        let verified = artifacts.verify(&at, &keys).await?;
        anyhow::Ok((at, verified))
    })?;
    println!("verified {} (signed by {})", verified.0, verified.1.key);
    Ok(ExitCode::SUCCESS)
}

/// `policy keygen`
pub fn keygen(args: &KeygenArgs) -> Result<ExitCode> {
    let prefix = args.output_key_prefix.display().to_string();
    let (private, public) = (
        PathBuf::from(format!("{prefix}.key")),
        PathBuf::from(format!("{prefix}.pub")),
    );
    for path in [&private, &public] {
        anyhow::ensure!(!path.exists(), "{} exists: not overwritten", path.display());
    }
    let (pem, key) = SigningKey::generate(&new_password(args.allow_empty_password)?)?;
    write_private(&private, pem.as_bytes())?;
    write_whole(&public, key.public().to_pem().as_bytes())?;
    eprintln!(
        "private key written to {}, public key to {} ({})",
        private.display(),
        public.display(),
        key.public().fingerprint()
    );
    Ok(ExitCode::SUCCESS)
}

/// A private key's file: readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))
}
