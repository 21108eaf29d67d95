//! `pinset policy new`: a policy crate of its own, outside any workspace, that starts with the
//! default policy's rules, its native unit tests and scenarios, and a reproducible build.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct NewArgs {
    /// The policy's name: the crate's (lowercase letters, digits and `-`).
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Export a fleet rollout policy too (`pinset:fleet/rollout`), besides the node decisions.
    #[arg(long)]
    pub fleet: bool,
    /// Create the crate here (default: ./NAME). It must not exist, or be empty.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Depend on the SDK in this checkout of pinset's repository (path dependencies).
    #[arg(long, value_name = "CHECKOUT", conflicts_with = "sdk_git")]
    pub sdk_path: Option<PathBuf>,
    /// Depend on the SDK in this git repository of pinset (at --sdk-tag).
    #[arg(long, value_name = "URL")]
    pub sdk_git: Option<String>,
    /// The tag of --sdk-git.
    #[arg(long, value_name = "TAG", default_value = concat!("v", env!("CARGO_PKG_VERSION")))]
    pub sdk_tag: String,
}

const TEMPLATES: [(&str, &str); 8] = [
    (
        "Cargo.toml",
        include_str!("../../templates/policy/Cargo.toml.in"),
    ),
    (
        "src/lib.rs",
        include_str!("../../templates/policy/lib.rs.in"),
    ),
    (
        "README.md",
        include_str!("../../templates/policy/README.md.in"),
    ),
    (
        "build.sh",
        include_str!("../../templates/policy/build.sh.in"),
    ),
    (
        ".cargo/config.toml",
        include_str!("../../templates/policy/cargo/config.toml.in"),
    ),
    (
        ".gitignore",
        include_str!("../../templates/policy/gitignore.in"),
    ),
    (
        "scenarios/worker.yaml",
        include_str!("../../templates/policy/scenarios/worker.yaml.in"),
    ),
    (
        "scenarios/small-disk.yaml",
        include_str!("../../templates/policy/scenarios/small-disk.yaml.in"),
    ),
];
const FLEET_SCENARIO: (&str, &str) = (
    "scenarios/canary-first.yaml",
    include_str!("../../templates/policy/scenarios/canary-first.yaml.in"),
);
const FLEET_IMPL: &str = include_str!("../../templates/policy/fleet_impl.rs.in");
const FLEET_TEST: &str = include_str!("../../templates/policy/fleet_test.rs.in");
const FLEET_DOC: &str = "\n//!\n//! The pool's rollout is the default's too: a canary, then waves of 10 % of the pool; a failed\n//! canary holds the rest.";

/// `policy new`
pub fn new(args: &NewArgs) -> Result<ExitCode> {
    check_name(&args.name)?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&args.name));
    if dir.exists() && std::fs::read_dir(&dir)?.next().is_some() {
        anyhow::bail!(
            "{}: exists and is not empty: nothing written",
            dir.display()
        );
    }
    let values = values(args)?;
    let mut files: Vec<(&str, &str)> = TEMPLATES.to_vec();
    if args.fleet {
        files.push(FLEET_SCENARIO);
    }
    // Everything is rendered before anything is written.
    let rendered: Vec<(&str, String)> = files
        .iter()
        .map(|(path, template)| (*path, render(template, &values)))
        .collect();
    for (path, text) in &rendered {
        write(&dir.join(path), text)?;
    }
    eprintln!(
        "created {} ({}); next:\n  cd {}\n  cargo test\n  ./build.sh\n  pinset policy test --policy target/wasm32-wasip2/release/{}.wasm scenarios/",
        dir.display(),
        if args.fleet {
            "node decisions and fleet rollout"
        } else {
            "node decisions"
        },
        dir.display(),
        args.name.replace('-', "_")
    );
    Ok(ExitCode::SUCCESS)
}

/// A crate name cargo and the module's file both take.
fn check_name(name: &str) -> Result<()> {
    let ok = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    anyhow::ensure!(
        ok,
        "policy name {name:?}: lowercase letters, digits and '-', starting with a letter"
    );
    Ok(())
}

