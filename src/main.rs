//! The `sluice` binary: parses the command line and hands over to the library.

use std::io::IsTerminal;
use std::process::ExitCode;

use sluice::telemetry::printable::printable;

/// mimalloc's per-thread free lists suit many short-lived request allocations across
/// Tokio's worker threads better than glibc malloc's arenas, whose locks showed up
/// under load (docs/performance-notes.md, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::ffi::OsString;

use clap::Parser;
use sluice::config::{Cli, Command, EnvCompat, LogFormat, Serve};

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    // Envoy Gateway's Deployment runs `/bin/ratelimit` with no arguments: as that
    // name, serve with envoyproxy/ratelimit's environment.
    let as_ratelimit = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n == "ratelimit");
    if as_ratelimit {
        let rest = args.split_off(1);
        args.extend(["serve", "--env-compat", "erl"].map(OsString::from));
        args.extend(rest);
    }
    let cli = Cli::parse_from(&args);
    match cli.command {
        Command::Validate {
            paths,
            config_dir_files,
        } => validate(&paths, config_dir_files),
        Command::Explain(args) => explain(&args),
        Command::Top(args) => top(&args),
        Command::Crd => print_out(&sluice::crd::crd_yaml()),
        Command::Serve(cfg) => {
            let (cfg, compat) = match compat(*cfg, &args) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("sluice: {e}");
                    return ExitCode::FAILURE;
                }
            };
            init_logging(cfg.log_format, compat.log_level.as_deref());
            if cfg.env_compat.is_some() {
                tracing::info!(
                    "reading envoyproxy/ratelimit's environment: {}",
                    compat.shown_args()
                );
            }
            for warning in &compat.warnings {
                tracing::warn!("{warning}");
            }
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            if cfg.connections.worker_threads > 0 {
                builder.worker_threads(cfg.connections.worker_threads);
            }
            let runtime = match builder.enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("sluice: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            // The signal handlers are installed first thing in the runtime.
            let serve = async { sluice::server::run(cfg, sluice::server::shutdown_signal()).await };
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

/// Writes a command's output. A reader that stops early (`sluice crd | head`) is
/// not an error: print! would panic on the closed pipe.
fn print_out(text: &str) -> ExitCode {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: cannot write the output: {e}");
            ExitCode::FAILURE
        }
    }
}

fn validate(paths: &[std::path::PathBuf], dir_files: sluice::policy::DirFiles) -> ExitCode {
    use sluice::policy::Snapshot;
    let snapshot = Snapshot::read(paths, dir_files);
    for note in snapshot.notes() {
        eprintln!("warning: {note}");
    }
    match snapshot.load() {
        // A directory that holds no policy is most likely the wrong one.
        Ok(_) if snapshot.has_no_file() => {
            eprintln!("no policy file to validate");
            ExitCode::FAILURE
        }
        Ok((policy, _docs)) => print_out(&format!(
            "ok: {} domain(s), {} rule(s)\n",
            policy.domains.len(),
            policy.rule_count()
        )),
        Err(errors) => {
            // A policy's keys and names may hold a terminal's control sequences.
            for e in errors {
                eprintln!("{}", printable(&e.to_string()));
            }
            ExitCode::FAILURE
        }
    }
}

/// A runtime for a client subcommand.
fn client_runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            None
        }
    }
}

fn top(args: &sluice::cli::top::TopArgs) -> ExitCode {
    let Some(runtime) = client_runtime() else {
        return ExitCode::FAILURE;
    };
    let shown = runtime.block_on(sluice::cli::top::run(args));
    // The view is gone: leave at once rather than wait for the feed's tasks.
    runtime.shutdown_background();
    match shown {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice top: {e}");
            ExitCode::FAILURE
        }
    }
}

fn explain(args: &sluice::cli::explain::ExplainArgs) -> ExitCode {
    let Some(runtime) = client_runtime() else {
        return ExitCode::FAILURE;
    };
    let (e, notes) = match runtime.block_on(sluice::cli::explain::run(args)) {
        Ok(explained) => explained,
        Err(e) => {
            eprintln!("sluice explain: {e}");
            return ExitCode::FAILURE;
        }
    };
    for note in notes {
        eprintln!("warning: {note}");
    }
    if args.json {
        print_out(&format!("{:#}\n", sluice::cli::explain::to_json(&e)))
    } else {
        print_out(&sluice::cli::explain::text(&e))
    }
}

/// With `--env-compat erl`, the settings again with envoyproxy/ratelimit's variables
/// as flags placed before the command line's own (which therefore win); without it,
/// a warning when some of those variables are set.
fn compat(
    cfg: Serve,
    args: &[OsString],
) -> Result<(Serve, sluice::compat::Translation), sluice::compat::Refusal> {
    let env = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    if cfg.env_compat != Some(EnvCompat::Erl) {
        let warnings = sluice::compat::unread(&env).into_iter().collect();
        return Ok((
            cfg,
            sluice::compat::Translation {
                warnings,
                ..Default::default()
            },
        ));
    }
    let translation = sluice::compat::translate(&env)?;
    let serve = args.iter().position(|a| a == "serve").unwrap_or(1);
    let mut again: Vec<OsString> = args[..=serve].to_vec();
    again.extend(translation.args.iter().map(OsString::from));
    again.extend(args[serve + 1..].iter().cloned());
    let Command::Serve(cfg) = Cli::parse_from(again).command else {
        unreachable!("the same subcommand")
    };
    Ok((*cfg, translation))
}

fn init_logging(format: LogFormat, level: Option<&str>) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level.unwrap_or("info")));
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
