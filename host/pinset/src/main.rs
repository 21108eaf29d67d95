//! The `pinset` binary: argument parsing and one module per subcommand (`cli/`), wiring the
//! crates together. Nothing here decides anything.

use anyhow::Result;
use clap::{Parser, Subcommand};
mod cli;

use cli::{PolicyOpts, node::Inputs, node::RuntimeOpts, policy::PolicyCommand};
use std::process::ExitCode;

/// `pinset --version`: the release, the source commit it was built from and every policy
/// contract it serves, e.g. `0.1.0 (commit 1a2b3c4d5e6f, policy contracts
/// pinset:policy/decisions@0.1.0 pinset:fleet/rollout@0.2.1)`.
fn version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| {
        let contracts: Vec<&str> = pinset_policy::CONTRACTS.iter().map(|(c, _)| *c).collect();
        format!(
            "{} (commit {}, policy contracts {})",
            env!("CARGO_PKG_VERSION"),
            env!("PINSET_COMMIT"),
            contracts.join(" ")
        )
    })
}

/// Pre-pull and pin container images on Kubernetes nodes; every decision is taken by a
/// sandboxed WebAssembly policy.
#[derive(Parser)]
#[command(
    name = "pinset",
    version = version(),
    after_help = "Exit codes: 0 success; 1 failure (an input that cannot be read or parsed, a \
                  refused set, a runtime or registry error, a failed reconcile); 2 usage \
                  (unknown flags, bad flag values)."
)]
struct Args {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `pinset=debug`.
    #[arg(
        long,
        global = true,
        env = "PINSET_LOG",
        default_value = "info",
        value_parser = cli::logging::parse_filter
    )]
    log: String,
    /// Log lines as text, or as one JSON object per line (fields: timestamp, level, message,
    /// and the event's own: node, set, image, hook…).
    #[arg(
        long,
        global = true,
        env = "PINSET_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: cli::logging::LogFormat,
    #[command(flatten)]
    registries: cli::sources::RegistryFlags,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The whole node pipeline on an embedded example, against a simulated runtime: no root,
    /// network or daemon needed.
    Demo {
        #[command(flatten)]
        policy: PolicyOpts,
        /// Where each node's pull timeline is written (NODE.timeline.svg and .trace.json);
        /// default: pinset-demo-timelines in the system's temporary directory.
        #[arg(long, value_name = "DIR")]
        timeline_dir: Option<std::path::PathBuf>,
    },
    /// Pull and pin the images of one node's PinnedImageSets (from YAML files).
    Node {
        #[command(flatten)]
        inputs: Inputs,
        #[command(flatten)]
        runtime: RuntimeOpts,
        #[command(flatten)]
        policy: PolicyOpts,
        /// Keep running: reconcile again whenever an input file changes.
        #[arg(long)]
        watch: bool,
        #[command(flatten)]
        compile: cli::CompileOpts,
        /// Draw the pulls of each reconcile into FILE (SVG: one lane per pull slot, a bar per
        /// pull, throttle pauses and retries marked) and FILE's .trace.json (Chrome trace format).
        #[arg(long, value_name = "FILE.svg")]
        timeline: Option<std::path::PathBuf>,
    },
    /// Print what the policy decides for one node (admission, order, concurrency, throttle)
    /// without pulling: the reconcile's facts (sizes from the registries, the runtime's
    /// snapshot and disk with --cri). Without --cri, every image counts as absent.
    Plan {
        #[command(flatten)]
        inputs: Inputs,
        /// Consult this CRI endpoint for the images already present.
        #[arg(long)]
        cri: Option<String>,
        /// The node's rollout grant caps pulls at once at N (its MachineConfigNode's
        /// `spec.rolloutGrant.maxPulls`), over the policy's concurrency, as the agent applies it.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
        max_pulls: Option<u32>,
        /// text for people; json or yaml for scripts (fields: docs/node.md).
        #[arg(long, short = 'o', value_enum, default_value = "text")]
        output: cli::plan::Output,
        #[command(flatten)]
        sizing: cli::node::SizingOpts,
        #[command(flatten)]
        simulation: cli::plan::Simulation,
        #[command(flatten)]
        policy: PolicyOpts,
    },
    /// Test, benchmark and inspect pull policies offline.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Print the CustomResourceDefinitions pinset serves (PinnedImageSet, MachineConfigPool,
    /// MachineConfigNode) as YAML.
    Crds,
    /// Run the pool controller: each pool's PinnedImageSets and node counts.
    Controller {
        #[command(flatten)]
        cluster: cli::kube::ClusterOpts,
        #[command(flatten)]
        controller: cli::kube::ControllerOpts,
    },
    /// Run the node agent (one per node): pull and pin the node's sets, report on its
    /// MachineConfigNode.
    Agent {
        #[command(flatten)]
        cluster: cli::kube::ClusterOpts,
        #[command(flatten)]
        agent: cli::kube::AgentOpts,
        #[command(flatten)]
        runtime: RuntimeOpts,
        #[command(flatten)]
        policy: PolicyOpts,
    },
    /// A pool's fleet rollout: follow it until every node has its sets pinned, pause it,
    /// resume it (as `kubectl rollout` does for a Deployment).
    #[command(subcommand)]
    Rollout(cli::rollout::RolloutCommand),
    /// Write PinnedImageSets from where the images are: images as people name them, a release
    /// payload, rendered manifests and operator bundles (tags resolved to digests).
    #[command(subcommand)]
    Set(cli::set::SetCommand),
    /// Measure the node pipeline (use a release build).
    #[command(subcommand)]
    Bench(cli::bench::BenchCommand),
    /// Compile a policy module for a running agent or node: the component on stdin, the
    /// artifact on stdout; exit 65 with the reason on stderr when the module is not valid.
    #[command(name = pinset_policy::COMPILE_SUBCOMMAND, hide = true)]
    CompilePolicy {
        /// The most this process may allocate (`RLIMIT_DATA`), set before the module is read.
        #[arg(long = pinset_policy::MEMORY_FLAG, value_name = "BYTES")]
        memory_bytes: Option<u64>,
    },
    /// Print a generated reference page (Markdown): the command line (docs/cli.md), the CRDs'
    /// fields, the metrics or the Events (docs/reference/).
    #[command(hide = true)]
    Reference {
        #[arg(value_enum, default_value = "cli")]
        page: cli::reference::Page,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write a man page for every command into DIR (`pinset.1`, `pinset-plan.1`,
    /// `pinset-policy-test.1`, …), e.g. `pinset man ~/.local/share/man/man1`, then `man
    /// pinset-plan`.
    Man {
        /// Where to write the pages (created when missing).
        #[arg(value_name = "DIR")]
        dir: std::path::PathBuf,
    },
}

fn main() -> ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Args::command().get_matches();
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    pinset_registry::http::identify(&command_path(&matches));
    cli::logging::init(&args.log, args.log_format);
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", cli::error_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The command line's subcommands, outermost first (`set from-release`).
fn command_path(matches: &clap::ArgMatches) -> String {
    let mut names = Vec::new();
    let mut at = matches;
    while let Some((name, inner)) = at.subcommand() {
        names.push(name);
        at = inner;
    }
    names.join(" ")
}

/// The runtime of the commands that wait on the network or a runtime.
fn rt() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

/// `pinset reference [PAGE]`: a reference page generated from the code.
fn reference(page: cli::reference::Page) -> ExitCode {
    use clap::CommandFactory;
    use cli::reference::Page;
    print!(
        "{}",
        match page {
            Page::Cli => cli::reference::markdown(Args::command()),
            Page::Crds => cli::reference::crds_markdown(),
            Page::Metrics => cli::reference::metrics_markdown(),
            Page::Events => cli::reference::events_markdown(),
        }
    );
    ExitCode::SUCCESS
}

/// `pinset demo`: its timelines in `timeline_dir`, or the default directory.
fn demo(policy: &PolicyOpts, timeline_dir: Option<std::path::PathBuf>) -> Result<ExitCode> {
    let dir = timeline_dir.unwrap_or_else(cli::demo::default_timeline_dir);
    rt()?.block_on(cli::demo::demo(policy, &dir))
}

/// `pinset man DIR`.
fn man(dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    use anyhow::Context as _;
    use clap::CommandFactory;
    let written = cli::reference::man_pages(Args::command(), dir)
        .with_context(|| format!("writing man pages into {}", dir.display()))?;
    eprintln!("{} man pages in {}", written.len(), dir.display());
    Ok(ExitCode::SUCCESS)
}

/// `pinset completion SHELL`.
fn completion(shell: clap_complete::Shell) -> ExitCode {
    use clap::CommandFactory;
    let mut command = Args::command();
    clap_complete::generate(shell, &mut command, "pinset", &mut std::io::stdout());
    ExitCode::SUCCESS
}

fn run(args: Args) -> Result<ExitCode> {
    cli::sources::init(&args.registries)?;
    match args.command {
        Command::Policy(cmd) => cli::policy::run(cmd),
        Command::Demo {
            policy,
            timeline_dir,
        } => demo(&policy, timeline_dir),
        Command::Node {
            inputs,
            runtime,
            policy,
            watch,
            compile,
            timeline,
        } => rt()?.block_on(cli::node::node_cmd(
            &inputs,
            &runtime,
            &policy,
            watch.then_some(&compile),
            timeline.as_deref(),
        )),
        Command::Plan {
            inputs,
            cri,
            max_pulls,
            output,
            sizing,
            simulation,
            policy,
        } => rt()?.block_on(cli::plan::plan_cmd(
            &inputs,
            cri,
            max_pulls,
            &sizing,
            &simulation,
            &policy,
            output,
        )),
        Command::Bench(cmd) => rt()?.block_on(cli::bench::run(cmd)),
        Command::Rollout(cmd) => rt()?.block_on(cli::rollout::run(cmd)),
        Command::Set(cmd) => rt()?.block_on(cli::set::run(cmd)),
        Command::Crds => Ok(cli::kube::crds()),
        Command::CompilePolicy { memory_bytes } => cli::policy::compile_child(memory_bytes),
        Command::Reference { page } => Ok(reference(page)),
        Command::Completion { shell } => Ok(completion(shell)),
        Command::Man { dir } => man(&dir),
        Command::Controller {
            cluster,
            controller,
        } => rt()?.block_on(cli::kube::controller(&cluster, &controller)),
        Command::Agent {
            cluster,
            agent,
            runtime,
            policy,
        } => rt()?.block_on(cli::kube::agent(&cluster, &agent, &runtime, &policy)),
    }
}

#[cfg(test)]
mod tests {
    /// clap's own checks of the whole command line (no two arguments of a command share a name
    /// or a short flag, every `requires` and `conflicts_with` names an argument): a release
    /// build would not assert them, and a flattened group added to a command could collide.
    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        super::Args::command().debug_assert();
    }
}
