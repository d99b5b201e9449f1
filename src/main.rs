//! The `mcp-tasks` binary: a thin command line over the library.

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use mcp_tasks::transport::{http, stdio};
use mcp_tasks::{Owner, Runtime, RuntimeBuilder, demo, fixtures};

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
    /// Serve MCP (`2026-07-28`, Tasks extension) on Streamable HTTP, or on stdio.
    Serve(ServeArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// The address to serve Streamable HTTP on (the endpoint is `/mcp`).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: String,
    /// The redb file that holds the tasks (created if missing).
    #[arg(long, value_name = "PATH", default_value = "mcp-tasks.redb")]
    store: PathBuf,
    /// An `Origin` accepted besides the loopback ones (repeatable).
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    allowed_origins: Vec<String>,
    /// A `Host` name accepted besides the loopback ones, e.g. when listening on a public
    /// address behind a proxy (repeatable; `*` accepts any).
    #[arg(long = "allowed-host", value_name = "HOST")]
    allowed_hosts: Vec<String>,
    /// Serve a fixture set instead of the demo's `generate_report` tool.
    #[arg(long, value_enum, value_name = "SET")]
    fixtures: Option<Fixtures>,
    /// Answer `-32020` when a `tasks/*` request lacks its `Mcp-Name` header.
    #[arg(long)]
    strict_headers: bool,
    /// Where `--fixtures crash` appends its step side effects (docs/CRASH-TESTING.md).
    #[arg(long, value_name = "PATH", hide = true)]
    side_effects: Option<PathBuf>,
    /// Serve newline-delimited JSON-RPC on stdin/stdout instead of HTTP (logs on stderr).
    #[arg(long, conflicts_with_all = ["listen", "allowed_origins", "allowed_hosts", "strict_headers"])]
    stdio: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum Fixtures {
    /// The tools, prompt and resources the MCP conformance suite calls.
    Conformance,
    /// The tools the load benchmarks drive.
    Bench,
    /// The crash-simulation workload (`sim_job`), for the kill/restart suite.
    #[value(hide = true)]
    Crash,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_filter = match cli.command {
        Command::Demo { .. } => "warn",
        Command::Serve(_) => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = rt.block_on(async {
        match cli.command {
            Command::Demo { verbose, store } => run_demo(verbose, store).await,
            Command::Serve(args) if args.stdio => serve_stdio(args).await,
            Command::Serve(args) => serve_http(args).await,
        }
    });
    // Everything is stopped and flushed; a read of stdin may still block a worker thread.
    rt.shutdown_background();
    code
}

async fn run_demo(verbose: bool, store: Option<PathBuf>) -> ExitCode {
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: cannot create a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let path = store.unwrap_or_else(|| dir.path().join("demo.redb"));
    let mut out = std::io::stdout().lock();
    match demo::run(&path, verbose, &mut out).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The runtime builder for `serve`: the demo's tool, or a fixture set.
fn builder(args: &ServeArgs) -> RuntimeBuilder {
    let builder = Runtime::builder(&args.store);
    match args.fixtures {
        None => builder.tool(demo::generate_report(Duration::from_millis(1500))),
        Some(Fixtures::Conformance) => fixtures::conformance::install(builder),
        Some(Fixtures::Bench) => fixtures::bench::install(builder),
        Some(Fixtures::Crash) => mcp_tasks::sim::install(
            builder,
            args.side_effects
                .clone()
                .unwrap_or_else(|| PathBuf::from("mcp-tasks-side-effects.log")),
        ),
    }
}

async fn start(args: &ServeArgs) -> Option<Runtime> {
    match builder(args).start().await {
        Ok(runtime) => Some(runtime),
        Err(e) => {
            eprintln!("error: {e}");
            None
        }
    }
}

async fn serve_http(args: ServeArgs) -> ExitCode {
    let listener = match tokio::net::TcpListener::bind(args.listen.as_str()).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("error: cannot listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = match listener.local_addr() {
        Ok(addr) => addr.to_string(),
        Err(_) => args.listen.clone(),
    };
    let Some(runtime) = start(&args).await else {
        return ExitCode::FAILURE;
    };
    let mut config = http::HttpConfig::default();
    config.allowed_origins = args.allowed_origins;
    config.allowed_hosts = args.allowed_hosts;
    config.strict_headers = args.strict_headers;
    let router = http::router(runtime.handle(), config);
    tracing::info!("listening on http://{addr}/mcp");

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = http::serve(listener, router, async move {
        let _ = stop_rx.await;
    });
    let served = until_signal(&runtime, serving, stop_tx).await;
    runtime.shutdown().await;
    match served {
        Some(Ok(())) | None => ExitCode::SUCCESS,
        Some(Err(e)) => {
            eprintln!("error: serving HTTP on {addr} failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve_stdio(args: ServeArgs) -> ExitCode {
    let Some(runtime) = start(&args).await else {
        return ExitCode::FAILURE;
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = stdio::serve_with_shutdown(
        runtime.handle(),
        Owner::anonymous(),
        tokio::io::stdin(),
        tokio::io::stdout(),
        async move {
            let _ = stop_rx.await;
        },
    );
    let served = until_signal(&runtime, serving, stop_tx).await;
    runtime.begin_shutdown();
    runtime.shutdown().await;
    match served {
        Some(Ok(())) | None => ExitCode::SUCCESS,
        Some(Err(e)) => {
            eprintln!("error: serving stdio failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Waits for a server to finish; a second signal stops waiting (`None`).
/// Serves until the transport ends or a signal arrives; on a signal, ends listen streams,
/// tells the transport to stop and waits for it (a second signal stops waiting).
async fn until_signal<T>(
    runtime: &Runtime,
    serving: impl Future<Output = T>,
    stop: tokio::sync::oneshot::Sender<()>,
) -> Option<T> {
    let mut serving = std::pin::pin!(serving);
    tokio::select! {
        served = &mut serving => Some(served),
        () = shutdown_signal() => {
            tracing::info!("shutting down: finishing the requests in flight");
            runtime.begin_shutdown();
            let _ = stop.send(());
            finish(serving).await
        }
    }
}

async fn finish<T>(serving: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        done = serving => Some(done),
        () = shutdown_signal() => {
            tracing::warn!("second signal: not waiting for the requests in flight");
            None
        }
    }
}

/// Ctrl-C, or SIGTERM on Unix.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    () = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
}
