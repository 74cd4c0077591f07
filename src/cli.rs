//! The command line: argument definitions, a command's failure and its exit
//! code, and printing the outcome. The admin commands, which act on the store
//! named by `--config`, are in `actions`. JSON goes to stdout, human messages
//! to stderr; exit 0 ok, 1 runtime failure, 2 bad input.
use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use serde_json::Value;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

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
    /// Whether `config` was named (by `--config` or `$MPG_GATEWAY_CONFIG`)
    /// rather than the default: the demo uses a named file only.
    #[arg(skip)]
    pub config_named: bool,
    /// What to do (default: run).
    #[command(subcommand)]
    pub command: Option<Command>,
}

impl Cli {
    /// Parses the command line (exiting with clap's message on bad usage),
    /// noting whether the configuration file was named.
    pub fn parse_args() -> Cli {
        let matches = Cli::command().get_matches();
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        cli.config_named = matches!(
            matches.value_source("config"),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        cli
    }
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
    /// The audit trail of the key lifecycle.
    #[command(subcommand)]
    Audit(AuditCmd),
    /// Bearer tokens for the admin API (`/admin/v1` on the admin listener).
    #[command(subcommand, name = "admin-tokens")]
    AdminTokens(AdminTokensCmd),
}

/// `demo` options. A configuration file named by `--config` (or
/// `$MPG_GATEWAY_CONFIG`) replaces the shipped route table, roles and
/// policies; the demo still brings its own store, certificate and clusters
/// service.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Where the demo gateway listens.
    #[arg(long, default_value = "127.0.0.1:8443")]
    pub listen: std::net::SocketAddr,
    /// How long a created or updated demo cluster stays busy (changing it
    /// meanwhile is a 409); at most 1h.
    #[arg(long, default_value = "10s", value_parser = busy_for)]
    pub busy_for: Duration,
}

