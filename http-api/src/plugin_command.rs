//! `concord plugin new <dir>` (a project of your own, see `plugin_template.rs`) and `concord
//! plugin upgrade <name> <module.wasm> --endpoint URL` (a served plugin switched to another
//! module through the log, by `PUT /v1/plugins/{name}` on any member; see `admin_client.rs`).

use std::path::PathBuf;

use clap::{Arg, ArgMatches, Command};

use crate::admin_client::{Body, Endpoint, endpoint_args};
use crate::plugin_template::{plugin_name, write_project};
use crate::routes_plugins::UpgradeJson;

/// The `plugin` subcommand.
pub fn command() -> Command {
    Command::new("plugin")
        .about("Start a state-machine plugin of your own, or upgrade a served one")
        .subcommand_required(true)
        .subcommand(
            Command::new("new")
                .about(
                    "Write a plugin project into a new directory: the plugin (a key-value \
                     example), the guest SDK beside it, the build settings and a README",
                )
                .arg(
                    Arg::new("dir")
                        .required(true)
                        .value_parser(clap::value_parser!(PathBuf))
                        .help("The directory to create; its name is the plugin's"),
                ),
        )
        .subcommand(
            Command::new("upgrade")
                .about(
                    "Switch a served plugin to another module through the log, on every \
                     member at the same entry (needs the admin token if the node has one)",
                )
                .args(endpoint_args())
                .arg(
                    Arg::new("name")
                        .required(true)
                        .help("The name the plugin is served under"),
                )
                .arg(
                    Arg::new("module")
                        .required(true)
                        .value_parser(clap::value_parser!(PathBuf))
                        .help("The new module (.wasm)"),
                ),
        )
}

/// Runs `concord plugin ...`; returns what to print.
pub fn run(matches: &ArgMatches) -> Result<String, String> {
    match matches.subcommand() {
        Some(("new", new)) => {
            let dir = new.get_one::<PathBuf>("dir").expect("required");
            let name = plugin_name(dir)?;
            write_project(dir, &name)?;
            Ok(format!(
                "wrote the plugin {name} into {}; next: cd {} && cat README.md\n",
                dir.display(),
                dir.display()
            ))
        }
        Some(("upgrade", upgrade)) => {
            let name = upgrade.get_one::<String>("name").expect("required");
            let path = upgrade.get_one::<PathBuf>("module").expect("required");
            let module = std::fs::read(path)
                .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
            let endpoint = Endpoint::from_matches(upgrade)?;
            let route = format!("/v1/plugins/{name}");
            let body = Body {
                content_type: "application/wasm",
                bytes: &module,
            };
            let answer = endpoint.call_ok("PUT", &route, Some(body))?;
            let upgraded: UpgradeJson = serde_json::from_str(&answer).map_err(|error| {
                format!(
                    "{} answered what is not an upgrade: {error}",
                    endpoint.url()
                )
            })?;
            Ok(format!(
                "plugin {} runs {} in its {} groups\n",
                upgraded.name, upgraded.identity, upgraded.groups
            ))
        }
        _ => unreachable!("clap requires a subcommand"),
    }
}
