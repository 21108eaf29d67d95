use anyhow::Result;
use clap::{Parser, Subcommand};
use pinset::cli::{self, policy::PolicyCommand};
use std::process::ExitCode;

/// Pre-pull and pin container images on Kubernetes nodes; every decision is taken by a
/// sandboxed WebAssembly policy.
#[derive(Parser)]
#[command(name = "pinset", version)]
struct Args {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `pinset=debug`.
    #[arg(long, global = true, env = "PINSET_LOG", default_value = "info")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Test, benchmark and inspect pull policies offline.
    #[command(subcommand)]
    Policy(PolicyCommand),
}

fn main() -> ExitCode {
    let args = Args::parse();
    cli::init_logging(&args.log);
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<ExitCode> {
    match args.command {
        Command::Policy(cmd) => cli::policy::run(cmd),
    }
}