/// Where the SDK comes from: the dependency's location, the source as the README names it, and
/// the extra path remap of `build.sh`.
fn sdk_source(args: &NewArgs) -> Result<(String, String, String)> {
    Ok(match (&args.sdk_path, &args.sdk_git) {
        (Some(checkout), _) => {
            let checkout = std::path::absolute(checkout)
                .with_context(|| format!("--sdk-path {}", checkout.display()))?;
            let sdk = checkout.join("policies/sdk");
            anyhow::ensure!(
                sdk.join("Cargo.toml").exists(),
                "--sdk-path {}: not a checkout of pinset (no policies/sdk/Cargo.toml)",
                checkout.display()
            );
            (
                format!("path = {:?}", sdk.display().to_string()),
                format!("the checkout {}", checkout.display()),
                format!(" --remap-path-prefix={}=/pinset", checkout.display()),
            )
        }
        (None, Some(url)) => (
            format!("git = {url:?}, tag = {:?}", args.sdk_tag),
            format!("{url} at {}", args.sdk_tag),
            String::new(),
        ),
        (None, None) => anyhow::bail!(
            "name where the SDK comes from: --sdk-git URL [--sdk-tag TAG] (pinset's repository) or --sdk-path CHECKOUT"
        ),
    })
}

/// The placeholders' values for `args`.
fn values(args: &NewArgs) -> Result<Vec<(&'static str, String)>> {
    let (location, source, remap) = sdk_source(args)?;
    let features = match args.fleet {
        true => r#""decisions", "fleet", "no-std", "bindgen""#,
        false => r#""decisions", "no-std", "bindgen""#,
    };
    let type_name: String = args
        .name
        .split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next().map_or(String::new(), |f| {
                f.to_ascii_uppercase().to_string() + c.as_str()
            })
        })
        .collect();
    let fleet = |text: &str| {
        if args.fleet {
            text.to_string()
        } else {
            String::new()
        }
    };
    Ok(vec![
        ("{{fleet_impl}}", fleet(FLEET_IMPL)),
        ("{{fleet_test}}", fleet(FLEET_TEST)),
        ("{{fleet_doc}}", fleet(FLEET_DOC)),
        (
            "{{remap_what}}",
            if remap.is_empty() {
                ""
            } else {
                ", the SDK's checkout"
            }
            .into(),
        ),
        ("{{remap}}", remap),
        ("{{location}}", location),
        ("{{source}}", source),
        ("{{features}}", features.to_string()),
        (
            "{{what}}",
            match args.fleet {
                true => "node decisions and a fleet rollout".into(),
                false => "node decisions".into(),
            },
        ),
        ("{{crate}}", args.name.replace('-', "_")),
        ("{{type}}", type_name),
        ("{{name}}", args.name.clone()),
    ])
}

/// `template` with every placeholder replaced (the fleet pieces first: they hold placeholders).
fn render(template: &str, values: &[(&str, String)]) -> String {
    values
        .iter()
        .fold(template.to_string(), |text, (key, value)| {
            text.replace(key, value)
        })
}

fn write(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().expect("a template path has a directory");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    if path.extension().is_some_and(|e| e == "sh") {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("making {} executable", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(name: &str, fleet: bool) -> NewArgs {
        NewArgs {
            name: name.into(),
            fleet,
            dir: None,
            sdk_path: None,
            sdk_git: Some("https://example.com/pinset.git".into()),
            sdk_tag: "v1.2.3".into(),
        }
    }

    #[test]
    fn every_placeholder_is_filled() {
        for fleet in [false, true] {
            let values = values(&args("edge-sites", fleet)).unwrap();
            for (path, template) in TEMPLATES.iter().chain([&FLEET_SCENARIO]) {
                let text = render(template, &values);
                assert!(!text.contains("{{"), "{path}: {text}");
            }
            let lib = render(TEMPLATES[1].1, &values);
            assert!(lib.contains("pub struct EdgeSites;"), "{lib}");
            assert_eq!(lib.contains("export_fleet!(EdgeSitesFleet)"), fleet);
            let cargo = render(TEMPLATES[0].1, &values);
            assert!(
                cargo.contains(r#"git = "https://example.com/pinset.git", tag = "v1.2.3""#),
                "{cargo}"
            );
        }
    }

    #[test]
    fn names_and_sources_are_checked() {
        for bad in ["Edge", "1st", "a_b", ""] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        let mut a = args("ok", false);
        a.sdk_git = None;
        let e = values(&a).unwrap_err().to_string();
        assert!(e.contains("--sdk-git") && e.contains("--sdk-path"), "{e}");
        a.sdk_path = Some("/nonexistent".into());
        let e = values(&a).unwrap_err().to_string();
        assert!(e.contains("not a checkout"), "{e}");
    }
}