/// `--busy-for`: a duration of at most an hour.
fn busy_for(text: &str) -> Result<Duration, String> {
    let d = crate::config::parse_duration(text)?;
    if d > Duration::from_secs(3600) {
        return Err("must be at most 1h".into());
    }
    Ok(d)
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
    /// List every organization.
    List,
    /// Delete an organization, its API keys and its memberships.
    ///
    /// In one transaction: every API key of the organization is deleted
    /// (whoever created it), every membership in it is removed, then the
    /// organization itself. Its users stay, and so do their sessions, which
    /// keep working for the other organizations they belong to. Running
    /// gateways drop the deleted keys and the removed roles from their caches
    /// within a second. Prints the ids of what was removed; an unknown id
    /// exits 2.
    Delete {
        /// Organization id.
        id: String,
    },
    /// Give the organization its own quota for one policy: its requests get
    /// `--requests` per `--per` instead of the policy's (replacing an earlier
    /// override). Running gateways apply it within `cache_ttl`.
    SetLimit {
        /// Organization id.
        #[arg(long)]
        org: String,
        /// A policy name from [rate_limit.policies].
        #[arg(long)]
        policy: String,
        /// Bucket capacity (X-RateLimit-Limit), at least 1.
        #[arg(long)]
        requests: u64,
        /// Time to refill the whole bucket, e.g. 1m.
        #[arg(long)]
        per: String,
    },
    /// Remove the organization's own quota for a policy (back to the policy's).
    UnsetLimit {
        /// Organization id.
        #[arg(long)]
        org: String,
        /// A policy name from [rate_limit.policies].
        #[arg(long)]
        policy: String,
    },
    /// List the organization's own quotas, one per policy it overrides.
    Limits {
        /// Organization id.
        #[arg(long)]
        org: String,
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
    /// List every user.
    List,
    /// Delete a user, their sessions, API keys and memberships.
    ///
    /// In one transaction: every session of the user ends, every API key the
    /// user owns is deleted (in every organization), every membership is
    /// removed, then the user itself. Running gateways refuse the sessions
    /// and keys within a second. Prints the ids of what was removed; an
    /// unknown id exits 2.
    Delete {
        /// User id.
        id: String,
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
    /// List an organization's members and their roles.
    List {
        /// Organization id.
        #[arg(long)]
        org: String,
    },
    /// Remove a user from an organization.
    ///
    /// The user's sessions lose the role in this organization and the keys
    /// they own in it grant nothing (403 on every route that needs a scope)
    /// on running gateways within a second. The keys are kept, and work again
    /// if the user is added back: revoke them with `keys revoke` to end them
    /// for good. A user who is not a member exits 2.
    Remove {
        /// Organization id.
        #[arg(long)]
        org: String,
        /// User id.
        #[arg(long)]
        user: String,
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
    /// List a user's sessions (ids and times, never the token).
    List {
        /// User id.
        #[arg(long)]
        user: String,
    },
    /// End a session: running gateways refuse its token within a second.
    Revoke {
        /// Session id (`ses_…`).
        id: String,
    },
}

/// `admin-tokens …`
#[derive(Debug, Subcommand)]
pub enum AdminTokensCmd {
    /// Make a token; prints it once (only its SHA-256 is stored).
    Create {
        /// What the token is for (1-100 characters).
        #[arg(long)]
        name: String,
    },
    /// List the tokens (ids, names and times, never a token).
    List,
    /// Revoke a token: the admin API refuses it at once, on every instance.
    Revoke {
        /// Token id (`adm_…`).
        id: String,
    },
}

/// `audit …`
#[derive(Debug, Subcommand)]
pub enum AuditCmd {
    /// List an organization's key lifecycle events, newest first.
    List {
        /// Organization id.
        #[arg(long)]
        org: String,
        /// At most this many events, 1 to 1000 (default: all).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: Option<u32>,
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
        /// The key's own limit, REQUESTS/DURATION such as 100/1m, used
        /// instead of the quota of policies keyed by credential.
        #[arg(long)]
        rate_limit: Option<String>,
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
    /// Rotate a key: a new key (secret printed once, in field `key`) with the
    /// same name, scopes, expiry and rate limit; the old key keeps working for the grace
    /// period, then is expired. A revoked, expired or already rotated key
    /// exits 2.
    Rotate {
        /// Key id.
        id: String,
        /// How long the old key keeps working, e.g. 1h; at most 7d
        /// (default: it stops at once).
        #[arg(long)]
        grace: Option<String>,
    },
    /// Change a key's name, controls or own limit: each flag given sets that
    /// field, the others stay as they are, and `none` clears a field.
    /// Running gateways apply the change within a second; the audit trail
    /// records `api_key.updated` with the names of the fields set. An
    /// unknown or revoked key exits 2 and nothing changes.
    Update(KeyUpdateArgs),
    /// Delete a key.
    Delete {
        /// Key id.
        id: String,
    },
}

/// `keys update` flags; at least one besides the id.
#[derive(Debug, Args)]
pub struct KeyUpdateArgs {
    /// Key id.
    pub id: String,
    /// A new name, 1-100 characters.
    #[arg(long)]
    pub name: Option<String>,
    /// false: the key is refused (401, reason "disabled") until set true again.
    #[arg(long, value_name = "true|false")]
    pub enabled: Option<bool>,
    /// The networks the key works from: comma-separated CIDRs with no host
    /// bits set, or addresses, such as 203.0.113.0/24,2001:db8::/32;
    /// `none`: from anywhere.
    #[arg(long, value_name = "CIDR,...|none")]
    pub ip_allow: Option<String>,
    /// Metadata for upstreams: a JSON object of at most 4 KiB, such as
    /// '{"plan":"pro"}'; `null` or `none`: no metadata.
    #[arg(long, value_name = "JSON|none")]
    pub meta: Option<String>,
    /// Credits left from now on (at 0 the key is refused with 429 until its
    /// next refill); the refill stays as it is. `none`: unlimited, with no
    /// refill.
    // Hyphen values are taken, so that `-1` is refused as a count below 0
    // rather than as an unknown flag (also for `--refill -1/1d`).
    #[arg(long, value_name = "N|none", allow_hyphen_values = true)]
    pub credits: Option<String>,
    /// Set the credits to AMOUNT every INTERVAL (at least 1m), counted from
    /// the key's creation, such as 1000/1d; the credits left stay as they
    /// are (a key without credits starts with AMOUNT). `none`: no refill.
    #[arg(long, value_name = "AMOUNT/INTERVAL|none", allow_hyphen_values = true)]
    pub refill: Option<String>,
    /// The key's own limit, REQUESTS/DURATION such as 100/1m, used instead
    /// of the quota of policies keyed by credential; `none`: the policies'
    /// quotas again.
    #[arg(long, value_name = "N/D|none")]
    pub rate_limit: Option<String>,
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
                Failure::runtime(e.explain())
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

/// Loads the config for an admin command: as [`load_settings`], except that
/// the server's TLS files need not exist (admin commands act on the store only).
pub fn load_store_settings(path: &std::path::Path) -> Result<Settings, Failure> {
    Settings::load_without_tls_files(path).map_err(|e| Failure::input(e.to_string()))
}
