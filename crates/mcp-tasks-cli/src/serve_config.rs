//! `serve --config FILE`: serve options from a TOML file, below the environment and the
//! command line.
//!
//! The file's keys are the long option names of `serve` (`listen`, `task-ttl`,
//! `allowed-origin`, ...), its values those the options take (`"15m"`, `"64MiB"`, `1024`,
//! `true`, a list for a repeatable option). A value is used only where neither the command
//! line nor the option's environment variable gave one: the file's values are appended to the
//! command line as options and everything is parsed again, so that each value goes through the
//! option's own parser, conflicts and checks.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgAction, Parser};

/// The subcommand whose options a configuration file may set, and its option naming the file.
const SERVE: &str = "serve";
const CONFIG: &str = "config";

/// Parses `args` (the program name first) with the configuration file applied; a usage error
/// exits as clap does, a configuration error prints one line and exits 2.
pub(crate) fn parse<T: Parser>(args: Vec<OsString>) -> T {
    match try_parse(args) {
        Ok(parsed) => parsed,
        Err(Failure::Usage(e)) => e.exit(),
        Err(Failure::Config(message)) => {
            eprintln!("error: {message}");
            std::process::exit(2);
        }
    }
}

#[derive(Debug)]
pub(crate) enum Failure {
    /// The command line itself is wrong (clap's message, usage and exit code).
    Usage(clap::Error),
    /// The configuration file is missing, not TOML, or has a bad key or value.
    Config(String),
}

pub(crate) fn try_parse<T: Parser>(args: Vec<OsString>) -> Result<T, Failure> {
    let matches = T::command()
        .try_get_matches_from(&args)
        .map_err(Failure::Usage)?;
    let from = |matches: &clap::ArgMatches| T::from_arg_matches(matches).map_err(Failure::Usage);
    let Some((SERVE, serve)) = matches.subcommand() else {
        return from(&matches);
    };
    let Some(path) = serve.get_one::<PathBuf>(CONFIG) else {
        return from(&matches);
    };
    let extra = options_from_file(path, serve, &T::command())?;
    let mut args = args;
    args.extend(extra);
    T::try_parse_from(args)
        .map_err(|e| Failure::Config(format!("{}: {}", path.display(), line(&e))))
}

/// The first line of clap's message, without its `error: ` prefix.
fn line(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_owned()
}

/// The options (`--key=value`) the file at `path` adds to a command line whose `serve`
/// matches are `given`.
fn options_from_file(
    path: &Path,
    given: &clap::ArgMatches,
    command: &clap::Command,
) -> Result<Vec<OsString>, Failure> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::Config(format!("cannot read the configuration file {shown}: {e}")))?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        let why = e.message().to_owned();
        let at = e
            .span()
            .map(|span| {
                let line = text[..span.start].lines().count().max(1);
                format!(" (line {line})")
            })
            .unwrap_or_default();
        Failure::Config(format!("{shown} is not valid TOML{at}: {why}"))
    })?;
    let mut command = command.clone();
    command.build();
    let serve = command
        .find_subcommand(SERVE)
        .expect("the serve subcommand exists");
    let mut out = Vec::new();
    for (key, value) in &table {
        let arg = serve
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()) && a.get_id() != CONFIG)
            .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
            .ok_or_else(|| {
                Failure::Config(format!(
                    "{shown}: unknown key `{key}` (the keys are the long options of `mcp-tasks serve`, such as `listen`, `store` or `task-ttl`)"
                ))
            })?;
        if matches!(
            given.value_source(arg.get_id().as_str()),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        let bad = |what: &str| Failure::Config(format!("{shown}: `{key}` {what}"));
        match (arg.get_action(), value) {
            (ArgAction::SetTrue, toml::Value::Boolean(true)) => out.push(format!("--{key}").into()),
            (ArgAction::SetTrue, toml::Value::Boolean(false)) => {}
            (ArgAction::SetTrue, _) => return Err(bad("is a switch: true or false")),
            (ArgAction::Append, toml::Value::Array(items)) => {
                for item in items {
                    let item = scalar(item).ok_or_else(|| bad("takes a list of strings"))?;
                    out.push(format!("--{key}={item}").into());
                }
            }
            (_, toml::Value::Array(_)) => return Err(bad("takes one value, not a list")),
            (_, value) => {
                let value =
                    scalar(value).ok_or_else(|| bad("takes a string, a number or true/false"))?;
                out.push(format!("--{key}={value}").into());
            }
        }
    }
    Ok(out)
}

/// A TOML string, number or boolean as the command line would spell it.
fn scalar(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(n) => Some(n.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}
