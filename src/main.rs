//! The `sluice` binary: parses the command line and hands over to the library.

use std::io::IsTerminal;
use std::process::ExitCode;

/// mimalloc's per-thread free lists suit many short-lived request allocations across
/// Tokio's worker threads better than glibc malloc's arenas, whose locks showed up
/// under load (docs/performance-notes.md, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use sluice::config::{Cli, Command, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Validate { paths } => validate(&paths),
        Command::Crd => {
            print!("{}", sluice::crd::crd_yaml());
            ExitCode::SUCCESS
        }
        Command::Serve(cfg) => {
            init_logging(cfg.log_format);
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            if cfg.worker_threads > 0 {
                builder.worker_threads(cfg.worker_threads);
            }
            let runtime = match builder.enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("sluice: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            // The signal handlers are installed first thing in the runtime.
            let serve =
                async { sluice::server::run(*cfg, sluice::server::shutdown_signal()).await };
            match runtime.block_on(serve) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("sluice: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn validate(paths: &[std::path::PathBuf]) -> ExitCode {
    match sluice::policy::load_paths(paths) {
        Ok((policy, _docs)) => {
            println!(
                "ok: {} domain(s), {} rule(s)",
                policy.domains.len(),
                policy.rules.len()
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in errors {
                eprintln!("{e}");
            }
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal: escapes in a file, a pipe or a log
    // collector are noise. NO_COLOR (no-color.org) turns it off there too.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
