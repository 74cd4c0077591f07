//! The command line: argument definitions, a command's failure and its exit
//! code, and printing the outcome. The admin commands, which act on the store
//! named by `--config`, are in `actions`. JSON goes to stdout, human messages
//! to stderr; exit 0 ok, 1 runtime failure, 2 bad input.
use clap::{Args, Parser, Subcommand};
use serde_json::Value;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::Settings;
use crate::store::StoreError;

mod actions;

pub use actions::{admin, rfc3339};

/// mpg-gateway: an authenticating, rate-limiting API gateway.
#[derive(Debug, Parser)]
#[command(name = "mpg-gateway", version, about)]
pub struct Cli {
    /// The configuration file.
    #[arg(
        long,
        global = true,
        env = "MPG_GATEWAY_CONFIG",
        default_value = "config/gateway.toml"
    )]
    pub config: PathBuf,
    /// What to do (default: run).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway.
    Run,
    /// Validate the configuration file; print every problem and exit 2 if any.
    CheckConfig,
    /// Run the one-command demo (embedded store, self-signed TLS on 127.0.0.1:8443).
    Demo(DemoArgs),
    /// Create or upgrade the store schema.
    Migrate,
    /// Organizations.
    #[command(subcommand)]
    Orgs(OrgsCmd),
    /// Users.
    #[command(subcommand)]
    Users(UsersCmd),
    /// Memberships (a user's role in an organization).
    #[command(subcommand)]
    Members(MembersCmd),
    /// Session tokens.
    #[command(subcommand)]
    Sessions(SessionsCmd),
    /// API keys.
    #[command(subcommand)]
    Keys(KeysCmd),
}

/// `demo` options.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Where the demo gateway listens.
    #[arg(long, default_value = "127.0.0.1:8443")]
    pub listen: std::net::SocketAddr,
}

/// `orgs …`
#[derive(Debug, Subcommand)]
pub enum OrgsCmd {
    /// Create an organization.
    Create {
        /// Its id.
        #[arg(long)]
        id: String,
        /// Display name.
        #[arg(long)]
        name: Option<String>,
    },
}

/// `users …`
#[derive(Debug, Subcommand)]
pub enum UsersCmd {
    /// Create a user.
    Create {
        /// Its id.
        #[arg(long)]
        id: String,
        /// E-mail address.
        #[arg(long)]
        email: Option<String>,
    },
}

/// `members …`
#[derive(Debug, Subcommand)]
pub enum MembersCmd {
    /// Set (insert or replace) a user's role in an organization.
    Add {
        /// Organization id.
        #[arg(long)]
        org: String,
        /// User id.
        #[arg(long)]
        user: String,
        /// A role from [roles].
        #[arg(long)]
        role: String,
    },
}

/// `sessions …`
#[derive(Debug, Subcommand)]
pub enum SessionsCmd {
    /// Create a session token for a user.
    Create {
        /// User id.
        #[arg(long)]
        user: String,
        /// Lifetime, e.g. 12h.
        #[arg(long, default_value = "12h")]
        ttl: String,
    },
}

/// `keys …`
#[derive(Debug, Subcommand)]
pub enum KeysCmd {
    /// Create an API key; its secret is printed once, in field `key`.
    Create {
        /// Organization id.
        #[arg(long)]
        org: String,
        /// User id (a member of the organization).
        #[arg(long)]
        user: String,
        /// Key name.
        #[arg(long)]
        name: String,
        /// Comma-separated scopes.
        #[arg(long, value_delimiter = ',')]
        scopes: Vec<String>,
        /// Lifetime, e.g. 30d (default: no expiry).
        #[arg(long)]
        expires_in: Option<String>,
    },
    /// List an organization's keys.
    List {
        /// Organization id.
        #[arg(long)]
        org: String,
    },
    /// Show one key.
    Get {
        /// Key id.
        id: String,
    },
    /// Revoke a key.
    Revoke {
        /// Key id.
        id: String,
    },
    /// Delete a key.
    Delete {
        /// Key id.
        id: String,
    },
}

/// A command's failure: exit code and message.
#[derive(Debug)]
pub struct Failure {
    /// 1 runtime, 2 bad input.
    pub code: u8,
    /// For stderr.
    pub message: String,
}

impl Failure {
    /// Bad usage or input (exit 2).
    pub fn input(message: impl Into<String>) -> Self {
        Failure {
            code: 2,
            message: message.into(),
        }
    }

    /// Runtime failure (exit 1).
    pub fn runtime(message: impl Into<String>) -> Self {
        Failure {
            code: 1,
            message: message.into(),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(_) | StoreError::Conflict(_) | StoreError::Invalid(_) => {
                Failure::input(e.to_string())
            }
            // With its causes, which tell a refused connection from an
            // untrusted certificate or a failed login.
            StoreError::Unreachable(_) | StoreError::Unavailable(_) | StoreError::Timeout => {
                Failure::runtime(crate::logging::Chain(&e).to_string())
            }
        }
    }
}

/// Prints the outcome and turns it into the process exit code.
pub fn finish(result: Result<Value, Failure>) -> ExitCode {
    match result {
        Ok(v) => {
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(f) => {
            eprintln!("mpg-gateway: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// Loads the config for a command, every problem in the message.
pub fn load_settings(path: &std::path::Path) -> Result<Settings, Failure> {
    Settings::load(path).map_err(|e| Failure::input(e.to_string()))
}
