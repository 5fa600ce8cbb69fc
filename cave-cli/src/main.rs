//! `cave`: run an LLM that operates a live Python runtime.

use cave_agent::models::ApiKey;
use cave_cli::{args::Cli, exit::Exit};
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let key = cave_cli::config::take_api_key();
    let exit = match Cli::try_parse() {
        Ok(cli) => {
            let secrets = cave_cli::config::take_secrets(&cli);
            cave_cli::app::run(cli, key.clone().map(ApiKey::new), key, secrets)
        }
        Err(e) => {
            let _ = e.print();
            if e.use_stderr() {
                Exit::Usage
            } else {
                Exit::Completed
            }
        }
    };
    exit.into()
}
