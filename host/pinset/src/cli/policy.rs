//! `pinset policy test | bench | info`.

use super::PolicyOpts;
use anyhow::Result;
use clap::Subcommand;
use pinset_core::{fleet_scenario, scenario};
use pinset_policy::{Guarded, PolicyModule};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// How `policy test` and `policy bench` print.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// Run scenario files (or directories of them) against a policy; non-zero exit on failure.
    /// Every field of both scenario formats, its unit and default: docs/scenarios.md, or
    /// `--reference`.
    Test {
        #[command(flatten)]
        policy: PolicyOpts,
        /// Scenario files (YAML) or directories holding them.
        #[arg(required_unless_present = "reference", value_name = "SCENARIO")]
        scenarios: Vec<PathBuf>,
        /// Print the scenario reference (Markdown: every field of node and fleet scenarios,
        /// its unit and default, with an example of each) and exit.
        #[arg(long)]
        reference: bool,
        /// text for people, json for scripts.
        #[arg(long, short = 'o', value_enum, default_value = "text")]
        output: Format,
        /// Also write the results as JUnit XML (one testcase per scenario) for CI systems.
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
    },
    /// Per-hook latency of the policy: against the native reference (the embedded default),
    /// the floor module (`--floor`), or a saved run of its own (`--baseline`).
    Bench {
        #[command(flatten)]
        policy: PolicyOpts,
        #[command(flatten)]
        args: super::policy_bench::BenchArgs,
    },
    /// Play a pool's whole rollout through a fleet policy, offline: when each node pulls, the
    /// decisions that granted nodes, how long it took. Exit 0 when every node reached the
    /// target, 1 when the rollout held or stalled.
    Simulate(super::simulate::SimulateArgs),
    /// Load a policy and print, for each contract it implements, its name, version and
    /// description; its sha256; and every interface it imports.
    Info {
        #[command(flatten)]
        policy: PolicyOpts,
        /// The module to inspect (the same as --policy).
        #[arg(value_name = "FILE.wasm|oci://REF", conflicts_with = "policy")]
        module: Option<String>,
        /// text for people; json or yaml for scripts.
        #[arg(long, short = 'o', value_enum, default_value = "text")]
        output: super::plan::Output,
    },
    /// Start a policy: a crate of its own with the default's rules, unit tests, scenarios and a
    /// reproducible build (`build.sh`).
    New(super::scaffold::NewArgs),
    /// Push a module to a registry as a Wasm OCI artifact (the layout `wkg oci push` writes);
    /// print the pushed reference by digest.
    Push(super::policy_oci::PushArgs),
    /// Pull a module (a Wasm OCI artifact, from pinset or `wkg oci push`) into a file.
    Pull(super::policy_oci::PullArgs),
    /// Sign a pushed module with a cosign key; the signature is pushed beside it, in cosign's
    /// format (`sha256-HEX.sig`).
    Sign(super::policy_oci::SignArgs),
    /// Verify a pushed module's cosign signature with a public key; exit 1 when none verifies.
    Verify(super::policy_oci::VerifyArgs),
    /// Generate a key pair in cosign's formats (`cosign.key`, encrypted with $COSIGN_PASSWORD,
    /// and `cosign.pub`), as `cosign generate-key-pair` does.
    Keygen(super::policy_oci::KeygenArgs),
}

/// `pinset compile-policy`, the child of [`pinset_policy::Compiler::Subprocess`].
pub fn compile_child(memory_bytes: Option<u64>) -> Result<ExitCode> {
    use anyhow::Context;
    use std::io::{Read, Write};
    if let Some(bytes) = memory_bytes {
        pinset_policy::bound_memory(bytes).context("bounding this process's memory")?;
    }
    let mut module = Vec::new();
    std::io::stdin()
        .read_to_end(&mut module)
        .context("reading the module from stdin")?;
    match pinset_policy::precompile(&module) {
        Ok(artifact) => {
            let mut out = std::io::stdout().lock();
            out.write_all(&artifact)
                .and_then(|()| out.flush())
                .context("writing the artifact to stdout")?;
            Ok(ExitCode::SUCCESS)
        }
        Err(message) => {
            eprintln!("{message}");
            Ok(ExitCode::from(pinset_policy::COMPILE_INVALID_MODULE))
        }
    }
}

