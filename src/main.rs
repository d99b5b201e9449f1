//! The `mcp-tasks` binary: a thin command line over the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "mcp-tasks", version, about = "Durable tasks for MCP servers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Play the lesson's sequence end to end (with a restart in the middle) on a fresh store.
    Demo {
        /// Print the JSON of every exchange.
        #[arg(long)]
        verbose: bool,
        /// Use this store file instead of a fresh one in a temporary directory.
        #[arg(long)]
        store: Option<PathBuf>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Demo { verbose, store } => {
            let dir = match tempfile::tempdir() {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("error: cannot create a temporary directory: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let path = store.unwrap_or_else(|| dir.path().join("demo.redb"));
            let mut out = std::io::stdout().lock();
            match mcp_tasks::demo::run(&path, verbose, &mut out).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
