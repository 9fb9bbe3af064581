//! `concord`: the Concord server.

use std::process::ExitCode;

use concord_http::Settings;

/// The `concord` command line: `serve` takes every setting as a flag (see `settings.rs`).
fn command() -> clap::Command {
    // The about is set after the settings' arguments: those would replace it.
    let serve = Settings::command(clap::Command::new("serve")).about(
        "Serve the HTTP API (with no settings: the WAL log and redb state under ./data, the \
         session plugin, http://127.0.0.1:7070)",
    );
    clap::Command::new("concord")
        .version(env!("CARGO_PKG_VERSION"))
        .about("Concord: a replicated storage engine serving MQTT-style sessions over HTTP")
        .after_help(
            "Settings are layered: built-in defaults < the TOML file of --config < CONCORD_* \
             environment variables < flags. The file's keys are the flags' names with '_' for \
             '-'; unknown keys are errors.",
        )
        .subcommand_required(true)
        .subcommand(serve)
        .subcommand(concord_http::member_command::command())
        .subcommand(concord_http::group_command::command())
        .subcommand(concord_http::plugin_command::command())
        .subcommand(concord_http::backup_command::backup_command())
        .subcommand(concord_http::backup_command::restore_command())
}

fn main() -> ExitCode {
    let matches = command().get_matches();
    let serve = match matches.subcommand() {
        Some(("serve", serve)) => serve,
        Some(("plugin", plugin)) => return report(concord_http::plugin_command::run(plugin)),
        Some(("member", member)) => return report(concord_http::member_command::run(member)),
        Some(("group", group)) => return report(concord_http::group_command::run(group)),
        Some(("backup", backup)) => {
            return report(concord_http::backup_command::run_backup(backup));
        }
        Some(("restore", restore)) => {
            return report(concord_http::backup_command::run_restore(restore));
        }
        _ => unreachable!("clap requires a subcommand"),
    };
    let result = Settings::from_layers(serve)
        .map_err(|error| error.to_string())
        .and_then(|settings| {
            init_logging(&settings.log_level);
            concord_http::log_panics();
            concord_http::serve(settings).map_err(|error| error.to_string())
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("concord: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Prints what a one-shot subcommand says, or its error.
fn report(outcome: Result<String, String>) -> ExitCode {
    match outcome {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("concord: {error}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(level: &str) {
    let level = level.parse().unwrap_or(tracing::Level::INFO);
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

/// jemalloc rather than the system allocator: the server allocates a little per request on
/// several threads at once, where glibc's arenas and consolidation cost more CPU per request
/// (docs/BENCHMARKS.md compares glibc, mimalloc and jemalloc under the same load).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
