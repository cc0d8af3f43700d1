//! The `herald` command line. Argument handling only; everything else is in the library.

use std::path::PathBuf;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand};

use herald::config::{Config, Overrides};

#[derive(Parser)]
#[command(name = "herald", version, about = "Sends messages at the right time.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the engine and its HTTP API.
    Serve {
        /// TOML config file (see README); without it herald runs on its embedded defaults.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Address to listen on, e.g. 127.0.0.1:7700 (overrides the config file).
        #[arg(long)]
        listen: Option<String>,
        /// Data directory (overrides the config file).
        #[arg(long)]
        data: Option<PathBuf>,
    },
    #[command(flatten)]
    Client(herald::cli::Command),
    /// Print a shell completion script: `herald completions bash > /etc/bash_completion.d/herald`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

fn main() {
    // One line, no backtrace: a config mistake is a message for the operator, not a crash.
    if let Err(e) = run() {
        eprintln!("herald: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Client(cmd) => return Ok(herald::cli::run(cmd)?),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "herald", &mut std::io::stdout());
            return Ok(());
        }
        Command::Serve { .. } => {}
    }
    let filter = tracing_subscriber::EnvFilter::try_from_env("HERALD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Command::Serve {
            config,
            listen,
            data,
        } => {
            let overrides = Overrides {
                listen,
                data_dir: data,
                token: std::env::var("HERALD_TOKEN").ok(),
            };
            let config = Config::load(config.as_deref(), overrides)?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the tokio runtime")?;
            rt.block_on(async {
                let server = herald::server::start(config).await?;
                // Tests and scripts read this line to find the port when listening on :0.
                println!("herald listening on {}", server.url());
                shutdown_signal().await?;
                tracing::info!("shutting down");
                drop(server);
                anyhow::Ok(())
            })
        }
        Command::Client(_) | Command::Completions { .. } => Ok(()),
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for ctrl-c")?,
        _ = term.recv() => {}
    }
    Ok(())
}