pub fn run(cmd: PolicyCommand) -> Result<ExitCode> {
    match cmd {
        PolicyCommand::Test {
            reference: true, ..
        } => {
            print!("{}", pinset_core::scenario_reference::markdown());
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Test {
            policy,
            scenarios,
            output,
            junit,
            ..
        } => test(&policy, &scenarios, output, junit.as_deref()),
        PolicyCommand::Bench { policy, mut args } => {
            args.iterations = args.iterations.max(1);
            let native_means_something = policy.policy.is_none();
            super::policy_bench::run(&mut Modules::new(&policy)?, native_means_something, &args)
        }
        PolicyCommand::Simulate(args) => super::simulate::run(&args),
        PolicyCommand::New(args) => super::scaffold::new(&args),
        PolicyCommand::Push(args) => super::policy_oci::push(&args),
        PolicyCommand::Pull(args) => super::policy_oci::pull(&args),
        PolicyCommand::Sign(args) => super::policy_oci::sign(&args),
        PolicyCommand::Verify(args) => super::policy_oci::verify(&args),
        PolicyCommand::Keygen(args) => super::policy_oci::keygen(&args),
        PolicyCommand::Info {
            mut policy,
            module,
            output,
        } => {
            policy.policy = module.or(policy.policy);
            info(&policy, output)
        }
    }
}

fn describe(module: &PolicyModule) -> String {
    let mut probe = Guarded::of(module);
    let info = probe.info();
    let note = if probe.fallbacks().is_empty() {
        ""
    } else {
        " (info hook failed: reference shown)"
    };
    format!(
        "policy {} — {} {}{note}: {}\n  sha256 {}",
        module.name(),
        info.name,
        info.version,
        info.description,
        module.sha256()
    )
}

/// `policy info`: the contracts a module implements (node decisions, fleet rollout, or both),
/// its sha256, and what it asks of the sandbox — every interface it imports, WASI's included
/// (offered empty: no files, network, clock or environment).
fn info(opts: &PolicyOpts, output: super::plan::Output) -> Result<ExitCode> {
    use super::plan::Output;
    let mut modules = Modules::new(opts)?;
    modules.load_all()?;
    let (node, fleet) = (&modules.node, &modules.fleet);
    let (sha256, imports) = match (node, fleet) {
        (Some(m), _) => (m.sha256(), m.imports()),
        (None, Some(f)) => (f.sha256(), f.imports()),
        (None, None) => anyhow::bail!("policy module {}: loaded for no contract", opts.name()),
    };
    // (kind, contract, what the policy says of itself) for each contract it implements.
    use pinset_policy::Contract;
    let mut contracts = Vec::new();
    if let Some(m) = node {
        contracts.push((
            pinset_policy::NodeContract::ROLE.kind,
            m.interface(),
            node_info(m),
        ));
    }
    if let Some(f) = fleet {
        contracts.push((
            pinset_policy::FleetContract::ROLE.kind,
            f.interface(),
            fleet_info(f),
        ));
    }
    let report = || {
        let mut report = serde_json::json!({
            "module": opts.name(),
            "sha256": sha256,
            "imports": imports,
        });
        for (kind, contract, i) in &contracts {
            report[*kind] = serde_json::json!({
                "contract": contract,
                "name": i.name,
                "version": i.version,
                "description": i.description,
            });
        }
        report
    };
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report())?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(&report())?),
        Output::Text => {
            println!("module {}\n  sha256 {sha256}", opts.name());
            for (kind, contract, i) in &contracts {
                println!(
                    "  {kind:<6} {contract} — {} {}: {}",
                    i.name, i.version, i.description
                );
            }
            println!("  imports ({}) {}", imports.len(), imports.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What a node policy says of itself (the reference's info if its hook fails).
fn node_info(module: &PolicyModule) -> pinset_policy::PolicyInfo {
    Guarded::of(module).info()
}

fn test(
    opts: &PolicyOpts,
    paths: &[PathBuf],
    format: Format,
    junit: Option<&std::path::Path>,
) -> Result<ExitCode> {
    let files = scenario::collect(paths)?;
    super::warn_if_empty(
        "scenarios",
        paths,
        files.len(),
        "scenario file (*.yaml, *.yml)",
    );
    let mut modules = Modules::new(opts)?;
    let mut outcomes: Vec<(scenario::Outcome, Duration)> = Vec::new();
    for file in &files {
        let started = std::time::Instant::now();
        let outcome = modules.run(file)?;
        outcomes.push((outcome, started.elapsed()));
    }
    let name = modules.name();
    if let Some(path) = junit {
        std::fs::write(path, super::report::junit(&name, &outcomes))
            .map_err(|e| anyhow::anyhow!("--junit {}: {e}", path.display()))?;
    }
    match format {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&super::report::test_json(&modules.json(), &outcomes))?
        ),
        Format::Text => {
            println!("{}", modules.describe());
            print_outcomes(&outcomes);
        }
    }
    let failed = outcomes.iter().filter(|(o, _)| !o.passed()).count();
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The module under test, loaded for the contracts the scenarios need: the node decisions for
/// node scenarios, the fleet policy for fleet scenarios (a module may export either or both).
pub(super) struct Modules<'a> {
    opts: &'a PolicyOpts,
    pub(super) runtime: pinset_policy::WasmRuntime,
    /// Compiled once, for whichever contracts the scenarios ask for.
    compiled: Option<pinset_policy::CompiledModule>,
    pub(super) node: Option<PolicyModule>,
    pub(super) fleet: Option<pinset_policy::FleetModule>,
}

impl<'a> Modules<'a> {
    pub(super) fn new(opts: &'a PolicyOpts) -> Result<Self> {
        Ok(Self {
            opts,
            runtime: opts.fetch.runtime(pinset_policy::Compiler::InProcess)?,
            compiled: None,
            node: None,
            fleet: None,
        })
    }

    /// The module compiled (on first use; a clone shares the compiled code).
    fn compiled(&mut self) -> Result<pinset_policy::CompiledModule> {
        if self.compiled.is_none() {
            self.compiled = Some(self.opts.compile(&self.runtime)?);
        }
        Ok(self.compiled.clone().expect("compiled above"))
    }

    fn node(&mut self) -> Result<&PolicyModule> {
        if self.node.is_none() {
            let compiled = self.compiled()?;
            self.node = Some(
                self.runtime
                    .bind::<pinset_policy::NodeContract>(&compiled)?,
            );
        }
        Ok(self.node.as_ref().expect("loaded above"))
    }

    fn fleet(&mut self) -> Result<&pinset_policy::FleetModule> {
        if self.fleet.is_none() {
            let compiled = self.compiled()?;
            self.fleet = Some(
                self.runtime
                    .bind::<pinset_policy::FleetContract>(&compiled)?,
            );
        }
        Ok(self.fleet.as_ref().expect("loaded above"))
    }

    /// Both contracts, each when the module implements it; when it implements neither, the
    /// error of the contract it was built for (`WasmRuntime::bind_all`).
    pub(super) fn load_all(&mut self) -> Result<()> {
        let compiled = self.compiled()?;
        let (node, fleet) = self.runtime.bind_all(&compiled)?;
        (self.node, self.fleet) = (node, fleet);
        Ok(())
    }

    /// One scenario file, node or fleet, against a fresh instance; an unreadable file fails.
    fn run(&mut self, file: &std::path::Path) -> Result<scenario::Outcome> {
        let text = match scenario::read(file) {
            Ok(t) => t,
            Err(e) => return Ok(unreadable(file, e)),
        };
        if fleet_scenario::is_fleet(&text) {
            let loaded = match fleet_scenario::load(file, &text) {
                Ok(l) => l,
                Err(e) => return Ok(unreadable(file, e)),
            };
            let module = self.fleet()?;
            return Ok(fleet_scenario::run(&loaded, |request| {
                let decided = Guarded::of(module).grant(request);
                (decided.grant, decided.fallback.is_some())
            }));
        }
        let module = self.node()?;
        let loaded = match scenario::parse(file, &text) {
            Ok(l) => l,
            Err(e) => return Ok(unreadable(file, e)),
        };
        // A fresh instance, as per reconcile.
        let mut policy = Guarded::of(module);
        Ok(scenario::run(&loaded, &mut policy))
    }

    fn name(&self) -> String {
        match (&self.node, &self.fleet) {
            (Some(m), _) => m.name().to_string(),
            (None, Some(f)) => f.name().to_string(),
            (None, None) => self.opts.name(),
        }
    }

    pub(super) fn describe(&self) -> String {
        let mut out = Vec::new();
        if let Some(m) = &self.node {
            out.push(describe(m));
        }
        if let Some(f) = &self.fleet {
            out.push(describe_fleet(f));
        }
        out.join("\n")
    }

    /// The policy as the JSON reports name it: the node contract's info when it implements
    /// that, else the fleet contract's.
    pub(super) fn json(&self) -> serde_json::Value {
        let (info, sha256) = match (&self.node, &self.fleet) {
            (Some(m), _) => (node_info(m), m.sha256()),
            (None, Some(f)) => (fleet_info(f), f.sha256()),
            (None, None) => return serde_json::json!({"module": self.opts.name()}),
        };
        serde_json::json!({
            "module": self.name(),
            "name": info.name,
            "version": info.version,
            "sha256": sha256,
        })
    }
}

fn fleet_info(module: &pinset_policy::FleetModule) -> pinset_policy::PolicyInfo {
    use pinset_policy::Described;
    module
        .instance()
        .info()
        .unwrap_or_else(|_| pinset_policy::PolicyInfo::new("(info failed)", "", ""))
}

fn describe_fleet(module: &pinset_policy::FleetModule) -> String {
    let info = fleet_info(module);
    format!(
        "fleet policy {} — {} {}: {}\n  sha256 {}",
        module.name(),
        info.name,
        info.version,
        info.description,
        module.sha256()
    )
}

/// A scenario file that could not be read or parsed: a failed outcome saying why.
fn unreadable(file: &std::path::Path, e: scenario::ScenarioError) -> scenario::Outcome {
    scenario::Outcome {
        name: "(unreadable)".into(),
        path: file.to_path_buf(),
        diffs: vec![pinset_core::diff::Diff::problem("scenario", e.to_string())],
    }
}

fn print_outcomes(outcomes: &[(scenario::Outcome, Duration)]) {
    for (outcome, _) in outcomes {
        if outcome.passed() {
            println!("PASS  {}  ({})", outcome.name, outcome.path.display());
        } else {
            println!("FAIL  {}  ({})", outcome.name, outcome.path.display());
            for d in &outcome.diffs {
                for line in d.to_string().lines() {
                    println!("      {line}");
                }
            }
        }
    }
    let passed = outcomes.iter().filter(|(o, _)| o.passed()).count();
    println!("{passed} passed, {} failed", outcomes.len() - passed);
}
